"""The reflect node's reading of one evaluator result: what bounds the kernel and what to change next.

`diagnose(result) -> (text, facts)`: a few plain lines for the policy's next context and the database, and a small
dict the offline policy chooses its move from. Thresholds are rules of thumb for Hopper-class GPUs.
"""
from __future__ import annotations

from tools.result import EvalResult

LOW_OCCUPANCY = 0.5        # below half the warps an SM can hold, latency hiding suffers
MANY_REGISTERS = 128       # per thread; above this occupancy is capped at a quarter or less
MEMORY_SOL_GOAL = 0.8      # a memory-bound kernel below 80% of bandwidth still has room
COMPUTE_SOL_GOAL = 0.85    # a compute-bound kernel below 85% of the tensor peak still has room (cuBLAS: ~80-90%)
TENSOR_BUSY = 80.0         # percent of cycles the tensor pipe is active: above this the math is the limit
# Stall reasons (Nsight Compute) that mean warps wait for data: for a tensor-core kernel, loads that arrive too late
# (more pipeline stages, a producer warp group, bigger tiles); and ones that mean shared memory is the bottleneck.
WAITING_STALLS = ("long_scoreboard", "barrier", "wait", "lg_throttle", "membar", "sleeping")
SHARED_STALLS = ("mio_throttle", "short_scoreboard")


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
    # A tensor-core tile kernel is one program per SM by design: its low occupancy is no symptom.
    facts["low_occupancy"] = (facts.get("occupancy") is not None and facts["occupancy"] < LOW_OCCUPANCY
                              and facts["bound"] != "compute")
    facts["register_heavy"] = (facts.get("registers") or 0) > MANY_REGISTERS
    facts["memory_room"] = (facts["bound"] == "memory" and facts["sol_fraction"] is not None
                            and facts["sol_fraction"] < MEMORY_SOL_GOAL)
    facts["compute_room"] = (facts["bound"] == "compute" and facts["sol_fraction"] is not None
                             and facts["sol_fraction"] < COMPUTE_SOL_GOAL)
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

    lines += _counter_lines(result, facts)

    if result.speedup_over("eager") is not None:
        lines.append(f"speedup {result.speedup_over('eager'):.2f}x over eager, "
                     f"{result.speedup_over('compile') or 0:.2f}x over compile")
    if result.vs_best:
        lines.append(f"re-timed against the best so far: {result.vs_best.ratio:.3f}x "
                     f"(95% CI {result.vs_best.ci_low:.3f}-{result.vs_best.ci_high:.3f}): {result.vs_best.outcome}")
    if result.timing_note:
        lines.append(result.timing_note)
    return "\n".join(lines), facts


def _counter_lines(result: EvalResult, facts: dict) -> list[str]:
    """What Nsight Compute's counters say (one line per kernel), and where a compute-bound kernel's time goes; the
    facts they give join `facts`."""
    lines: list[str] = []
    for kernel, counters in (result.ncu or {}).items():
        # stall values are warps stalled per issued instruction (a ratio); the others are percentages
        top = sorted(counters.stalls.items(), key=lambda kv: (-(kv[1] or 0), kv[0]))[:2]
        facts.setdefault("top_stall", top[0][0] if top else None)
        facts.setdefault("achieved_occupancy", None if counters.achieved_occupancy_pct is None
                         else counters.achieved_occupancy_pct / 100)
        facts.setdefault("tensor_pct", counters.tensor_pct)
        lines.append(f"ncu {kernel}: DRAM {_pct(counters.dram_pct, scale=0.01)}, "
                     f"SM {_pct(counters.sm_pct, scale=0.01)}, "
                     + (f"tensor pipe {_pct(counters.tensor_pct, scale=0.01)}, " if counters.tensor_pct is not None
                        else "")
                     + f"achieved occupancy {_pct(counters.achieved_occupancy_pct, scale=0.01)}"
                     + (", top stalls " + ", ".join(f"{k} {v:.1f}" for k, v in top) if top else ""))
    facts["tensor_busy"] = facts.get("tensor_pct") is not None and facts["tensor_pct"] >= TENSOR_BUSY or \
        facts.get("top_stall") == "math_pipe_throttle"
    facts["waiting_on_loads"] = facts["bound"] == "compute" and facts.get("top_stall") in WAITING_STALLS
    facts["shared_bound"] = facts["bound"] == "compute" and facts.get("top_stall") in SHARED_STALLS
    if facts["compute_room"]:
        if facts["tensor_busy"]:
            lines.append("the tensor pipe is busy: what is left is the epilogue and tile edges: overlap them "
                         "(persistent programs, warp specialization, a subtiled epilogue)")
        elif facts["waiting_on_loads"]:
            lines.append(f"compute-bound below {COMPUTE_SOL_GOAL:.0%} of peak, warps wait for their tiles "
                         f"({facts['top_stall']}): more pipeline stages, a TMA producer warp group, bigger tiles")
        elif facts["shared_bound"]:
            lines.append(f"compute-bound below {COMPUTE_SOL_GOAL:.0%} of peak, shared memory is the bottleneck "
                         f"({facts['top_stall']}): bigger tiles (more math per byte), fewer warps sharing it")
        else:
            lines.append(f"compute-bound below {COMPUTE_SOL_GOAL:.0%} of peak: bigger tiles, deeper pipelining, "
                         "warp specialization")
    return lines


def _pct(value, scale: float = 1.0) -> str:
    return "unknown" if value is None else f"{value * scale:.0%}"
