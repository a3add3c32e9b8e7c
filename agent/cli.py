"""The `kloop` command line: one typer app, each group of commands in its own module.

Command modules keep torch/triton imports inside their functions so `kloop --help` stays fast.
"""
from __future__ import annotations

import typer

from agent import cmd_bench, cmd_data, cmd_eval, cmd_loop

app = typer.Typer(
    name="kloop",
    help="Let an agent optimize one GPU kernel: write, assemble, verify, profile, reflect, log.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command("eval")(cmd_eval.eval_command)
app.command("targets")(cmd_eval.targets_command)
app.command("optimize")(cmd_loop.optimize_command)
app.command("resume")(cmd_loop.resume_command)
app.command("runs")(cmd_loop.runs_command)
app.command("show")(cmd_loop.show_command)
app.command("export")(cmd_data.export_command)
app.command("replay")(cmd_data.replay_command)
app.command("report")(cmd_data.report_command)
app.command("bench")(cmd_bench.bench_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
