"""The `kloop` command line: one typer app, each group of commands in its own module.

Command modules keep torch/triton imports inside their functions so `kloop --help` stays fast.
"""
from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

try:  # typer >= 0.24 carries its own copy of click
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover
    from click import exceptions as click

from agent import cmd_bench, cmd_data, cmd_eval, cmd_loop, cmd_memory
from agent import cmd_serve
from agent import cmd_suite, cmd_view


class OneLineErrors(TyperGroup):
    """Every usage or option error is one line on stderr and exit status 2, like kloop's own input errors (no
    boxed usage message): `error: Invalid value for '--max-attempts': ... (see `kloop optimize --help`)`."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
        except click.NoArgsIsHelpError as e:
            if not standalone_mode:
                raise
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            if not standalone_mode:
                raise
            where = e.ctx.command_path if getattr(e, "ctx", None) is not None else "kloop"
            message = " ".join(e.format_message().split())
            hint = f" (see `{where} --help`)" if isinstance(e, click.UsageError) else ""
            cmd_eval.make_console(stderr=True).print(f"error: {message}{hint}", markup=False, highlight=False,
                                                     soft_wrap=True)
            sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            cmd_eval.make_console(stderr=True).print("interrupted", highlight=False)
            sys.exit(130)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="kloop",
    help="Let an agent optimize one GPU kernel: write, assemble, verify, profile, reflect, log.",
    cls=OneLineErrors,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",   # help texts are rich markup: a literal [ray] is escaped in them ("'.\\[ray]'")
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"kloop {version('kloop')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("kloop (not installed)")
        raise typer.Exit()


# Commands that start evaluator sessions: before one starts, what killed kloop processes left in the scratch root
# (/dev/shm: plans, and weights on a GPU) is removed (agent.run.clean_scratch).
STARTS_SESSIONS = {"eval", "optimize", "resume", "reverify", "replay", "bench", "suite", "serve"}


@app.callback()
def _options(ctx: typer.Context,
             show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                               help="Print kloop's version and exit.")) -> None:
    if ctx.invoked_subcommand in STARTS_SESSIONS and not ctx.resilient_parsing:
        from agent.run import clean_scratch

        clean_scratch()

app.command("eval")(cmd_eval.eval_command)
app.command("targets")(cmd_eval.targets_command)
app.command("optimize")(cmd_loop.optimize_command)
app.command("resume")(cmd_loop.resume_command)
app.command("runs")(cmd_loop.runs_command)
app.command("show")(cmd_loop.show_command)
app.command("diff")(cmd_loop.diff_command)
app.command("export")(cmd_data.export_command)
app.command("reverify")(cmd_data.reverify_command)  # re-verify logged attempts
# its old name, hidden, for one release: "replay" is the policy that re-drives a run from recorded answers
app.command("replay", hidden=True)(cmd_data.reverify_command)
app.command("report")(cmd_data.report_command)
app.command("view")(cmd_view.view_command)
app.command("bench")(cmd_bench.bench_command)
app.command("suite")(cmd_suite.suite_command)
app.command("serve")(cmd_serve.serve_command)
app.add_typer(cmd_memory.app, name="memory")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
