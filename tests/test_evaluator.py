"""The evaluator's promise, one adversarial candidate per rule: never credit a cheat, never refuse an honest kernel.

Runs on CPU (Triton interpreter). Some candidates break the static rules on purpose; the tests marked
`rules_bypassed` switch those rules off to show the run-time defences hold on their own.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.pool import WorkerPool
from tools import rules
from tools.evaluate import VERDICTS, EvalSettings, evaluate
from tools.target import TargetError, load_target

from conftest import HAS_GPU

HERE = Path(__file__).parent
CANDIDATES = HERE / "candidates"
REPO = HERE.parent


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(spares=1) as p:
        yield p


@pytest.fixture(scope="module")
def tiny():
    return load_target(str(HERE / "targets" / "tiny_add.py"))


def judge(target, name, pool, **settings):
    source = (CANDIDATES / f"{name}.py").read_text()
    return evaluate(target, source, EvalSettings(**settings), pool)


@pytest.fixture
def rules_bypassed(monkeypatch):
    monkeypatch.setattr(rules, "check_source", lambda source: [])


def test_honest_kernel_is_credited(tiny, pool):
    r = judge(tiny, "honest_add", pool)
    assert r["verdict"] == "correct", r["reasons"]
    assert r["correctness"]["trials"] >= 5 and r["correctness"]["max_abs_err"] <= 1e-6
    if HAS_GPU:
        assert r["executed_on"] == "cuda" and r["time_us"]["n"] >= 30 and r["speedup"]["eager"] > 0
    else:
        assert r["executed_on"] == "cpu-interpreter" and r["time_us"] is None and "no timing is real" in r["timing_note"]
    assert r["resources"][0]["kernel"] == "add_kernel"


@pytest.mark.parametrize("name, verdict, why", [
    ("torch_compute", "rejected", "PyTorch ops"),
    ("defined_not_launched", "rejected", "PyTorch ops"),
    ("launch_then_torch", "rejected", "aten.add"),
    ("fallback", "rejected", "fallback to PyTorch"),
    ("patch_checker", "rejected", "patches an imported module"),
    ("fake_json_exit", "rejected", "import of os"),
    ("escapes_numpy", "rejected", ".numpy"),
    ("python_compute", "rejected", "_local_scalar_dense"),
    ("cache_output", "incorrect", "elements outside"),
    ("first_call_only", "incorrect", "elements outside"),
    ("writes_into_input", "incorrect", "aliases input 0"),
    ("mutates_input", "incorrect", "input 1 was modified"),
    ("leftover_memory", "incorrect", "output 0"),
    ("wrong_dtype", "incorrect", "dtype torch.float64"),
    ("subclass_output", "incorrect", "not exactly torch.Tensor"),
    ("compile_error", "compile_error", "undefined_name"),
    ("syntax_error", "compile_error", "syntax error at line 3"),
])
def test_cheats_and_breakage_are_never_credited(tiny, pool, name, verdict, why):
    r = judge(tiny, name, pool)
    assert r["verdict"] == verdict, (r["verdict"], r["reasons"])
    assert any(why in reason for reason in r["reasons"]), r["reasons"]


def test_hang_is_killed_with_its_process_group(tiny, pool):
    start = time.monotonic()
    r = judge(tiny, "hang", pool, load_timeout_s=8)
    assert r["verdict"] == "timeout" and "killed" in r["reasons"][0]
    assert time.monotonic() - start < 30


def test_exit_midway_is_a_runtime_error_and_the_next_candidate_is_fine(tiny, pool, rules_bypassed):
    r = judge(tiny, "fake_json_exit", pool)
    assert r["verdict"] == "runtime_error" and "exited with code 0" in r["reasons"][0]
    assert '"verdict": "correct"' in r["stdout"]  # stored, never believed
    assert judge(tiny, "honest_add", pool)["verdict"] == "correct"


def test_segfault_is_contained(tiny, pool, rules_bypassed):
    r = judge(tiny, "segfault", pool)
    assert r["verdict"] == "runtime_error" and "SIGSEGV" in r["reasons"][0]
    assert judge(tiny, "honest_add", pool)["verdict"] == "correct"


def test_no_secret_reaches_the_candidate(tiny, rules_bypassed, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-real")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with WorkerPool(spares=0) as fresh:  # started after the keys were set
        r = judge(tiny, "reads_secrets", fresh)
    assert r["verdict"] == "correct", r["reasons"]


def test_hidden_variants_are_checked(pool):
    # The built-in vector_add has awkward hidden sizes; a kernel that ignores the mask's tail must fail on them.
    target = load_target("vector_add")
    source = (CANDIDATES / "honest_add.py").read_text()
    assert evaluate(target, source, EvalSettings(), pool)["correctness"]["shapes"] >= 3
    no_mask = source.replace("mask=mask", "mask=offs < (n // 4) * 4")
    r = evaluate(target, no_mask, EvalSettings(), pool)
    assert r["verdict"] == "incorrect" and "hidden variant" in r["reasons"][0]


def test_broken_targets_get_one_clear_line(tmp_path):
    with pytest.raises(TargetError, match="unknown target"):
        load_target("no_such_target")
    with pytest.raises(TargetError, match="has no Model"):
        load_target(str(HERE / "targets" / "no_model.py"))


def kloop(*args, env=None):
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **(env or {})), timeout=300)


def test_cli_eval_json_is_one_object():
    done = kloop("eval", str(HERE / "targets" / "tiny_add.py"), str(CANDIDATES / "honest_add.py"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] in VERDICTS and result["verdict"] == "correct"
    assert isinstance(result["reasons"], list) and "speedup" in result and "roofline" in result


def test_cli_eval_bad_input_is_one_line():
    done = kloop("eval", str(HERE / "targets" / "broken_inputs.py"), str(CANDIDATES / "honest_add.py"))
    assert done.returncode == 2 and "no inputs today" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = kloop("eval", "vector_add", "missing.py")
    assert done.returncode == 2 and "no candidate file" in done.stderr



@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cache_by_pointer", "lazy_when_timed"])
def test_cheating_only_while_timed_is_caught(tiny, pool, name):
    r = judge(tiny, name, pool)
    assert r["verdict"] in ("incorrect", "rejected") and r["time_us"] is None, (r["verdict"], r["reasons"])


@pytest.mark.gpu
def test_illegal_address_is_contained_and_the_gpu_stays_usable(tiny, pool):
    r = judge(tiny, "out_of_bounds", pool)
    assert r["verdict"] == "runtime_error", r["reasons"]
    assert judge(tiny, "honest_add", pool)["verdict"] == "correct"


def test_ptx_candidate_is_assembled_everywhere_and_run_where_there_is_a_gpu(pool):
    source = (REPO / "agent" / "kernels" / "vector_add" / "ptx_vec4.py").read_text()
    r = evaluate(load_target("vector_add"), source, EvalSettings(baselines=("eager",)), pool)
    assert r["language"] == "ptx" and r["resources"][0]["registers"] > 0 and "sm_90" in r["sass"]["vector_add"]
    assert ".entry vector_add" in r["ptx"]["vector_add"]
    if HAS_GPU:
        assert r["verdict"] == "correct" and r["time_us"]["median"] > 0 and r["resources"][0]["occupancy"] > 0
    else:
        assert r["verdict"] == "runtime_error" and r["reasons"][0].startswith("not run") and r["time_us"] is None
        assert "assembled for sm_90" in r["timing_note"]


def test_summary_shows_timings_roofline_and_nsight_counters(capsys):
    from agent.cmd_eval import console, print_summary

    timing = {"median": 136.6, "iqr": 0.9}
    result = {"verdict": "correct", "language": "ptx", "executed_on": "cuda", "reasons": [],
              "correctness": {"trials": 9, "shapes": 3, "max_abs_err": 4.8e-7}, "time_us": timing,
              "baselines": {"eager": {"median": 129.9, "iqr": 1.2}, "compile": {"median": 129.7}},
              "speedup": {"eager": 0.95, "compile": 0.95}, "timing_note": None, "flags": ["throttled"],
              "roofline": {"sol_us": 111.5, "bound": "memory", "sol_fraction": 0.82},
              "resources": [{"kernel": "gelu", "registers": 32, "spills": 0, "occupancy": 1.0}],
              "ncu": {"gelu": {"gpu_time_us": 127.4, "dram_pct": 83.7, "sm_pct": 44.5, "achieved_occupancy_pct": 82.5,
                               "l2_hit_pct": 50.4, "top_stalls": [["long_scoreboard", 24.5], ["wait", 1.1]]}}}
    with console.capture() as captured:
        print_summary(result)
    text = captured.get()
    assert "136.60" in text and "derived from eager" in text and "reached 82%" in text and "registers=32" in text
    assert "ncu gelu: 127.4 us, DRAM 84%" in text and "long_scoreboard 24.5" in text and "flags: throttled" in text
