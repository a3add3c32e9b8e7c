"""`kloop bench`: a real two-target run (interpreter on CPU), bad input, and the row/goal arithmetic on GPU-like data."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agent.cli import app
from tools.records import bench
from tools.result import EvalResult, Roofline, Timing
from tools.records.store import Attempt, open_db

REPO = Path(__file__).resolve().parents[1]
ROW_KEYS = {"target", "kind", "run_id", "best_attempt", "best_language", "final_verdict", "eager_us", "compile_us",
            "best_us", "speedup_eager", "speedup_compile", "sol_fraction", "achieved_gbps", "achieved_tflops",
            "copy_gbps", "copy_fraction", "cublas_tflops", "cublas_fraction", "attempts", "loop_seconds",
            "attempts_per_minute", "overhead_s_median", "beyond_compile_s_median", "device_s_median",
            "compile_s_median", "best_triton", "best_ptx"}


def run_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "results" / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), COLUMNS="220")
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "bench", *args, "--json", str(out),
                           "--db", str(tmp_path / "bench.db")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter path; test_bench_on_gpu covers a GPU")
def test_bench_two_targets_on_cpu_writes_json_table_and_goals(tmp_path):
    proc, report = run_bench(tmp_path, "--targets", "vector_add,matmul_bf16", "--max-attempts", "2",
                             "--minutes-per-target", "0.5")
    assert [r["target"] for r in report["targets"]] == ["vector_add", "matmul_bf16"]
    assert report["timing_is_real"] is False and report["gpu"] is None and report["copy_bandwidth"] is None
    assert report["settings"]["max_attempts"] == 2 and report["settings"]["minutes_per_target"] == 0.5
    assert {"torch", "triton", "python"} <= set(report["versions"]) and report["date"]
    assert set(report["geomean"]) == {"eager", "compile"}
    store = open_db(tmp_path / "bench.db", create=False)
    for row in report["targets"]:
        assert ROW_KEYS <= set(row)
        assert row["attempts"] == 2 and len(store.attempts(row["run_id"])) == 2
        assert row["best_language"] == "triton" and row["final_verdict"] == "correct"  # re-verified at the end
        assert row["best_us"] is None and row["speedup_eager"] is None  # nothing made up without a GPU
        assert row["overhead_s_median"] > 0 and row["beyond_compile_s_median"] > 0 and row["device_s_median"] > 0
    assert report["targets"][0]["best_ptx"] is None  # PTX assembles but cannot run here
    assert [g["passed"] for g in report["goals"]] == [None, None, None, None, True, None, None, None]
    # the table and the goal list on stdout, and the plain statement that no timing is real
    assert "x compile" in proc.stdout and "geomean" in proc.stdout and "matmul_bf16" in proc.stdout
    assert "goals:" in proc.stdout and "PASS" in proc.stdout
    assert "no timing is real" in proc.stdout


@pytest.mark.gpu
def test_bench_on_gpu_measures_ceiling_and_speedups(tmp_path):
    proc, report = run_bench(tmp_path, "--targets", "vector_add", "--max-attempts", "3")
    copy, row = report["copy_bandwidth"], report["targets"][0]
    assert report["timing_is_real"] and report["gpu"]["name"]
    assert 100 < copy["gbps"] <= report["gpu"]["peak_gbps"] * 1.05
    assert row["eager_us"] > 0 and row["compile_us"] > 0 and row["best_us"] > 0
    assert row["speedup_eager"] == pytest.approx(row["eager_us"] / row["best_us"], rel=1e-6)
    assert 0 < row["copy_fraction"] == pytest.approx(row["achieved_gbps"] / copy["gbps"])
    # every goal about the targets benched is decided; the others (the matmuls') say there is no such target
    undecided = {g["goal"]: g["detail"] for g in report["goals"] if g["passed"] is None}
    assert all(detail == "no such target in this bench" for detail in undecided.values()), undecided
    assert "no timing is real" not in proc.stdout


@pytest.mark.gpu
def test_cublas_reference_is_plausible():
    ref = bench.cublas_matmul(2048, 2048, 2048)
    assert ref["dtype"] == "bfloat16" and 1 < ref["tflops"] < 2000


@pytest.mark.parametrize("args, message", [
    (["--targets", "vector_add,nope"], "unknown target 'nope'"),
    (["--targets", "gelu,gelu"], "repeats a target"),
    (["--targets", ","], "names no target"),
    (["--minutes-per-target", "0"], "must be positive"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = CliRunner().invoke(app, ["bench", *args, "--db", str(tmp_path / "b.db")])
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b.db").exists()  # refused before any run started


def test_unwritable_json_path_is_refused_before_running(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for path in (blocker / "bench.json", tmp_path):
        result = CliRunner().invoke(app, ["bench", "--targets", "vector_add", "--json", str(path),
                                          "--db", str(tmp_path / "b.db")])
        assert result.exit_code == 2 and "--json" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b.db").exists()


# -- the arithmetic, on numbers shaped like an H200's ---------------------------------------------------------------
def attempt(number, language, verdict="correct", speedup=None, median=None, events_ms=None, wall=1.0):
    time_us = {"median": median, "events_total_ms": events_ms} if median else None
    return Attempt.from_row({"id": number, "run_id": "r", "number": number, "language": language, "verdict": verdict,
                             "speedup_eager": speedup, "time_us": time_us, "durations": {"attempt": wall}})


def final_result(best_us, eager_us, compile_us, nbytes, flops=0):
    return EvalResult(verdict="correct", language="triton", time_us=Timing(median=best_us),
                      baselines={"eager": Timing(median=eager_us), "compile": Timing(median=compile_us)},
                      speedup={"eager": eager_us / best_us, "compile": compile_us / best_us},
                      roofline=Roofline(bytes=nbytes, flops=flops, sol_fraction=0.8))


def test_rows_fractions_and_goals_from_gpu_like_numbers():
    copy = {"gbps": 4000.0}
    attempts = [attempt(1, "triton", speedup=1.5, median=200.0, events_ms=6.0, wall=2.0),
                attempt(2, "ptx", speedup=1.6, median=190.0, events_ms=5.7, wall=3.0),
                attempt(3, "ptx", verdict="incorrect", wall=0.5)]
    # 800 MB in 200 us = 4000 GB/s: exactly the copy ceiling
    fast = bench.target_row("vector_add", "r1", attempts, Attempt(id=2, run_id="r1", number=2, language="ptx"),
                            final_result(200.0, 300.0, 210.0, 800_000_000), 6.0, copy, None)
    assert fast["achieved_gbps"] == pytest.approx(4000) and fast["copy_fraction"] == pytest.approx(1.0)
    assert fast["best_triton"] == {"attempt": 1, "time_us": 200.0, "speedup_eager": 1.5}
    assert fast["best_ptx"]["attempt"] == 2 and fast["best_attempt"] == 2
    assert fast["overhead_s_median"] == pytest.approx(1.994)   # median of 1.994, 2.9943, 0.5
    assert fast["attempts_per_minute"] == pytest.approx(30.0)
    # 2*4096^3 flops in 250 us = 550 TFLOP/s against a 700 TFLOP/s cuBLAS: 79%
    mm = bench.target_row("matmul_bf16", "r2", attempts[:1], Attempt(id=1, run_id="r2", number=1, language="triton"),
                          final_result(250.0, 260.0, 240.0, 10**8, 2 * 4096**3), 30.0, copy, {"tflops": 700.0})
    assert mm["copy_fraction"] is None and mm["cublas_fraction"] == pytest.approx(2 * 4096**3 / 250e6 / 700)
    copy_goal, compile_goal, geomean_goal, cublas_goal, minutes_goal, rate_goal, fused_goal, count_goal = \
        bench.goals([fast, mm], 0.1, True)
    assert copy_goal["passed"] is True and "vector_add 100%" in copy_goal["detail"]
    assert compile_goal["passed"] is False and "matmul_bf16 0.96x" in compile_goal["detail"]
    assert geomean_goal["passed"] is True and geomean_goal["detail"] == "1.25x"   # sqrt(1.5 * 1.04)
    assert cublas_goal["passed"] is False and "79%" in cublas_goal["detail"]
    assert minutes_goal["passed"] is False and "matmul_bf16 30 s" in minutes_goal["detail"]  # 0.1 min = 6 s
    assert rate_goal["passed"] is True and "matmul" not in rate_goal["detail"]  # small targets only
    assert fused_goal["passed"] is None          # no matmul_bias_relu in this bench
    assert count_goal["passed"] is False and count_goal["detail"] == "matmul_bf16 1"


def test_goals_without_a_result_fail_rather_than_pass():
    empty = bench.target_row("softmax", "r3", [attempt(1, "triton", verdict="incorrect")], None, None, 5.0,
                             {"gbps": 4000.0}, None)
    assert empty["best_us"] is None and empty["best_triton"] is None and empty["attempts"] == 1
    copy_goal, compile_goal, geomean_goal, cublas_goal, *_ = bench.goals([empty], 1.0, True)
    assert copy_goal["passed"] is False and "no result" in copy_goal["detail"]
    assert compile_goal["passed"] is False and geomean_goal["passed"] is False
    assert cublas_goal["passed"] is None    # no matmul target in this bench


def test_matmul_shape_reads_the_main_shape():
    from tools.target import load_target

    target = load_target("matmul_bias_relu")
    assert bench.matmul_shape(target, small=False) == (4096, 4096, 4096)
    assert bench.matmul_shape(target, small=True) == (64, 48, 80)
    assert target.module.M == 4096   # the overrides are undone


def test_sass_evidence_counts_hopper_instructions_of_each_languages_best(tmp_path):
    import dataclasses

    import evaluated
    from tools.records.store import attempt_columns

    wgmma_tma = "HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4] ;\nUTMALDG.2D [UR8], [UR10] ;\nUTMALDG.2D [UR8], [UR12] ;\n" \
                "UTMASTG.2D [UR6], [UR14] ;\n// HGMMA in a comment is a mention, not an instruction"
    cp_async = "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4] ;\nLDGSTS.E.BYPASS.128 [R3], desc[UR8][R4.64] ;\n"
    store = open_db(tmp_path / "runs.db")
    run_id = store.create_run(target_name="matmul_bf16", policy="offline")
    for language, us, sass in (("triton", 1400.0, "LDG.E R2, [R4] ;"), ("triton", 1380.0, wgmma_tma),
                               ("ptx", 1550.0, cp_async), ("ptx", 90.0, "")):
        r = dataclasses.replace(evaluated.result("correct", us, eager_us=1390.0, gpu=evaluated.H200, language=language),
                                sass={"matmul_kernel": sass})
        if us == 90.0:   # the fastest PTX attempt was wrong: it is no evidence
            r = evaluated.result("incorrect", language="ptx", sass={"matmul_kernel": sass})
        store.add_attempt(run_id, source=f"# {language} {us}", **attempt_columns(r))
    store.close()
    out = tmp_path / "sass.json"
    proc = subprocess.run([sys.executable, str(REPO / "tests/experiments/sass_evidence.py"), str(tmp_path / "runs.db"),
                           "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {row["language"]: row for row in json.loads(out.read_text())}
    assert rows["triton"]["attempt"] == 2 and rows["triton"]["median_us"] == 1380.0
    assert {k: v for k, v in rows["triton"]["sass_ops"]["matmul_kernel"].items() if v} == \
        {"HGMMA": 1, "UTMALDG": 2, "UTMASTG": 1}
    assert rows["ptx"]["attempt"] == 3
    assert {k: v for k, v in rows["ptx"]["sass_ops"]["matmul_kernel"].items() if v} == {"HGMMA": 1, "LDGSTS": 1}
    assert "best triton #2 1380.0 us  matmul_kernel: HGMMA=1 UTMALDG=2 UTMASTG=1" in proc.stdout

    bad = subprocess.run([sys.executable, str(REPO / "tests/experiments/sass_evidence.py"), str(tmp_path / "none.db")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:")
