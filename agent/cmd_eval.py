"""`kloop eval` (judge one candidate) and `kloop targets` (list the built-in targets)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from agent.output import fail, make_console, plural
from tools.result import EvalResult

console = make_console()


def eval_command(
    target: str = typer.Argument(..., help="A built-in target name (see `kloop targets`) or a path to a KernelBench-style module."),
    candidate: Path = typer.Argument(..., help="A module defining ModelNew (Triton kernels, or PTX through tools.launch.PtxKernel)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
    trials: int = typer.Option(5, min=5, metavar="N", help="Correctness trials on the main shape (at least 5)."),
    timed_calls: int = typer.Option(30, min=30, metavar="N", help="Timed calls per measured function (at least 30)."),
    no_compile_baseline: bool = typer.Option(False, "--no-compile-baseline", help="Time eager only, not torch.compile of the reference."),
    compile_mode: str = typer.Option("max-autotune-no-cudagraphs", metavar="MODE", help="torch.compile mode of the compile baseline: max-autotune-no-cudagraphs or default."),
    ncu: bool = typer.Option(False, "--ncu", help="Collect Nsight Compute counters for the candidate's own kernels."),
) -> None:
    """Judge one candidate kernel against one target: verify, then time on the GPU."""
    from sandbox.evaluate import COMPILE_MODES, EvalSettings, evaluate
    from tools.target import TargetError, check_reference, load_target

    if not candidate.is_file():
        fail(f"no candidate file {candidate}")
    if compile_mode not in COMPILE_MODES:
        fail(f"unknown --compile-mode {compile_mode!r} (one of {', '.join(COMPILE_MODES)})")
    try:
        tgt = load_target(target)
        check_reference(tgt)
    except TargetError as e:
        fail(str(e))
    if tgt.degenerate:
        make_console(stderr=True).print(f"note: target {tgt.name} is degenerate: {tgt.degenerate}; no speedup is "
                                        "reported", highlight=False, soft_wrap=True, markup=False)
    from tools.inputs import DEVICE

    if ncu and DEVICE.type != "cuda":
        make_console(stderr=True).print("note: --ncu needs a CUDA GPU; no Nsight Compute counters on this machine",
                                        highlight=False, soft_wrap=True)
        ncu = False
    settings = EvalSettings(trials=trials, timed_calls=timed_calls, ncu=ncu, compile_mode=compile_mode,
                            baselines=("eager",) if no_compile_baseline else ("eager", "compile"))
    try:
        result = evaluate(tgt, candidate.read_text(), settings)
    except KeyboardInterrupt:
        make_console(stderr=True).print("interrupted: no verdict", highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    if as_json:
        print(json.dumps({**result.to_dict(), "withheld": result.withheld}, default=str))
    else:
        print_summary(result)
    raise typer.Exit(0 if result.correct else 1)


def print_summary(r: EvalResult) -> None:
    color = {"correct": "green", "incorrect": "red", "rejected": "magenta"}.get(r.verdict, "yellow")
    ran_on = r.executed_on or ("nothing: the PTX was assembled for sm_90, not run (no CUDA GPU)"
                               if r.language == "ptx" and r.ptx else "nothing (not run)")
    console.print(f"verdict: [bold {color}]{r.verdict}[/]  language: {r.language}  ran on: {ran_on}")
    for reason in r.reasons:   # escaped: a candidate's own error text is no markup
        console.print(f"  - {escape(reason)}", highlight=False)
    for reason in r.withheld:
        console.print(f"  - withheld from the policy: {escape(reason)}", highlight=False)
    if r.correctness:
        c = r.correctness
        console.print(f"correctness: {plural(c.trials, 'trial')} over {plural(c.shapes, 'shape')}, "
                      f"max abs error {c.max_abs_err:.3g}")
    if r.time_us:
        table = Table("", "median us", "IQR us", "speedup")
        table.add_row("candidate", f"{r.time_us.median:.2f}", f"{r.time_us.iqr or 0:.2f}", "")
        for name, b in (r.baselines or {}).items():
            spread = "derived from eager" if b.derived_from_eager else f"{b.iqr or 0:.2f}"
            table.add_row(name, f"{b.median:.2f}", spread, f"{r.speedup_over(name) or 0:.2f}x")
        console.print(table)
        roof = r.roofline
        if roof and roof.sol_fraction is not None:
            console.print(f"speed of light: {roof.sol_us:.2f} us ({roof.bound}-bound); reached {roof.sol_fraction:.0%}")
    if r.timing_note:
        console.print(f"[dim]{r.timing_note}[/]")
    for res in r.resources:
        console.print(f"kernel {res.kernel}: " + ", ".join(
            f"{k}={getattr(res, k)}" for k in ("registers", "spills", "shared_bytes", "num_warps", "num_stages",
                                               "occupancy") if getattr(res, k) is not None), highlight=False)
    for kernel, c in (r.ncu or {}).items():
        stalls = ", ".join(f"{name} {value:.1f}" for name, value in c.top_stalls)
        console.print(f"ncu {kernel}: {c.gpu_time_us or 0:.1f} us, DRAM {c.dram_pct or 0:.0f}%, "
                      f"SM {c.sm_pct or 0:.0f}%, achieved occupancy {c.achieved_occupancy_pct or 0:.0f}%, "
                      f"L2 hit {c.l2_hit_pct or 0:.0f}%; top stalls: {stalls or '-'}", highlight=False)
    if r.isolation and not r.isolation.startswith("bwrap"):
        console.print(f"warning: the candidate ran with weaker isolation: {r.isolation}", highlight=False)
    if r.flags:
        console.print(f"flags: {', '.join(r.flags)}")


def targets_command(
    targets: Optional[List[str]] = typer.Argument(None, metavar="[TARGET]...", help="Your own targets (KernelBench-style files) or built-in names: the shapes kloop derived for each (default: list the built-ins)."),
) -> None:
    """List the built-in targets with their main shape (on a GPU, and at CPU size without one); with TARGET, the
    shapes kloop checks a target at: its main shape, how many hidden variants, and its CPU size."""
    from tools.target import TargetError, load_target
    from tools.targets import BUILTIN_TARGETS

    if targets:
        for spec in targets:
            try:
                target = load_target(spec)
                lines = target_shape_lines(target)
            except TargetError as e:
                fail(str(e))
            console.print(f"[bold]{escape(target.name)}[/]" + (f": {escape(target.description)}"
                                                                 if target.description else ""), highlight=False)
            for line in lines:
                console.print(f"  {line}", highlight=False, markup=False)
        return
    table = Table("target", "description", "shape (GPU)", "shape (CPU)")
    for name in BUILTIN_TARGETS:
        target = load_target(name)
        table.add_row(name, target.description, *(target.describe_shape(target.shapes(small=small)[0])
                                                  for small in (False, True)))
    console.print(table)


def target_shape_lines(target) -> list[str]:
    """The shapes kloop derived for a target, in words: on a GPU and on the CPU, the main shape (the one timed and
    shown to the policy) and how many hidden variants are checked beside it (never shown), with where they came from."""
    lines = []
    for small, where in ((False, "on a GPU"), (True, "on the CPU (Triton interpreter)")):
        shapes = target.shapes(small=small)
        lines.append(f"{where}: main shape {target.describe_shape(shapes[0])}; "
                     f"{plural(len(shapes) - 1, 'hidden variant')} ({target.shape_note(small)})")
    return lines
