"""The reflect node's reading of one evaluator result: what bounds the kernel and what to change next.

`diagnose(result) -> (text, facts)`: a few plain lines for the policy's next context and the database, and a small
dict the offline policy chooses its move from. Thresholds are rules of thumb for Hopper-class GPUs.
"""
from __future__ import annotations

from tools.result import EvalResult

LOW_OCCUPANCY = 0.5        # below half the warps an SM can hold, latency hiding suffers
MANY_REGISTERS = 128       # per thread; above this occupancy is capped at a quarter or less
MEMORY_SOL_GOAL = 0.8      # a memory-bound kernel below 80% of bandwidth still has room


def diagnose(result: EvalResult) -> tuple[str, dict]:
    verdict = result.verdict or "unknown"
    facts: dict = {"verdict": verdict, "executed_on": result.executed_on}
    lines: list[str] = []
    if verdict != "correct":
        lines.append(f"verdict {verdict}" + (f": {result.reasons[0]}" if result.reasons else ""))
        lines += [f"  {r}" for r in result.reasons[1:3]]

    roofline = result.roofline
    facts["bound"] = roofline.bound if roofline else None
    facts["sol_fraction"] = roofline.sol_fraction if roofline else None
    if facts["bound"]:
        sol = facts["sol_fraction"]
        lines.append(f"{facts['bound']}-bound" + (f", at {sol:.0%} of speed-of-light" if sol is not None else
                                                 " (no timing: speed-of-light fraction unknown)"))

    measured = [r for r in result.resources if r.registers is not None]  # the interpreter reports none
    if measured:
        main = max(measured, key=lambda r: r.registers)
        facts.update(registers=main.registers, spills=main.spills or 0, occupancy=main.occupancy,
                     num_warps=main.num_warps, shared_bytes=main.shared_bytes)
        lines.append(f"{main.kernel}: {main.registers} registers, {main.spills or 0} spilled, "
                     f"{main.shared_bytes or 0} B shared, occupancy {_pct(main.occupancy)}")
    facts["spilling"] = bool(facts.get("spills"))
    facts["low_occupancy"] = facts.get("occupancy") is not None and facts["occupancy"] < LOW_OCCUPANCY
    facts["register_heavy"] = (facts.get("registers") or 0) > MANY_REGISTERS
    facts["memory_room"] = (facts["bound"] == "memory" and facts["sol_fraction"] is not None
                            and facts["sol_fraction"] < MEMORY_SOL_GOAL)
    if facts["spilling"]:
        lines.append("registers spill to local memory: use smaller tiles or fewer rows per program")
    if facts["low_occupancy"] and facts["register_heavy"]:
        lines.append("low occupancy from register pressure: try fewer warps or a smaller block")
    if facts["memory_room"]:
        lines.append("memory-bound below 80% of bandwidth: try bigger blocks, more work per program, cache hints")

    nvml = result.nvml or {}
    facts["throttled"] = bool(nvml.get("throttled"))
    if facts["throttled"]:
        lines.append(f"the GPU throttled during timing ({', '.join(nvml.get('reasons') or [])}): timings are noisy")

    for kernel, counters in (result.ncu or {}).items():
        # stall values are warps stalled per issued instruction (a ratio); the others are percentages
        top = sorted(counters.stalls.items(), key=lambda kv: (-(kv[1] or 0), kv[0]))[:2]
        facts.setdefault("top_stall", top[0][0] if top else None)
        facts.setdefault("achieved_occupancy", None if counters.achieved_occupancy_pct is None
                         else counters.achieved_occupancy_pct / 100)
        lines.append(f"ncu {kernel}: DRAM {_pct(counters.dram_pct, scale=0.01)}, "
                     f"SM {_pct(counters.sm_pct, scale=0.01)}, "
                     f"achieved occupancy {_pct(counters.achieved_occupancy_pct, scale=0.01)}"
                     + (", top stalls " + ", ".join(f"{k} {v:.1f}" for k, v in top) if top else ""))

    if result.speedup_over("eager") is not None:
        lines.append(f"speedup {result.speedup_over('eager'):.2f}x over eager, "
                     f"{result.speedup_over('compile') or 0:.2f}x over compile")
    if result.vs_best:
        lines.append(f"re-timed against the best so far: {result.vs_best.ratio:.3f}x "
                     f"(95% CI {result.vs_best.ci_low:.3f}-{result.vs_best.ci_high:.3f}): {result.vs_best.outcome}")
    if result.timing_note:
        lines.append(result.timing_note)
    return "\n".join(lines), facts


def _pct(value, scale: float = 1.0) -> str:
    return "unknown" if value is None else f"{value * scale:.0%}"
