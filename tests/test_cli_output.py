"""What a new user meets at the command line: one-line errors, refused empty budgets, nothing created on refusal,
full-width output when piped, attempts that say what they tried, resume that extends, reverify that leaves its source
alone (issue 13, "Stumbles")."""
from __future__ import annotations

import io
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import evaluated
from agent.cli import app
from agent.progress import attempt_label
from agent.output import Output, duration, plural, print_code
from sandbox.evaluate import PTX_NOT_RUN
from tools.records.store import attempt_columns, open_db

REPO = Path(__file__).resolve().parents[1]
MARKED = ('# kloop-offline: {"template": "vector_add/triton_block", "values": {"BLOCK_SIZE": %d, "NUM_WARPS": 8}}\n'
          "import torch\n")


def cli(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def one_line_error(result, code=2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- option errors: one line, exit 2, nothing created ---------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["optimize", "vector_add", "--max-attempts", "0"], "Invalid value for '--max-attempts'"),
    (["optimize", "vector_add", "--nope"], "No such option: --nope"),
    (["optimize"], "Missing argument 'TARGET'"),
    (["optimise", "vector_add"], "No such command 'optimise'"),
    (["runs", "--db"], "Option '--db' requires an argument"),
])
def test_usage_errors_are_one_line_on_stderr_with_exit_2(tmp_path, args, message):
    line = one_line_error(cli(*args))
    assert message.lower() in line.lower() and "--help" in line
    assert "╭" not in line and "Usage:" not in line


def test_usage_error_through_the_real_entry_point_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "optimize", "vector_add", "--max-attempts", "0",
                           "--db", str(tmp_path / "k.db")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: Invalid value for '--max-attempts'")
    assert not (tmp_path / "k.db").exists()


@pytest.mark.parametrize("args, message", [
    (["--hours", "0"], "error: --hours must be more than 0, got 0"),
    (["--hours", "-1"], "error: --hours must be more than 0, got -1"),
    (["--max-cost", "0"], "error: --max-cost must be more than 0, got 0"),
])
def test_empty_budgets_are_refused_and_nothing_is_created(tmp_path, args, message):
    db = tmp_path / "runs" / "k.db"
    assert one_line_error(cli("optimize", "vector_add", "--policy", "offline", *args, "--db", db)) == message
    assert not db.parent.exists()


def test_an_unknown_strategy_is_refused_by_the_run_settings_check_and_nothing_is_created(tmp_path):
    db = tmp_path / "runs" / "k.db"
    line = one_line_error(cli("optimize", "vector_add", "--policy", "offline", "--strategy", "greedy", "--db", db))
    assert line == "error: unknown strategy 'greedy' (one of refine, best-of-n, metr, evolve)"
    assert not db.parent.exists()


def test_a_policy_that_cannot_start_leaves_no_database(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    db = tmp_path / "k.db"
    line = one_line_error(cli("optimize", "vector_add", "--policy", "anthropic", "--db", db))
    assert "ANTHROPIC_API_KEY" in line
    assert list(tmp_path.iterdir()) == []
    # an existing database is kept as it was
    open_db(db).close()
    before = db.read_bytes()
    one_line_error(cli("optimize", "vector_add", "--policy", "anthropic", "--db", db))
    assert db.read_bytes() == before


def test_ptx_without_a_gpu_is_refused_before_any_attempt(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: PTX runs")
    db = tmp_path / "k.db"
    line = one_line_error(cli("optimize", "vector_add", "--language", "ptx", "--db", db))
    assert line.startswith("error: --language ptx needs a CUDA GPU") and not db.exists()


# -- full width when piped ----------------------------------------------------------------------------------------
LONG = "EVICTION = 'evict_first'  # streamed data is never reused: do not let it push other lines out of L2" * 2


def test_code_is_never_wrapped_or_cropped_without_a_terminal():
    out = io.StringIO()
    console = Output(file=out)
    assert not console.is_terminal and console.width > 1000
    source = f"import torch\n{LONG}\n\n\nclass ModelNew(torch.nn.Module):\n    pass\n"
    print_code(console, source)
    assert out.getvalue() == source
    compile(out.getvalue(), "best.py", "exec")   # still valid Python


def make_runs_db(path: Path) -> str:
    store = open_db(path)
    run_id = store.create_run(target_name="vector_add", policy="offline", settings={"target": "vector_add"})
    ids = [store.add_attempt(run_id, source=MARKED % block, **attempt_columns(evaluated.result("correct")))
           for block in (1024, 2048)]
    not_run = evaluated.result("runtime_error", language="ptx", reasons=["not run: no CUDA GPU here"],
                               timing_note=PTX_NOT_RUN)
    store.add_attempt(run_id, source=MARKED.replace('}}', '}, "ptx_edit": "cs"}') % 1024, **attempt_columns(not_run))
    store.update_run(run_id, status="finished", best_attempt_id=ids[0], notes="reached 3 attempts; and a long note " + "x" * 120)
    store.close()
    return run_id


def test_runs_and_show_print_whole_cells_when_piped(tmp_path):
    db = tmp_path / "k.db"
    run_id = make_runs_db(db)
    listed = cli("runs", "--db", db)
    assert listed.exit_code == 0
    store = open_db(db, create=False, readonly=True)
    run = store.get_run(run_id)
    assert run["created_at"][:16].replace("T", " ") in listed.output and run["notes"] in listed.output
    assert "…" not in listed.output
    shown = cli("show", run_id, "--db", db)
    assert shown.exit_code == 0 and "…" not in shown.output
    rows = [line for line in shown.output.splitlines() if line[:1].isdigit()]
    assert [" ".join(row.split()) for row in rows] == [
        "1 correct - - - - triton vector_add/triton_block BLOCK_SIZE=1024, NUM_WARPS=8",
        "2 correct - - - - triton vector_add/triton_block BLOCK_SIZE=2048, NUM_WARPS=8",
        "3 runtime_error - - - - ptx vector_add/triton_block BLOCK_SIZE=1024, NUM_WARPS=8 ptx_edit=cs "
        "not run: no CUDA GPU here"]
    assert "no attempt was timed (no CUDA GPU)" in shown.output


def test_a_candidates_text_is_printed_as_it_is_never_as_markup(tmp_path, monkeypatch):
    # A reason carries the candidate's own error text; "[/]" as rich markup stopped `kloop show` and `kloop eval`
    # with a MarkupError. What a hidden variant withheld from the policy is shown to the operator, also verbatim.
    from agent.cmd_eval import print_summary
    from tools.result import EvalResult

    result = EvalResult(verdict="runtime_error", reasons=["hidden variant 1: runtime_error"],
                        withheld=["hidden variant 1: runtime_error: ValueError: [/] [bold]x[/bold] at (7, 13)"])
    out = io.StringIO()
    monkeypatch.setattr("agent.cmd_eval.console", Output(file=out))
    print_summary(result)
    print_summary(EvalResult(verdict="runtime_error", reasons=["ValueError: [/]"]))
    text = out.getvalue()
    assert "withheld from the policy: hidden variant 1: runtime_error: ValueError: [/] [bold]x[/bold] at (7, 13)" in text
    assert "  - ValueError: [/]" in text
    db = tmp_path / "k.db"
    store = open_db(db)
    run_id = store.create_run(target_name="vector_add", policy="offline", settings={})
    store.add_attempt(run_id, source="# [/] a label\nimport torch\n", **attempt_columns(result))
    store.close()
    shown = cli("show", run_id, "--db", db)
    assert shown.exit_code == 0, shown.output
    assert "#1 withheld from the policy: hidden variant 1: runtime_error: ValueError: [/] [bold]x[/bold] at (7, 13)" \
        in shown.output


def test_a_terminal_never_receives_a_candidates_control_characters():
    # an escape sequence in a reason or a kernel would drive the operator's terminal (clear it, retitle it, write the
    # clipboard through OSC 52): in a terminal it is shown escaped; piped, a kernel stays byte for byte what it is
    hostile = "bad \x1b]52;c;cHduZWQ=\x1b\\ \x1b[2J\x9b done"
    out = io.StringIO()
    Output(file=out, force_terminal=True).print(f"[red]verdict[/] {hostile}", highlight=False)
    text = out.getvalue()
    assert "\\x1b]52;c;cHduZWQ=\\x1b\\ \\x1b[2J\\x9b done" in text
    assert text.count("\x1b") == 2 and "\x1b[31mverdict\x1b[0m" in text   # kloop's own colour, nothing else
    piped = io.StringIO()
    print_code(Output(file=piped), f"s = '{hostile}'")
    assert piped.getvalue() == f"s = '{hostile}'\n"


def test_runs_json(tmp_path):
    db = tmp_path / "k.db"
    run_id = make_runs_db(db)
    listed = cli("runs", "--json", "--db", db)
    data = json.loads(listed.stdout)
    assert [(r["id"], r["attempts_count"], r["db"]) for r in data["runs"]] == [(run_id, 3, str(db))]
    assert [(b["target"], b["run"], b["attempt"]) for b in data["leaderboard"]] == [("vector_add", run_id, 1)]


def test_attempt_label():
    assert attempt_label(MARKED % 64) == "vector_add/triton_block BLOCK_SIZE=64, NUM_WARPS=8"
    assert attempt_label("@triton.jit\ndef add_kernel(x):\n    pass\n") == "add_kernel"
    assert attempt_label('PTX = """.visible .entry add(.param .u64 a)"""') == "add"
    assert attempt_label("") == ""


def test_wording():
    assert [plural(n, "attempt") for n in (0, 1, 2)] == ["0 attempts", "1 attempt", "2 attempts"]
    assert [duration(h) for h in (1 / 60, 0.0166667, 0.5, 1, 2.5, 1 / 7200)] == [
        "1 min", "1 min", "30 min", "1 h", "2 h 30 min", "0.5 s"]


def test_targets_show_shapes():
    listed = cli("targets")
    assert listed.exit_code == 0
    row = next(line for line in listed.output.splitlines() if "│ softmax " in line)
    assert "ROWS=8192, COLS=8192" in row and "ROWS=64, COLS=1000" in row


def test_best_kernel_files_are_git_ignored():
    proc = subprocess.run(["git", "check-ignore", "runs/0123abcd_best_7.py"], cwd=REPO, capture_output=True)
    assert proc.returncode == 0


# -- eval ------------------------------------------------------------------------------------------------------------
def test_eval_says_ncu_needs_a_gpu_and_ctrl_c_is_one_line(tmp_path, monkeypatch):
    import torch

    from tools.result import EvalResult

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --ncu runs")
    seen = {}

    def fake_evaluate(target, source, settings):
        seen["ncu"] = settings.ncu
        return EvalResult(verdict="correct", language="triton", executed_on="cpu-interpreter")

    candidate = tmp_path / "c.py"
    candidate.write_text("import torch\n")
    monkeypatch.setattr("sandbox.evaluate.evaluate", fake_evaluate)
    done = cli("eval", "vector_add", candidate, "--ncu")
    assert done.exit_code == 0 and seen == {"ncu": False}
    assert done.stderr == "note: --ncu needs a CUDA GPU; no Nsight Compute counters on this machine\n"

    def interrupted(target, source, settings):
        raise KeyboardInterrupt

    monkeypatch.setattr("sandbox.evaluate.evaluate", interrupted)
    stopped = cli("eval", "vector_add", candidate)
    assert stopped.exit_code == 130 and stopped.stderr == "interrupted: no verdict\n"


def test_ptx_not_run_says_so_in_the_summary(monkeypatch):
    from agent.cmd_eval import print_summary
    from tools.result import EvalResult, Resources

    out = io.StringIO()
    monkeypatch.setattr("agent.cmd_eval.console", Output(file=out))
    print_summary(EvalResult(verdict="runtime_error", language="ptx", executed_on=None, ptx={"add": ".entry add"},
                             reasons=["not run: no CUDA GPU here (PTX is assembled, not run, without a GPU)"],
                             resources=[Resources(kernel="add", source="ptxas", registers=12, spills=0)]))
    text = out.getvalue()
    assert "ran on: nothing: the PTX was assembled for sm_90, not run (no CUDA GPU)" in text
    assert "None" not in text.split("\n")[0] and "kernel add: registers=12, spills=0" in text


# -- resume extends a finished run ----------------------------------------------------------------------------------
def test_resume_extends_a_finished_run(tmp_path):
    from agent.graph import run_loop
    from test_loop import ScriptedPolicy, make_loop

    store = open_db(tmp_path / "k.db")
    run_id = store.create_run(target_name="fake", policy="scripted")
    checkpoints = Path(f"{store.path}.checkpoints")
    run_loop(make_loop(store, run_id, ScriptedPolicy(), max_attempts=2), checkpoints)
    assert store.get_run(run_id)["notes"] == "reached 2 attempts"
    # without restart a finished graph stays finished; with it, new budgets give new attempts, same numbering
    run_loop(make_loop(store, run_id, ScriptedPolicy(), max_attempts=4), checkpoints)
    assert len(store.attempts(run_id)) == 2
    events = []
    run_loop(make_loop(store, run_id, ScriptedPolicy(), max_attempts=4), checkpoints, events.append, restart=True)
    assert [a.number for a in store.attempts(run_id)] == [1, 2, 3, 4]
    assert store.get_run(run_id)["notes"] == "reached 4 attempts" and store.get_run(run_id)["status"] == "finished"
    assert [e["number"] for e in events if e["kind"] == "attempt"] == [3, 4]
    assert all(e["language"] == "triton" and e["source"] for e in events if e["kind"] == "attempt")


def test_resume_refuses_budgets_already_spent(tmp_path):
    db = tmp_path / "k.db"
    run_id = make_runs_db(db)
    assert one_line_error(cli("resume", run_id, "--max-attempts", 3, "--db", db)) == (
        f"error: run {run_id} already has 3 attempts; --max-attempts must be more")
    assert one_line_error(cli("resume", run_id, "--hours", 0, "--db", db)) == "error: --hours must be more than 0, got 0"
    done = cli("resume", run_id, "--db", db)
    assert done.exit_code == 0 and f"--max-attempts N" in done.output and "already finished" in done.output


# -- reverify never writes into the database it reads ---------------------------------------------------------------
@pytest.mark.slow   # one real evaluation of a logged H200 kernel under the interpreter: about 10 s on 2 CPU cores
def test_reverify_of_a_committed_database_leaves_it_untouched(tmp_path):
    source = tmp_path / "bench.db"
    with lzma.open(REPO / "results" / "bench-h200-part1.db.xz") as packed, open(source, "wb") as unpacked:
        shutil.copyfileobj(packed, unpacked)
    before = source.read_bytes()
    out_db = tmp_path / "runs" / "kloop.db"
    done = cli("reverify", "68b1dff4", "--db", source, "--out-db", out_db)
    assert done.exit_code == 0, done.output
    wal = Path(f"{source}-wal")   # a read-only reader of a WAL database may leave an empty -wal, never a write
    assert source.read_bytes() == before and (not wal.exists() or wal.stat().st_size == 0)
    assert f"in {out_db} (reverify of 68b1dff4 in {source})" in done.output
    (new,) = open_db(out_db, create=False).list_runs()
    assert new["parent_run_id"] == "68b1dff4" and new["parent_kind"] == "reverify"
    assert new["settings"]["replay_of_db"] == str(source.resolve())
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "results/"], cwd=REPO,
                            capture_output=True, text=True)
    assert status.stdout == ""


# -- one attempt whole, diffs, narrow terminals (issue 38) ----------------------------------------------------------
def make_lineage_db(path: Path) -> str:
    """Three attempts: #1 from the target alone, #2 from #1 (correct), #3 from #2 failing with three reasons, the
    first of them longer than a terminal line."""
    store = open_db(path)
    run_id = store.create_run(target_name="vector_add", policy="offline", settings={"target": "vector_add"})
    first = store.add_attempt(run_id, source=MARKED % 1024 + "x = 1\n", **attempt_columns(evaluated.result("correct")))
    second = store.add_attempt(run_id, source=MARKED % 2048 + "x = 1\n", parent_attempt_id=first,
                               parent_reason="evolve: the island's best elite, attempt #1 in cell triton/memory",
                               island=1, archive_cell="triton/memory/2",
                               **attempt_columns(evaluated.result("correct")))
    reasons = ["incorrect: output 0 differs from the reference at 4096 of 65536 elements " + "(detail) " * 20,
               "max abs error 3.5 at (7, 13)", "hidden variant 2: incorrect"]
    store.add_attempt(run_id, source=MARKED % 2048 + "x = 2\n", parent_attempt_id=second,
                      **attempt_columns(evaluated.result("incorrect", reasons=reasons)))
    store.update_run(run_id, status="finished", best_attempt_id=first, notes="reached 3 attempts")
    store.close()
    return run_id


def test_show_one_attempt_whole(tmp_path):
    db = tmp_path / "k.db"
    run_id = make_lineage_db(db)
    shown = cli("show", run_id, "--attempt", 2, "--db", db)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == f"attempt 2 of run {run_id} (vector_add): correct"
    assert "parent: #1" in lines and "island: 1" in lines and "cell: triton/memory/2" in lines
    assert "strategy: evolve: the island's best elite, attempt #1 in cell triton/memory" in lines
    assert "correctness: 9 trials over 3 shapes, max abs error 0" in lines
    assert shown.output.endswith("source:\n" + MARKED % 2048 + "x = 1\n")
    failed = cli("show", run_id, "-a", 3, "--db", db).output
    assert "reasons:\n  - incorrect: output 0 differs" in failed and "(detail) " * 20 in failed
    assert "  - max abs error 3.5 at (7, 13)\n  - hidden variant 2: incorrect\n" in failed
    assert one_line_error(cli("show", run_id, "--attempt", 9, "--db", db)) == \
        f"error: run {run_id} has no attempt 9 (its attempts: 1 to 3)"
    assert one_line_error(cli("show", run_id, "--diff", "--db", db)).startswith("error: --diff needs --attempt N")


def test_diff_against_the_parent_or_another_attempt(tmp_path):
    db = tmp_path / "k.db"
    run_id = make_lineage_db(db)
    against_parent = cli("diff", run_id, 3, "--db", db)
    assert against_parent.exit_code == 0
    assert against_parent.output == "--- attempt 2\n+++ attempt 3\n@@ -1,3 +1,3 @@\n" + \
        " " + (MARKED % 2048).replace("\n", "\n ", 1) + "-x = 1\n+x = 2\n"
    assert cli("show", run_id, "--attempt", 3, "--diff", "--db", db).output == against_parent.output
    two = cli("diff", run_id, 1, 3, "--db", db).output
    assert "-# kloop-offline" in two and '"BLOCK_SIZE": 1024' in two and "+x = 2" in two
    first = cli("diff", run_id, 1, "--db", db).output
    assert first.startswith("attempt 1 has no parent") and "+++ attempt 1" in first
    assert cli("diff", run_id, 2, 2, "--db", db).output == "attempts 2 and 2 have the same source\n"


def test_piped_show_prints_every_reason_whole(tmp_path):
    db = tmp_path / "k.db"
    run_id = make_lineage_db(db)
    out = cli("show", run_id, "--db", db).output
    assert "#3: max abs error 3.5 at (7, 13)\n#3: hidden variant 2: incorrect\n" in out
    assert f"#3: incorrect: output 0 differs from the reference at 4096 of 65536 elements {'(detail) ' * 19}" in out


@pytest.mark.parametrize("command", ["show", "runs"])
def test_80_columns_never_cut_a_verdict_or_status(tmp_path, monkeypatch, command):
    db = tmp_path / "k.db"
    run_id = make_lineage_db(db)
    out = io.StringIO()
    monkeypatch.setattr("agent.cmd_loop.console", Output(file=out, force_terminal=True, width=80, color_system=None))
    cli(*([command, run_id] if command == "show" else [command]), "--db", db)
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    words = set(text.split())
    assert {"correct", "incorrect"} <= words if command == "show" else "finished" in words
    if command == "show":   # cut at a word, whole with --attempt
        assert "#3: incorrect: output 0 differs from the reference at 4096 of 65536 elements (detail) (detail)..." in \
            " ".join(text.split())
        assert "kloop show" in text and "--attempt N" in text
    else:
        assert f"{run_id}: reached 3 attempts" in text


def test_a_killed_run_says_so(tmp_path):
    from agent.run import liveness, owner_record

    db = tmp_path / "k.db"
    run_id = make_lineage_db(db)
    store = open_db(db)
    store.update_run(run_id, status="running", owner=owner_record())
    assert liveness(store.get_run(run_id)) == ""   # this process: alive
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.update_run(run_id, owner=owner_record(dead.pid) | {"started": "1"})
    store.close()
    assert liveness(open_db(db, readonly=True, create=False).get_run(run_id)) == \
        f"no live process; `kloop resume {run_id}`"
    listed = cli("runs", "--json", "--db", db)
    assert json.loads(listed.output)["runs"][0]["stale"] == f"no live process; `kloop resume {run_id}`"
    assert f"running (no live process; `kloop resume {run_id}`)" in cli("show", run_id, "--db", db).output


def test_optimize_exits_1_when_nothing_was_verified(tmp_path, monkeypatch):
    import typer

    from agent import cmd_loop

    db = tmp_path / "k.db"
    store = open_db(db)
    run_id = store.create_run(target_name="vector_add", policy="offline", settings={"max_attempts": 1})
    store.add_attempt(run_id, source="x", **attempt_columns(evaluated.result("incorrect")))
    store.update_run(run_id, status="finished", notes="reached 1 attempt")
    monkeypatch.setattr("agent.run.run", lambda run, progress: None)
    monkeypatch.setattr("agent.learn.after_run", lambda *args: [])
    run = type("Run", (), {"id": run_id, "store": store, "settings": {"max_attempts": 1}, "policy": None,
                           "target": None})
    with pytest.raises(typer.Exit) as stopped:
        cmd_loop._run(run)
    assert stopped.value.exit_code == 1


def test_a_cpu_run_ends_with_where_the_kernel_is_not_the_kernel(tmp_path, monkeypatch):
    from agent import cmd_loop

    db = tmp_path / "k.db"
    run_id = make_lineage_db(db)
    out = io.StringIO()
    monkeypatch.setattr("agent.cmd_loop.console", Output(file=out))
    assert cmd_loop._print_best(open_db(db), run_id)
    text = out.getvalue()
    assert text.startswith("best verified kernel: attempt 1 (triton, vector_add/triton_block BLOCK_SIZE=1024, "
                           f"NUM_WARPS=8), 3 lines written to {tmp_path / f'{run_id}_best_1.py'}\n")
    assert "import torch" not in text and "untimed attempts cannot be ranked" in text
    assert (tmp_path / f"{run_id}_best_1.py").read_text() == MARKED % 1024 + "x = 1\n"


def test_progress_line_names_the_pick_and_the_time_left():
    from agent.progress import ProgressView, shorten

    out = io.StringIO()
    clock = iter([100.0, 130.0, 160.0, 175.0])
    view = ProgressView(4, Output(file=out), clock=lambda: next(clock))
    progress = {"attempts": 1, "best_number": 1, "best_speedup": None, "best_sol": None}
    event = {"kind": "attempt", "branch": 0, "number": 1, "verdict": "incorrect", "language": "triton", "source": "",
             "speedup_eager": None, "sol_fraction": None, "reasons": ["word " * 40], "progress": progress,
             "left": {"attempts": 3, "cost_usd": 0.5},
             "pick": {"parent": 4, "reason": "evolve: the island's best", "island": 1, "cell": "triton/memory/2"}}
    view(event)
    view({**event, "number": 2, "progress": {**progress, "attempts": 2}, "left": {"attempts": 2, "seconds": 100.0},
          "pick": {"parent": 1, "reason": "refine: the run's best, attempt #1", "island": None, "cell": None}})
    view({**event, "number": 3, "progress": {**progress, "attempts": 3}, "left": {"attempts": 1, "seconds": 10.0},
          "pick": None})
    first, second, third = out.getvalue().splitlines()
    assert first.startswith("#1 (branch 0, from #4 island 1 cell triton/memory/2) triton: incorrect (word word")
    # no estimate from the first attempt (it paid the start-up); then the pace since it, bounded by the time left
    assert first.endswith("word...) | best #1 (untimed: no GPU to rank by) | 1/4 attempts, 30 s elapsed; "
                          "$0.50 left")
    assert second.startswith("#2 (branch 0) triton: incorrect")
    assert second.endswith("| 2/4 attempts, 1 min elapsed, ~1 min left")
    assert third.endswith("| 3/4 attempts, 1 min 15 s elapsed, ~10 s left")
    assert shorten("a bb ccc dddd", 9) == "a bb..." and shorten("abcdefghijkl", 6) == "abc..."


def test_replay_is_reverify_s_hidden_old_name_for_one_release(tmp_path):
    listed = cli("-h", env={"COLUMNS": "80"}).output
    assert "│ reverify " in listed and "│ replay " not in listed
    assert "Formerly `kloop replay`" in cli("reverify", "-h").output
    missing = tmp_path / "none.db"
    assert one_line_error(cli("replay", "abc", "--db", missing)) == one_line_error(cli("reverify", "abc", "--db", missing))


COMMANDS = ["eval", "targets", "optimize", "resume", "runs", "show", "diff", "export", "reverify", "report", "bench",
            "suite", "serve", "memory list"]


def test_help_fits_80_columns_and_keeps_brackets():
    for command in COMMANDS:
        shown = cli(*command.split(), "-h", env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
        assert shown.exit_code == 0, (command, shown.output)
        assert max(map(len, shown.output.splitlines())) <= 80, command
        assert "…" not in shown.output or command == "export", (command, shown.output)   # export: its own developer's
    optimize = cli("optimize", "--help", env={"COLUMNS": "80"}).output
    assert "pip install -e '.[ray]'" in optimize
    assert [panel for panel in ("Budget and stop rules", "Policy and model", "Search and memory", "Evaluator")
            if f"─ {panel} ─" in optimize] == ["Budget and stop rules", "Policy and model", "Search and memory",
                                                "Evaluator"]
    version = cli("--version")
    assert version.exit_code == 0 and version.output.startswith("kloop ")


def test_scratch_folders_of_dead_processes_are_removed_at_the_next_start(tmp_path, monkeypatch):
    from agent import run as runs
    from sandbox.evaluate import Session

    monkeypatch.setenv("KLOOP_SCRATCH", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed_session = tmp_path / "kloop-session-aaaaaaaa"
    (killed_session / "best-3").mkdir(parents=True)
    (killed_session / runs.SCRATCH_OWNER).write_text(json.dumps(runs.owner_record(dead.pid) | {"started": "1"}))
    unclaimed = tmp_path / "kloop-session-bbbbbbbb"   # made by a caller that never claimed it: left alone
    unclaimed.mkdir()
    killed_child = tmp_path / "kloop-cccccccc"         # a planner's folder whose planner is gone
    killed_child.mkdir()
    (killed_child / "stdout.txt").write_text("")
    (tmp_path / "kloop-gpu-users").mkdir()
    with Session(spares=1) as session:                 # a live session: its folder and its warm planner's stay
        runs.claim_scratch(session.directory)
        with session.pool._lock:
            session.pool.refill()
        session.pool._idle[0].wait_ready(120)
        assert runs.clean_scratch() == [killed_session]   # the child's folder is too recent to judge yet
        monkeypatch.setattr(runs, "IDLE_CHILD_S", 0.0)
        live = sorted(p.name for p in tmp_path.iterdir())
        assert runs.clean_scratch() == [killed_child]
        assert sorted(p.name for p in tmp_path.iterdir()) == [n for n in live if n != killed_child.name]
        assert session.directory.exists() and unclaimed.exists() and (tmp_path / "kloop-gpu-users").exists()
        assert any(runs.CHILD_FOLDER.fullmatch(p.name) for p in tmp_path.iterdir()), "the warm planner's folder"


def test_targets_file_shows_the_shapes_kloop_derived():
    shown = cli("targets", REPO / "tests/targets/tiny_add.py")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == "tiny_add"
    assert lines[1].startswith("  on a GPU: main shape N=1000; 2 hidden variants (")
    assert lines[2].startswith("  on the CPU (Triton interpreter): main shape N=1000; 2 hidden variants (")
    assert one_line_error(cli("targets", "nope.py")).startswith("error: unknown target 'nope.py'")


def test_a_suite_line_says_time_spent_and_left(monkeypatch):
    from agent import cmd_suite

    out = io.StringIO()
    monkeypatch.setattr(cmd_suite, "console", Output(file=out))
    clock = iter([0.0, 0.0, 120.0, 300.0])
    view = cmd_suite.SuiteView(type("Plan", (), {"max_attempts": 4}), clock=lambda: next(clock))
    problem = {"kind": "problem", "index": 0, "total": 3, "problem": "level1/1_op.py", "strategy": "refine",
               "done": 0, "left": 3, "verified": 0, "timed": False}
    view(problem)
    view({"kind": "problem_done", "problem": "level1/1_op.py", "best": None, "status": "finished"})
    view({**problem, "index": 1, "done": 1, "left": 2})
    first, _, second = out.getvalue().splitlines()
    assert first.endswith("| fast_1 untimed | 2 min elapsed")
    assert second.endswith("| fast_1 untimed | 5 min elapsed, ~10 min left")


def test_a_suite_line_says_which_speedups_a_verified_kernel_has(monkeypatch):
    # a timed best kernel without a speedup (a degenerate target: level 2's 80 outputs zeros) stopped a suite
    from agent import cmd_suite

    out = io.StringIO()
    monkeypatch.setattr(cmd_suite, "console", Output(file=out))
    view = cmd_suite.SuiteView(type("Plan", (), {"max_attempts": 3}), clock=lambda: 0.0)
    for eager, compiled in ((1.5, 0.75), (None, 0.75), (None, None)):
        best = {"number": 2, "timed": True, "speedup_eager": eager, "speedup_compile": compiled, "sol_fraction": None}
        view({"kind": "problem_done", "problem": "level2/17_op.py", "best": best, "status": "done"})
    assert [line.strip() for line in out.getvalue().splitlines()] == [
        "-> level2/17_op.py: verified (attempt 2): 1.50x eager, 0.75x torch.compile",
        "-> level2/17_op.py: verified (attempt 2): 0.75x torch.compile",
        "-> level2/17_op.py: verified (attempt 2): no speedup recorded"]
