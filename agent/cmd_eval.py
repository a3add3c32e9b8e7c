"""`kloop eval` (judge one candidate) and `kloop targets` (list the built-in targets)."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr and exit status 2: how every kloop command reports bad input. The message is plain
    text (a path like runs/[x].db is not read as rich markup)."""
    Console(stderr=True).print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def eval_command(
    target: str = typer.Argument(..., help="A built-in target name (see `kloop targets`) or a path to a KernelBench-style module."),
    candidate: Path = typer.Argument(..., help="A module defining ModelNew (Triton kernels, or PTX through tools.launch.PtxKernel)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON object on stdout."),
    trials: int = typer.Option(5, min=5, help="Correctness trials on the main shape (at least 5)."),
    timed_calls: int = typer.Option(30, min=30, help="Timed calls per measured function (at least 30)."),
    compile_baseline: bool = typer.Option(True, help="Also time torch.compile of the reference (max-autotune-no-cudagraphs)."),
    ncu: bool = typer.Option(False, "--ncu", help="Collect Nsight Compute counters for the candidate's own kernels."),
) -> None:
    """Judge one candidate kernel against one target: verify, then time on the GPU."""
    from tools.evaluate import EvalSettings, evaluate
    from tools.target import TargetError, load_target

    if not candidate.is_file():
        fail(f"no candidate file {candidate}")
    try:
        tgt = load_target(target)
        check_reference(tgt)
    except TargetError as e:
        fail(str(e))
    settings = EvalSettings(trials=trials, timed_calls=timed_calls, ncu=ncu,
                            baselines=("eager", "compile") if compile_baseline else ("eager",))
    result = evaluate(tgt, candidate.read_text(), settings)
    if as_json:
        print(json.dumps(result, default=str))
    else:
        print_summary(result)
    raise typer.Exit(0 if result["verdict"] == "correct" else 1)


def check_reference(target) -> None:
    """A target whose own reference fails is the user's problem, said in one line before any candidate runs."""
    import torch

    from tools.evaluate import EvalSettings
    from tools.inputs import DEVICE, make_inputs
    from tools.target import TargetError

    small = EvalSettings().small
    for shape in target.shapes(small):
        try:
            with target.overrides(shape), torch.no_grad():
                model = target.module.Model(*target.module.get_init_inputs()).to(DEVICE)
                model(*make_inputs(target.module, 0))
        except TargetError:
            raise
        except Exception as e:
            raise TargetError(f"target {target.name}: the reference fails at {shape or 'its main shape'}: "
                              f"{type(e).__name__}: {e}".splitlines()[0]) from None


def print_summary(r: dict) -> None:
    color = {"correct": "green", "incorrect": "red", "rejected": "magenta"}.get(r["verdict"], "yellow")
    console.print(f"verdict: [bold {color}]{r['verdict']}[/]  language: {r['language']}  ran on: {r['executed_on']}")
    for reason in r["reasons"]:
        console.print(f"  - {reason}", highlight=False)
    if r.get("correctness"):
        c = r["correctness"]
        console.print(f"correctness: {c['trials']} trials over {c['shapes']} shapes, max abs error {c['max_abs_err']:.3g}")
    if r.get("time_us"):
        t = r["time_us"]
        table = Table("", "median us", "IQR us", "speedup")
        table.add_row("candidate", f"{t['median']:.2f}", f"{t['iqr']:.2f}", "")
        for name, b in (r.get("baselines") or {}).items():
            spread = f"{b['iqr']:.2f}" if "iqr" in b else "derived from eager"
            table.add_row(name, f"{b['median']:.2f}", spread, f"{r['speedup'].get(name, 0):.2f}x")
        console.print(table)
        roof = r.get("roofline") or {}
        if roof.get("sol_fraction") is not None:
            console.print(f"speed of light: {roof['sol_us']:.2f} us ({roof['bound']}-bound); reached {roof['sol_fraction']:.0%}")
    if r.get("timing_note"):
        console.print(f"[dim]{r['timing_note']}[/]")
    for res in r.get("resources") or []:
        console.print(f"kernel {res.get('kernel')}: " + ", ".join(
            f"{k}={res[k]}" for k in ("registers", "spills", "shared_bytes", "num_warps", "num_stages", "occupancy")
            if res.get(k) is not None), highlight=False)
    for kernel, c in (r.get("ncu") or {}).items():
        stalls = ", ".join(f"{name} {value:.1f}" for name, value in c.get("top_stalls") or [])
        console.print(f"ncu {kernel}: {c.get('gpu_time_us', 0):.1f} us, DRAM {c.get('dram_pct', 0):.0f}%, "
                      f"SM {c.get('sm_pct', 0):.0f}%, achieved occupancy {c.get('achieved_occupancy_pct', 0):.0f}%, "
                      f"L2 hit {c.get('l2_hit_pct', 0):.0f}%; top stalls: {stalls or '-'}", highlight=False)
    if r.get("flags"):
        console.print(f"flags: {', '.join(r['flags'])}")


def targets_command() -> None:
    """List the built-in targets."""
    from tools.target import load_target
    from tools.targets import BUILTIN_TARGETS

    table = Table("target", "description")
    for name in BUILTIN_TARGETS:
        table.add_row(name, load_target(name).description)
    console.print(table)
