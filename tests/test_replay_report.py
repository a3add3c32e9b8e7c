"""kloop report and kloop reverify over databases built through the store API."""
from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agent import cmd_data
from test_export import GPU, attempt_columns, kernel, make_offline_run, timing  # noqa: F401  (shared builders)
import evaluated
from agent.reverify import compare
from tools.records.report import NO_TIMING_NOTE, NO_TIMING_SENTENCE, leaderboard, progress_figure, roofline_figure
from tools.result import VsBest
from tools.records.store import attempt_columns as store_columns
from tools.records.store import Attempt, open_db


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("report")(cmd_data.report_command)
    app.command("reverify")(cmd_data.reverify_command)
    return app


def db_with_run(path, timed: bool) -> str:
    store = open_db(path)
    run_id = make_offline_run(store, timed=timed)
    store.close()
    return run_id


def is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


@pytest.mark.parametrize("timed", [True, False], ids=["gpu-timed", "cpu-untimed"])
def test_report_writes_plots_and_summary(tmp_path, timed):
    db = tmp_path / "kloop.db"
    run_id = db_with_run(db, timed)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli(), ["report", run_id, "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert is_png(out / "progress.png") and (out / "roofline.png").exists() == timed   # no empty roofline frame
    if timed:
        assert is_png(out / "roofline.png")
    text = (out / "report.md").read_text()
    assert f"# kloop run {run_id}: vector_add" in text
    assert "## Best kernel: attempt 4 (triton)" in text and kernel(1024) in text
    assert "| add_kernel | triton | 32 |" in text                 # resources table of the best kernel
    assert "![progress](progress.png)" in text and ("![roofline](roofline.png)" in text) == timed
    assert (NO_TIMING_SENTENCE in text) != timed
    assert text.index("## Best kernel") < text.index("## Attempts") < text.index("## Run settings") < \
        text.index("Settings:\n```json")   # results first, the settings JSON last
    attempts_part = text.split("## Attempts")[1].split("## Run settings")[0]
    attempt_rows = [line for line in attempts_part.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[5].strip() for row in attempt_rows] == [
        "compile_error", "incorrect", "correct", "correct", "correct", "correct", "rejected"]
    if timed:
        assert "ncu:" in text and "dram_pct" in text and "| 15 | 2 | 1.6 |" in attempt_rows[3]
    else:
        assert "| – | – | – |" in attempt_rows[3] and "ncu:" not in text


def texts(figure) -> list[str]:
    return [t.get_text() for ax in figure.axes for t in ax.texts]


def tick_labels(axis) -> list[str]:
    axis.figure.canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_untimed_plots_say_why(tmp_path):
    """No timing: verdicts per attempt, a title that says why, and no speedup drawn at 0; no roofline at all."""
    store = open_db(tmp_path / "kloop.db")
    attempts = store.attempts(make_offline_run(store, timed=False))
    (ax,) = progress_figure(attempts, "vector_add").axes
    assert ax.get_title() == f"vector_add: verdict per attempt\n({NO_TIMING_NOTE})"
    assert tick_labels(ax.yaxis) == ["correct", "incorrect", "compile_error", "rejected"]
    assert roofline_figure(attempts, None) is None


def test_progress_has_the_target_and_a_best_so_far_line(tmp_path):
    store = open_db(tmp_path / "kloop.db")
    attempts = store.attempts(make_offline_run(store, timed=True))
    figure = progress_figure(attempts, "vector_add", GPU["name"], target_sol=0.9)
    assert figure.get_suptitle() == f"vector_add: progress per attempt on {GPU['name']}"
    eager, _compile, sol = figure.axes
    best = next(line for line in eager.lines if line.get_label() == "best so far")
    # attempts 1, 2 failed; 3: 1.2x, 4: 2x (best from then on), 5: 1.94x, 6 (branch 1): 1.5x, 7 rejected
    assert list(best.get_xdata()) == [3, 4, 5, 6, 7] and list(best.get_ydata()) == pytest.approx([1.2, 2, 2, 2, 2])
    failed = next(line for line in eager.lines if line.get_label() == "failed (no speedup)")
    assert list(failed.get_xdata()) == [1, 2, 7] and list(failed.get_ydata()) == [0.03] * 3   # axes fraction
    low, high = eager.get_ylim()   # the crosses sit in a band below every speedup drawn, not at 0x
    assert low + 0.03 * (high - low) < 1.2 - 0.1 * (high - low)
    assert "stop at 90%" in [line.get_label() for line in sol.lines] and "20%" in tick_labels(sol.yaxis)
    assert [ax.get_ylabel() for ax in figure.axes] == ["speedup vs eager (x)", "speedup vs torch.compile (x)",
                                                       "speed of light reached"]


def test_roofline_is_intensity_against_flops_under_two_roofs(tmp_path):
    store = open_db(tmp_path / "kloop.db")
    attempts = store.attempts(make_offline_run(store, timed=True))
    figure = roofline_figure(attempts, GPU["name"], "vector_add")
    (ax,) = figure.axes
    assert ax.get_title() == f"vector_add: roofline on {GPU['name']}"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP per byte moved)" and ax.get_ylabel() == "achieved TFLOP/s"
    assert ax.get_xscale() == ax.get_yscale() == "log"
    roof = ax.lines[0]
    ridge = GPU["peak_tflops_fp32"] * 1e3 / GPU["peak_gbps"]
    assert roof.get_xdata()[1] == pytest.approx(ridge) and max(roof.get_ydata()) == pytest.approx(67.0)
    intensity = (1 << 20) / (3 * 4 * (1 << 20))
    points = ax.collections[0].get_offsets()                       # correct attempts: 25, 15, 15.5, 20 us
    assert list(points[:, 0]) == pytest.approx([intensity] * 4)
    assert sorted(points[:, 1]) == pytest.approx(sorted((1 << 20) / t / 1e6 for t in (25.0, 15.0, 15.5, 20.0)))
    labels = [h.get_label() for h in figure.legends[0].legend_handles]
    assert "best: #4, 0.0699 TFLOP/s, 25% of the roof" in labels
    assert all("×" not in t and "^" not in t for t in tick_labels(ax.yaxis) + tick_labels(ax.xaxis))
    assert "0.1" in tick_labels(ax.yaxis) and "100" in tick_labels(ax.xaxis)


def test_the_best_so_far_line_is_the_run_s_best(tmp_path):
    """The line follows the run's best as the loop chose it: a faster median that only tied with the best in the
    paired re-measurement did not take its place, so the line stays at the best's speedup."""
    store = open_db(tmp_path / "kloop.db")
    run_id = store.create_run(target_name="vector_add", policy="offline")
    tie = VsBest(best_attempt=1, ratio=1.02, ci_low=0.98, ci_high=1.06, n=30, outcome="tie")
    for median, vs_best in ((20.0, None), (19.0, tie), (15.0, None)):
        store.add_attempt(run_id, source=kernel(64), **store_columns(evaluated.result(
            "correct", median, eager_us=30.0, gpu=GPU, nbytes=1 << 20, vs_best=vs_best)))
    eager = progress_figure(store.attempts(run_id), "vector_add").axes[0]
    best = next(line for line in eager.lines if line.get_label() == "best so far")
    assert list(best.get_ydata()) == pytest.approx([1.5, 1.5, 2.0])
    assert max(eager.lines[0].get_ydata()[:2]) == pytest.approx(30 / 19)


def test_the_best_so_far_line_never_goes_down(tmp_path):
    """A new best wins by the paired re-measurement; its own measured speedup can read lower than the old best's
    (another timing round): the line keeps the highest so far."""
    store = open_db(tmp_path / "kloop.db")
    run_id = store.create_run(target_name="vector_add", policy="offline")
    faster = VsBest(best_attempt=1, ratio=0.95, ci_low=0.93, ci_high=0.97, n=30, outcome="faster")
    for median, vs_best in ((20.0, None), (21.0, faster)):
        store.add_attempt(run_id, source=kernel(64), **store_columns(evaluated.result(
            "correct", median, eager_us=30.0, gpu=GPU, nbytes=1 << 20, vs_best=vs_best)))
    eager = progress_figure(store.attempts(run_id), "vector_add").axes[0]
    best = next(line for line in eager.lines if line.get_label() == "best so far")
    assert list(best.get_ydata()) == pytest.approx([1.5, 1.5])


def test_roofline_of_an_op_without_flops_shows_bandwidth(tmp_path):
    store = open_db(tmp_path / "kloop.db")
    run_id = store.create_run(target_name="copy", policy="offline")
    for median in (20.0, 12.0):
        columns = attempt_columns("correct", kernel(64), median)
        store.add_attempt(run_id, **dict(columns, roofline={**columns["roofline"], "flops": 0}))
    figure = roofline_figure(store.attempts(run_id), GPU["name"], "copy")
    ax = figure.axes[0]
    assert ax.get_ylabel() == "achieved GB/s" and ax.get_xlabel() == "attempt" and texts(figure) == []
    assert ax.get_title().startswith("copy: achieved memory bandwidth per attempt") and "no roofline" in ax.get_title()
    achieved = sorted(ax.collections[0].get_offsets()[:, 1])
    assert achieved == pytest.approx([3 * 4 * (1 << 20) / 20.0 / 1e3, 3 * 4 * (1 << 20) / 12.0 / 1e3])
    assert ax.lines[0].get_ydata()[0] == GPU["peak_gbps"]          # the memory roof


def test_report_unknown_run_is_one_line(tmp_path):
    db = tmp_path / "kloop.db"
    db_with_run(db, timed=True)
    result = CliRunner().invoke(cli(), ["report", "nosuchid", "--db", str(db), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and result.output.strip() == f"error: no run nosuchid in {db}"
    assert not (tmp_path / "r").exists()


def test_leaderboard_best_per_target_across_databases(tmp_path):
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    db_with_run(first, timed=True)
    store = open_db(second)
    faster = store.create_run(target_name="vector_add", policy="anthropic", gpu_name=GPU["name"])
    store.update_run(faster, best_attempt_id=store.add_attempt(faster, **attempt_columns("correct", kernel(64), 10.0)))
    softmax = store.create_run(target_name="softmax", policy="offline")
    store.update_run(softmax, best_attempt_id=store.add_attempt(softmax, **attempt_columns("correct", kernel(32), None)))
    store.add_attempt(store.create_run(target_name="layernorm", policy="offline"),
                      **attempt_columns("incorrect", kernel(16), None))
    store.close()
    board = leaderboard([first, second])
    assert [(row["target"], row["run"], row["attempt"]) for row in board] == [("softmax", softmax, 1),
                                                                                ("vector_add", faster, 1)]
    assert board[1]["speedup_eager"] == pytest.approx(3.0) and board[1]["db"] == str(second)
    assert board[0]["time_us"] is None and board[0]["language"] == "triton"


HERE = Path(__file__).parent


@pytest.mark.slow   # two real evaluations in sandboxed workers: about 12 s on 2 CPU cores
def test_reverify_on_cpu_flags_disagreements(tmp_path):
    """A run logged on a GPU: attempt 1 honest, attempt 2 logged correct but subtracting. Re-verified here
    (interpreter), attempt 2 is caught and flagged; the new run is linked and keeps the numbering."""
    honest = (HERE / "candidates" / "honest_add.py").read_text()
    db = tmp_path / "kloop.db"
    store = open_db(db)
    run_id = store.create_run(target_name="tiny_add", target_source=(HERE / "targets" / "tiny_add.py").read_text(),
                              policy="offline", gpu_name=GPU["name"])
    store.update_run(run_id, best_attempt_id=store.add_attempt(run_id, **attempt_columns("correct", honest, 15.0)))
    store.add_attempt(run_id, **attempt_columns("correct", honest.replace("+ tl.load(b_ptr", "- tl.load(b_ptr"), 14.0))
    store.close()
    logged = db.read_bytes()

    out_db = tmp_path / "reverified.db"
    result = CliRunner().invoke(cli(), ["reverify", run_id, "--db", str(db), "--attempts", "all", "--out-db", str(out_db)],
                                env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "not timed (no GPU)" in result.output and "verdict correct -> incorrect" in result.output
    assert "1 disagreement" in result.output and db.read_bytes() == logged   # the database read is not written

    store = open_db(out_db, create=False)
    new_run = next(r for r in store.list_runs() if r["parent_run_id"] == run_id)
    assert new_run["parent_kind"] == "reverify" and new_run["status"] == "finished"
    new_attempts = store.attempts(new_run["id"])
    assert [(a.number, a.verdict) for a in new_attempts] == [(1, "correct"), (2, "incorrect")]
    assert new_attempts[0].time_us is None and new_attempts[0].result.executed_on == "cpu-interpreter"
    assert new_run["best_attempt_id"] == new_attempts[0].id
    store.close()


def test_reverify_compare_time_tolerance():
    def attempt(**row):
        return Attempt.from_row({"id": 1, "run_id": "r", "number": 1, **row})

    old = attempt(verdict="correct", time_us=timing(10.0))          # iqr 0.4 us
    assert compare(old, attempt(verdict="correct", time_us=timing(10.9))) == []          # within 10%
    assert compare(old, attempt(verdict="correct", time_us=timing(14.0))) == ["time 10 us -> 14 us (+40%)"]
    noisy = attempt(verdict="correct", time_us={**timing(10.0), "iqr": 1.0})
    assert compare(noisy, attempt(verdict="correct", time_us={**timing(15.0), "iqr": 1.0})) == []  # 3 x 2 us spread
    flip = compare(old, attempt(verdict="incorrect", time_us=None, result={"checks": 2},
                                reasons=["main shape, trial 3 (signed inputs): ..."]))
    assert flip == ["verdict correct -> incorrect (checks v0 -> v2: main shape, trial 3 (signed inputs): ...)"]
    # another GPU model (an H200's log re-verified on an H100): the verdict is compared, the time is not
    assert compare(old, attempt(verdict="correct", time_us=timing(14.0)), same_gpu=False) == []


def test_reverify_bad_input_is_one_line(tmp_path):
    db = tmp_path / "kloop.db"
    db_with_run(db, timed=True)
    for args in (["nosuchid"], [db_with_run(db, timed=True), "--attempts", "newest"]):
        result = CliRunner().invoke(cli(), ["reverify", *args, "--db", str(db)])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
        assert result.output.startswith("error:")


@pytest.mark.gpu
def test_reverify_times_on_gpu(tmp_path):
    """On a GPU the re-verified attempt carries real timings and speedups, and the table shows them."""
    from rich.console import Console

    from agent.reverify import NOT_TIMED, comparison_table, reverify

    honest = (HERE / "candidates" / "honest_add.py").read_text()
    db = tmp_path / "kloop.db"
    store = open_db(db)
    run_id = store.create_run(target_name="tiny_add", target_source=(HERE / "targets" / "tiny_add.py").read_text(),
                              policy="offline", gpu_name=GPU["name"])
    store.update_run(run_id, best_attempt_id=store.add_attempt(run_id, **attempt_columns("correct", honest, 15.0)))
    store.close()
    outcome = reverify(run_id, db, "best")
    new = outcome.rows[0].new
    assert outcome.new_gpu and new.verdict == "correct"
    assert new.median_us > 0 and new.speedup_eager > 0 and new.result.executed_on == "cuda"
    console = Console(width=200, record=True)
    console.print(comparison_table(outcome))
    assert NOT_TIMED not in console.export_text()


def test_reverify_names_a_flip_to_correct_by_the_checks_that_credit_it():
    old = Attempt.from_row({"id": 1, "run_id": "r", "number": 1, "verdict": "incorrect", "result": {"checks": 2},
                            "reasons": ["timed call 12: output 0: 84790061 of 260112384 elements outside ..."]})
    new = Attempt.from_row({"id": 1, "run_id": "r", "number": 1, "verdict": "correct", "result": {"checks": 3},
                            "time_us": timing(10.0)})
    assert compare(old, new)[0] == "verdict incorrect -> correct (checks v2 -> v3: passes every check)"
