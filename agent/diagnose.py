"""The reflect node's reading of one evaluator result: what bounds the kernel and what to change next.

`diagnose(result) -> (text, facts)`: a few plain lines for the policy's next context and the database, and a small
dict the offline policy chooses its move from. Thresholds are rules of thumb for Hopper-class GPUs.
"""
from __future__ import annotations

LOW_OCCUPANCY = 0.5        # below half the warps an SM can hold, latency hiding suffers
MANY_REGISTERS = 128       # per thread; above this occupancy is capped at a quarter or less
MEMORY_SOL_GOAL = 0.8      # a memory-bound kernel below 80% of bandwidth still has room


def diagnose(result: dict) -> tuple[str, dict]:
    verdict = result.get("verdict") or "unknown"
    facts: dict = {"verdict": verdict, "executed_on": result.get("executed_on")}
    lines: list[str] = []
    if verdict != "correct":
        reasons = result.get("reasons") or []
        lines.append(f"verdict {verdict}" + (f": {reasons[0]}" if reasons else ""))
        lines += [f"  {r}" for r in reasons[1:3]]

    roofline = result.get("roofline") or {}
    facts["bound"] = roofline.get("bound")
    facts["sol_fraction"] = roofline.get("sol_fraction")
    if facts["bound"]:
        sol = facts["sol_fraction"]
        lines.append(f"{facts['bound']}-bound" + (f", at {sol:.0%} of speed-of-light" if sol is not None else
                                                 " (no timing: speed-of-light fraction unknown)"))

    resources = result.get("resources") or []
    measured = [r for r in resources if r.get("registers") is not None]  # the interpreter reports none
    if measured:
        main = max(measured, key=lambda r: r["registers"])
        # Triton reports a spill count, ptxas -v spilled bytes; either way nonzero means local-memory traffic.
        spills = main.get("spills") or (main.get("spill_stores_bytes") or 0) + (main.get("spill_loads_bytes") or 0)
        facts.update(registers=main["registers"], spills=spills, occupancy=main.get("occupancy"),
                     num_warps=main.get("num_warps"), shared_bytes=main.get("shared_bytes"))
        lines.append(f"{main.get('kernel')}: {main['registers']} registers, {spills} spilled, "
                     f"{main.get('shared_bytes') or 0} B shared, occupancy {_pct(main.get('occupancy'))}")
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

    nvml = result.get("nvml") or {}
    facts["throttled"] = bool(nvml.get("throttled"))
    if facts["throttled"]:
        lines.append(f"the GPU throttled during timing ({', '.join(nvml.get('reasons') or [])}): timings are noisy")

    ncu = result.get("ncu") or {}
    for kernel, counters in ncu.items():
        # stall values are warps stalled per issued instruction (a ratio); the others are percentages
        top = sorted((counters.get("stalls") or {}).items(), key=lambda kv: (-(kv[1] or 0), kv[0]))[:2]
        facts.setdefault("top_stall", top[0][0] if top else None)
        occupancy = counters.get("achieved_occupancy_pct", counters.get("achieved_occupancy"))
        lines.append(f"ncu {kernel}: DRAM {_pct(counters.get('dram_pct'), scale=0.01)}, "
                     f"SM {_pct(counters.get('sm_pct'), scale=0.01)}, achieved occupancy {_pct(occupancy, scale=0.01)}"
                     + (", top stalls " + ", ".join(f"{k} {v:.1f}" for k, v in top) if top else ""))

    speedup = result.get("speedup") or {}
    if speedup.get("eager") is not None:
        lines.append(f"speedup {speedup['eager']:.2f}x over eager, {speedup.get('compile') or 0:.2f}x over compile")
    if result.get("timing_note"):
        lines.append(result["timing_note"])
    return "\n".join(lines), facts


def _pct(value, scale: float = 1.0) -> str:
    return "unknown" if value is None else f"{value * scale:.0%}"
