"""The evaluator's promise, one hostile candidate per attack class: never credit a cheat, never refuse an honest
kernel, never let a candidate break, hang or read the trusted side.

Runs on CPU (Triton interpreter) and, for the tests marked gpu, on a GPU. Some candidates break the static rules
on purpose; the tests that use `rules_bypassed` switch those rules off to show the design holds without them: the
candidate's Python only plans, trusted code runs the plan on its own inputs and compares.
"""
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sandbox import jail
from sandbox.evaluate import EvalSettings, Session, evaluate
from sandbox.stages.timing import paired_ratio
from tools import rules
from tools.inputs import FAMILIES
from tools.result import VERDICTS
from tools.target import TargetError, load_target

from conftest import HAS_GPU

# The adversarial suite runs on both: a GPU run (-m 'gpu or device') judges every attack and honest kind there too.
pytestmark = pytest.mark.device

HERE = Path(__file__).parent
CANDIDATES = HERE / "candidates"
TARGETS = HERE / "targets"
REPO = HERE.parent


@pytest.fixture(scope="module")
def session():
    with Session(spares=1) as s:
        yield s


@pytest.fixture(scope="module")
def tiny():
    return load_target(str(TARGETS / "tiny_add.py"))


def judge(target, name, session, **settings):
    settings.setdefault("baselines", ("eager",))  # torch.compile's autotuning would cost minutes on a GPU
    return evaluate(target, (CANDIDATES / f"{name}.py").read_text(), EvalSettings(**settings), session)


def judge_source(target, source, session):
    return evaluate(target, source, EvalSettings(baselines=("eager",)), session)


@pytest.fixture
def rules_bypassed(monkeypatch):
    monkeypatch.setattr(rules, "check_source", lambda source: [])


def text_of(result) -> str:
    return json.dumps(result.to_dict(), default=str)


@pytest.mark.parametrize("target, name", [
    ("tiny_add", "honest_add"),
    ("tiny_add", "honest_global"),
    ("tiny_add", "honest_autotune"),
    ("tiny_gelu", "honest_libdevice"),
    ("tiny_layernorm", "honest_layernorm_split"),
    ("tiny_linear", "honest_linear"),
    ("tiny_scale2d", "honest_tma_desc"),
    ("kb_two_outputs", "honest_one_buffer_two_outputs"),
    ("kb_naive_variance", "honest_two_pass_variance"),   # more exact than the reference: judged against float64
    ("tiny_add", "honest_docstring"),
    ("kb_positive_mask", "honest_positive_mask"),
    ("kb_erfinv", "honest_libdevice_chain"),
    ("tiny_gelu", "honest_jit_constexpr"),
    ("tiny_add", "honest_inf_constant"),
    ("tiny_layernorm", "honest_layernorm_rows"),   # eps.to(tl.float32), (row < n_rows) & (cols < n_cols)
    ("tiny_add", "honest_cuda_checks"),            # asserts is_cuda: the CPU planner answers as an H100
])
def test_honest_kernels_of_every_kind_are_credited(session, target, name):
    r = judge(load_target(str(TARGETS / f"{target}.py")), name, session)
    assert r.verdict == "correct", r.reasons
    assert r.correctness.trials >= 5 + 2 and r.correctness.shapes >= 2 and r.correctness.max_abs_err < 1e-3
    if HAS_GPU:
        assert r.executed_on == "cuda" and r.time_us.n >= 30 and r.speedup_over("eager") > 0
        assert r.sass and all("Function" in listing for listing in r.sass.values())   # disassembled beside the run
    else:
        assert r.executed_on == "cpu-interpreter" and r.time_us is None and "no timing is real" in r.timing_note
    assert r.resources and r.resources[0].launches >= 1


def test_a_second_evaluation_with_another_seed_gets_a_reference_with_its_own_weights(session):
    # Weights come from the evaluation's secret seed. The referee kept one reference model per shape, so a later
    # evaluation of the same target with another seed (a bench's final re-time, a suite's second strategy, every
    # `kloop serve` request) compared an honest kernel with the first one's weights: "incorrect" (layernorm and
    # rmsnorm's final re-time on an H100).
    target = load_target(str(TARGETS / "tiny_linear.py"))
    for seed in (1, 2, 1):
        r = judge(target, "honest_linear", session, seed=seed)
        assert r.verdict == "correct", (seed, r.reasons)


def test_a_weight_larger_than_the_jails_file_limit_travels_in_parts(tmp_path):
    """KernelBench's 55_Matmul_MaxPool_Sum_Scale holds a 4 GiB weight; the jail lets a file grow to 2 GiB. Here the
    same, scaled down: a 512 KiB weight, files limited to 256 KiB. The planner writes the snapshot in parts."""
    source = (TARGETS / "tiny_linear.py").read_text().replace("in_features = 48", "in_features = 512") \
        .replace("out_features = 40", "out_features = 256")
    (tmp_path / "wide_linear.py").write_text(source)
    target = load_target(str(tmp_path / "wide_linear.py"))
    with Session(spares=0) as small:
        small.pool.limits = jail.Limits(file_bytes=256 << 10)   # before any planner starts
        r = judge(target, "honest_linear", small)
    assert r.verdict == "correct", r.reasons
    assert r.correctness.max_abs_err < 1e-3


@pytest.mark.parametrize("name, verdict, why", [
    ("torch_compute", "rejected", "PyTorch ops"),
    ("defined_not_launched", "rejected", "PyTorch ops"),
    ("launch_then_torch", "rejected", "aten.add"),
    ("grid_torch", "rejected", "aten.add"),
    ("python_compute", "rejected", "host"),
    ("lazy_when_timed", "rejected", "different work on different calls"),
    ("fallback", "rejected", "fallback to PyTorch"),
    ("patch_checker", "rejected", "patches an imported module"),
    ("thread_torch", "rejected", "threading"),
    ("numpy_array", "rejected", "numpy"),
    ("equal_patch", "rejected", "update_wrapper"),
    ("forged_replies", "rejected", "module os"),
    ("probes_host", "rejected", "module os"),
    ("cache_output", "incorrect", "outlives the call"),
    ("cache_by_pointer", "incorrect", "outlives the call"),
    ("first_call_only", "incorrect", "NaN positions differ"),
    ("leftover_memory", "incorrect", "NaN positions differ"),
    ("writes_into_input", "incorrect", "aliases input 0"),
    ("mutates_input", "incorrect", "input 1 was modified"),
    ("wrong_dtype", "incorrect", "dtype float64"),
    ("subclass_output", "incorrect", "not exactly torch.Tensor"),
    ("docstring_def", "incorrect", "NaN positions differ"),   # its docstring's Python never runs
    ("compile_error", "compile_error", "undefined_name"),
    ("syntax_error", "compile_error", "syntax error at line 3"),
])
def test_cheats_and_breakage_are_never_credited(tiny, session, name, verdict, why):
    r = judge(tiny, name, session)
    assert r.verdict == verdict, (r.verdict, r.reasons)
    assert any(why in reason for reason in r.reasons), r.reasons


def test_the_float64_judgement_lets_no_element_through_on_another_ones_slack(session):
    """The reference (E[x^2] - E[x]^2) is a few tolerances off the exact variance; an honest two-pass kernel passes
    against float64, but the same kernel with one row 0.35% off (2.7 tolerances: inside twice the reference's worst
    error elsewhere) does not: the slack is per element."""
    r = judge(load_target(str(TARGETS / "kb_naive_variance.py")), "variance_one_element_off", session)
    assert r.verdict == "incorrect", r.reasons
    assert "against the reference computed in float64, 1 elements are further" in r.reasons[0], r.reasons


def test_a_cancelling_sum_in_another_order_is_credited_and_in_lower_precision_is_not(session):
    """The float64 judgement allows a cancelling sum 8 times the reference's own move under a rounding step of its
    inputs: the honest reordering of that sum is credited (whether an element lands beyond the tolerance of the
    reference depends on the evaluation's secret seed: tests/test_verify.py pins one that does), the same kernel on
    TF32-cut operands is not."""
    target = load_target(str(TARGETS / "kb_cancelling_sum.py"))
    r = judge(target, "honest_reordered_sum", session)
    assert r.verdict == "correct" and r.correctness.shapes >= 2, r.reasons
    honest = (CANDIDATES / "honest_reordered_sum.py").read_text()
    r = judge_source(target, honest.replace("\nTRUNCATE = 0 ", "\nTRUNCATE = 1 "), session)
    assert r.verdict == "incorrect", r.reasons
    assert "against the reference computed in float64" in r.reasons[0] and "move under a rounding step" in \
        r.reasons[0], r.reasons


def test_the_cpu_judges_bf16_kernels_on_their_values(session):
    """A bf16 tl.dot accumulated in fp32 and a bf16 add: the interpreter computed both on raw bit patterns."""
    r = judge(load_target(str(TARGETS / "tiny_bf16_addmm.py")), "honest_bf16_addmm", session)
    assert r.verdict == "correct" and r.correctness.shapes >= 2, r.reasons


def test_the_cpu_credits_libdevice_imported_by_name(session, rules_bypassed):
    r = judge(load_target(str(TARGETS / "tiny_gelu.py")), "liger_style_libdevice", session)
    assert r.verdict == "correct", r.reasons


@pytest.mark.parametrize("target, name, verdict, why", [
    ("tiny_gelu", "gpu_path_approximates", "incorrect", "outside atol"),     # its GPU path is the one judged
    ("tiny_tanh", "fast_tanh", "incorrect", "outside atol"),                 # tanh.approx's 2^-11, not np.tanh
    ("tiny_add", "mutates_global_list", "compile_error", "global variable CALLS"),   # Triton's compiler refuses it
])
def test_the_cpu_refuses_what_a_gpu_refuses(session, rules_bypassed, target, name, verdict, why):
    import triton.language.extra.cuda.libdevice as cuda_libdevice

    if name == "fast_tanh" and HAS_GPU and not hasattr(cuda_libdevice, "fast_tanhf"):   # CUDA's libdevice has none
        verdict, why = "compile_error", "fast_tanhf"
    r = judge(load_target(str(TARGETS / f"{target}.py")), name, session)
    assert r.verdict == verdict and any(why in reason for reason in r.reasons), (r.verdict, r.reasons)


@pytest.mark.parametrize("name, verdict, why", [
    ("thread_torch", "incorrect", "NaN positions differ"),        # the thread's work is not in the plan
    ("frames_pause", "incorrect", "outlives the call"),           # silencing the recorder changes nothing
    ("equal_patch", "incorrect", "input 1 was modified"),         # the comparison never ran in its process
    ("numpy_array", "rejected", "on the host"),
    ("escapes_numpy", "incorrect", "NaN positions differ"),        # numpy wrote into memory the executor never saw
])
def test_without_the_static_rules_cheats_still_fail(tiny, session, rules_bypassed, name, verdict, why):
    r = judge(tiny, name, session)
    if HAS_GPU and "numpy" in name:  # numpy cannot reach device memory: the call fails before any cheat
        assert r.verdict in ("rejected", "runtime_error"), (r.verdict, r.reasons)
        return
    assert r.verdict == verdict, (r.verdict, r.reasons)
    assert any(why in reason for reason in r.reasons), r.reasons


@pytest.mark.parametrize("name, why", [
    ("descriptor_past_its_buffer", "a tensor descriptor reaches 73728 bytes into input 0, which holds 18432"),
    ("descriptor_raw_address", "a tensor descriptor's base must be a tensor forward can see"),
])
def test_tensor_descriptors_reach_only_their_own_buffer(session, name, why):
    r = judge(load_target(str(TARGETS / "tiny_scale2d.py")), name, session)
    assert r.verdict == "rejected" and any(why in reason for reason in r.reasons), (r.verdict, r.reasons)


def test_forged_control_messages_never_make_a_verdict(tiny, session, rules_bypassed):
    r = judge(tiny, "forged_replies", session)
    assert r.verdict in ("runtime_error", "rejected") and len(r.reasons) == 1, (r.verdict, r.reasons)
    assert "\n" not in r.reasons[0]
    assert judge(tiny, "honest_add", session).verdict == "correct"


def test_hidden_shapes_stay_hidden(tiny, session):
    r = judge(tiny, "hidden_shapes", session)
    assert r.verdict == "runtime_error" and r.reasons == ["hidden variant 1: runtime_error"]
    assert "LEAK" not in text_of(r)
    # ... but the operator is told why (EvalResult.withheld: the attempts table's own column, never to_dict)
    assert len(r.withheld) == 1 and r.withheld[0].startswith("hidden variant 1: runtime_error: ")
    assert "ValueError: LEAK shape" in r.withheld[0]


def _processes_mentioning(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.skipif(jail.detect().mode == "none", reason="no jail here: isolation mode none keeps nothing away")
def test_the_sandbox_keeps_secrets_databases_and_stray_processes_away(tiny, rules_bypassed, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-real")
    monkeypatch.setenv("KLOOP_SCRATCH", str(tmp_path / "scratch"))
    db_path = tmp_path / "runs" / "kloop.db"
    db_path.parent.mkdir()
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE attempts (id INTEGER PRIMARY KEY, verdict TEXT)")
    db.commit()
    source = (CANDIDATES / "probes_host.py").read_text().replace("DB_PATH_PLACEHOLDER", str(db_path))
    with Session(spares=0) as fresh:  # started after the key was set
        r = evaluate(tiny, source, EvalSettings(baselines=("eager",)), fresh)
    assert r.verdict == "correct", r.reasons
    assert "sk-ant-test" not in r.stdout and "PROBE db blocked" in r.stdout, r.stdout[-2000:]
    assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 0
    time.sleep(1)
    assert _processes_mentioning(str(tmp_path / "scratch")) == []  # the double-forked grandchild died too


def test_hang_is_killed_with_everything_it_started(tiny, session):
    start = time.monotonic()
    r = judge(tiny, "hang", session, load_timeout_s=8)
    assert r.verdict == "timeout" and "killed" in r.reasons[0]
    assert time.monotonic() - start < 40


def test_a_tensor_in_a_constexpr_parameter_never_reaches_the_kernel(tiny, session):
    r = judge(tiny, "constexpr_tensor", session)
    if HAS_GPU:  # Triton's compiler takes no tensor as a constexpr: the planner fails, whichever way it says it
        assert r.verdict in ("compile_error", "runtime_error", "rejected"), (r.verdict, r.reasons)
    else:        # the interpreter would hand it over as a torch.Tensor: the executor refuses the plan
        assert r.verdict == "rejected" and "parameter A is a tl.constexpr" in r.reasons[0], r.reasons


def test_a_kernel_that_hangs_in_the_replay_costs_the_hang_limit(tiny, session):
    start = time.monotonic()
    r = judge(tiny, "hangs_in_replay", session, run_timeout_s=5, hang_timeout_s=5)
    assert r.verdict == "timeout" and r.reasons[0].startswith("round: no answer within"), r.reasons
    assert time.monotonic() - start < 60   # the first round on a shape had 600 s (its inputs' limit) before


def kloop(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, **(env or {})), timeout=300, **kwargs)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_nothing_survives_kloop_being_killed(tmp_path, sig):
    scratch = tmp_path / "scratch"
    process = subprocess.Popen([sys.executable, "-m", "agent.cli", "eval", str(TARGETS / "tiny_add.py"),
                                str(CANDIDATES / "hang.py")], cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=dict(os.environ, KLOOP_SCRATCH=str(scratch)))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any("sandbox.warm" in Path(f"/proc/{p}/cmdline").read_text()
                                                  for p in _processes_mentioning(str(scratch))):
        time.sleep(0.5)
    time.sleep(3)  # the candidate is spinning in forward now
    assert _processes_mentioning(str(scratch)), "the planner never started"
    process.send_signal(sig)
    process.wait(timeout=30)
    time.sleep(2)
    assert _processes_mentioning(str(scratch)) == []


def test_segfault_is_contained(tiny, session, rules_bypassed):
    r = judge(tiny, "segfault", session)
    assert r.verdict == "runtime_error" and "SIGSEGV" in r.reasons[0]
    assert judge(tiny, "honest_add", session).verdict == "correct"


def test_no_secret_reaches_the_candidate(tiny, rules_bypassed, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-real")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with Session(spares=0) as fresh:  # started after the keys were set
        r = judge(tiny, "reads_secrets", fresh)
    assert r.verdict == "correct", r.reasons


def test_hidden_variants_are_checked(session):
    # The built-in vector_add has awkward hidden sizes; a kernel that ignores the mask's tail must fail on them.
    target = load_target("vector_add")
    source = (CANDIDATES / "honest_add.py").read_text()
    assert judge_source(target, source, session).correctness.shapes >= 3
    no_mask = source.replace("mask=mask", "mask=offs < (n // 4) * 4")
    r = judge_source(target, no_mask, session)
    assert r.verdict == "incorrect" and r.reasons[0].startswith("hidden variant")


def test_the_reference_runs_in_training_mode_as_kernelbench_runs_it(session):
    r = judge(load_target(str(TARGETS / "kb_batchnorm.py")), "copy_input", session)
    assert r.verdict == "incorrect" and "elements outside" in r.reasons[0], r.reasons


UNARY = """import torch
import triton
import triton.language as tl


@triton.jit
def unary(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, EXPR, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        unary[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""


def test_inputs_drawn_from_0_1_are_also_tried_below_0(session):
    # ReLU on torch.rand inputs is the identity: a copy passes every trial on the target's own inputs, and is
    # caught by the input families that reach below 0 (tools/inputs.py).
    relu = load_target(str(TARGETS / "kb_relu_rand.py"))
    copy = judge_source(relu, UNARY.replace("EXPR", "x"), session)
    assert copy.verdict == "incorrect" and " inputs): " in copy.reasons[0], copy.reasons
    hardtanh = load_target(str(TARGETS / "kb_hardtanh_rand.py"))  # the identity on [-1, 1): families go wider
    assert judge_source(hardtanh, UNARY.replace("EXPR", "x"), session).verdict == "incorrect"
    honest = judge_source(relu, UNARY.replace("EXPR", "tl.maximum(x, 0.0)"), session)
    assert honest.verdict == "correct" and sorted(honest.correctness.families) == sorted(FAMILIES), honest.reasons
    # log's domain excludes negatives: there the reference is NaN, masked; all-negative inputs leave nothing to judge
    log = load_target(str(TARGETS / "kb_log_rand.py"))
    honest_log = judge_source(log, UNARY.replace("EXPR", "tl.log(x + 1e-4) * 0.5"), session)
    assert honest_log.verdict == "correct" and "signed" in honest_log.correctness.families, honest_log.reasons
    assert [s.split(":")[0] for s in honest_log.correctness.skipped] == ["negative"]
    leaky = load_target(str(TARGETS / "kb_leaky_relu.py"))
    r = judge_source(leaky, UNARY.replace("EXPR", "tl.where(x > 0, x, x * 0.01)"), session)
    assert r.verdict == "correct", r.reasons


def test_one_signed_inputs_are_tried_on_both_signs_whatever_their_range(session):
    # |randn| is non-negative but reaches past 1: ReLU is still the identity there, and the copy still caught.
    relu = load_target(str(TARGETS / "kb_relu_halfnormal.py"))
    copy = judge_source(relu, UNARY.replace("EXPR", "x"), session)
    assert copy.verdict == "incorrect" and " inputs): " in copy.reasons[0], copy.reasons
    # on rand() - 1, a non-positive draw, ReLU is 0: a kernel that writes zeros is caught the same way
    zeros = load_target(str(TARGETS / "kb_relu_nonpositive.py"))
    r = judge_source(zeros, UNARY.replace("EXPR", "x * 0.0"), session)
    assert r.verdict == "incorrect" and " inputs): " in r.reasons[0], r.reasons
    honest = judge_source(relu, UNARY.replace("EXPR", "tl.maximum(x, 0.0)"), session)
    assert honest.verdict == "correct", honest.reasons


BCE = UNARY.replace("def unary(x_ptr, out_ptr", "def unary(x_ptr, t_ptr, out_ptr").replace(
    "    x = tl.load(x_ptr + offs, mask=mask)",
    "    x = tl.load(x_ptr + offs, mask=mask, other=0.5)\n    t = tl.load(t_ptr + offs, mask=mask, other=0.0)").replace(
    "def forward(self, x):", "def forward(self, x, t):").replace("](x, out,", "](x, t, out,").replace(
    "EXPR", "-(t * tl.maximum(tl.log(x), -100.0) + (1.0 - t) * tl.maximum(tl.log(1.0 - x), -100.0))")


def test_a_reference_that_refuses_a_family_skips_it(session):
    # binary_cross_entropy raises on predictions outside [0, 1]: those families have no answer, and an honest kernel
    # is credited on the others (the 0/1 targets, whole numbers, are never mapped).
    r = judge_source(load_target(str(TARGETS / "kb_bce_rand.py")), BCE, session)
    assert r.verdict == "correct" and {"near_one", "small"} <= set(r.correctness.families), r.reasons
    assert "signed" in [s.split(":")[0] for s in r.correctness.skipped]


@pytest.mark.skipif(HAS_GPU, reason="plays the referee in this process; on a GPU it is a process of its own, and "
                    "the real device-side assert is test_a_reference_that_refuses_a_family_skips_it")
def test_a_referee_whose_cuda_context_dies_on_a_family_is_replaced(session, monkeypatch):
    # On a GPU binary_cross_entropy's refusal is a device-side assert: the referee answers fatal and exits. Here the
    # in-process referee plays that answer once; a new referee, told the shapes again, judges the rest.
    from sandbox.referee import Referee

    check, fatal = Referee.check, []

    def dies_on_signed(self, *args, family="own", **kwargs):
        if family == "signed" and len(fatal) < 2:  # the first answers before it exits; the second dies first
            fatal.append(True)
            return {"status": "ok", "reasons": [], "stats": {}, "skipped": "device-side assert", "fatal": True} \
                if len(fatal) == 1 else {"status": "error", "message": "the referee's process ended", "fatal": True}
        return check(self, *args, family=family, **kwargs)

    monkeypatch.setattr(Referee, "check", dies_on_signed)
    target, honest = load_target(str(TARGETS / "kb_relu_halfnormal.py")), UNARY.replace("EXPR", "tl.maximum(x, 0.0)")
    session.devices[0].referee()
    starts = session.devices[0].referee_starts
    for n in (1, 2):
        r = judge_source(target, honest, session)
        assert len(fatal) == n and r.verdict == "correct", r.reasons
        assert [s.split(":")[0] for s in r.correctness.skipped] == ["signed"]
        assert session.devices[0].referee_starts == starts + n


def test_a_reference_that_changes_its_input_in_place_is_no_reason_to_refuse_a_kernel(session):
    # nn.ReLU(inplace=True) changes the referee's input; ours are made again, so an honest kernel's untouched input
    # still matches them, and one that does the same in place is still caught.
    target = load_target(str(TARGETS / "kb_relu_inplace.py"))
    honest = judge_source(target, UNARY.replace("EXPR", "tl.maximum(x, 0.0)"), session)
    assert honest.verdict == "correct", honest.reasons
    in_place = UNARY.replace("EXPR", "tl.maximum(x, 0.0)").replace("out_ptr + offs", "x_ptr + offs").replace(
        "out = torch.empty_like(x)", "out = x")
    r = judge_source(target, in_place, session)
    assert r.verdict == "incorrect" and any("input 0" in reason for reason in r.reasons), r.reasons


def test_a_kernel_that_leaves_the_answer_to_the_fill_fails_one_of_the_two_fills(session):
    # 0xFF reads as True in a bool output; the trials alternate it with 0x00, where the skipped stores read False.
    r = judge(load_target(str(TARGETS / "kb_positive_mask.py")), "skips_true_stores", session)
    assert r.verdict == "incorrect" and r.reasons[0].startswith("main shape, trial 2:"), r.reasons


def test_broken_targets_get_one_clear_line():
    with pytest.raises(TargetError, match="unknown target"):
        load_target("no_such_target")
    with pytest.raises(TargetError, match="has no Model"):
        load_target(str(TARGETS / "no_model.py"))


def test_cli_eval_json_is_one_object():
    done = kloop("eval", str(TARGETS / "tiny_add.py"), str(CANDIDATES / "honest_add.py"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] in VERDICTS and result["verdict"] == "correct"
    assert isinstance(result["reasons"], list) and "speedup" in result and "roofline" in result
    assert result["isolation"].split(":")[0] in ("bwrap", "unshare", "none")


def test_cli_eval_bad_input_is_one_line():
    done = kloop("eval", str(TARGETS / "broken_inputs.py"), str(CANDIDATES / "honest_add.py"))
    assert done.returncode == 2 and "no inputs today" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = kloop("eval", "vector_add", "missing.py")
    assert done.returncode == 2 and "no candidate file" in done.stderr


def test_ptx_candidate_is_assembled_everywhere_and_run_where_there_is_a_gpu(session):
    source = (REPO / "agent" / "kernels" / "vector_add" / "ptx_vec4.py").read_text()
    r = evaluate(load_target("vector_add"), source, EvalSettings(baselines=("eager",)), session)
    assert r.language == "ptx" and r.resources[0].registers > 0
    assert ".entry vector_add" in r.ptx["vector_add"]
    if HAS_GPU:
        assert r.verdict == "correct" and r.time_us.median > 0 and r.resources[0].occupancy > 0
        assert "sm_90" in r.sass["vector_add"]
    else:
        assert r.verdict == "runtime_error" and r.reasons[0].startswith("not run") and r.time_us is None
        assert "assembled for sm_90" in r.timing_note


def test_the_sass_of_a_ptx_kernel_that_no_longer_assembles_is_left_out_without_a_traceback():
    # After the device phase the trusted side assembles each PTX kernel again for its SASS: whatever text the plan
    # carried (garbage, empty, a PTX kernel named like a Triton one) costs the listing, never the evaluation.
    from types import SimpleNamespace

    from sandbox.evaluate import Evaluation
    from tools.result import EvalResult, Resources

    result = EvalResult(gpu={"cc": "9.0"}, ptx={"garbage": ".entry garbage ( nonsense", "empty": " ",
                                                 "twin": "// Triton's PTX of a kernel of that name"},
                        resources=[Resources(kernel=k, source="ptxas") for k in ("garbage", "empty", "twin")] +
                        [Resources(kernel="twin", source="triton")])
    Evaluation._ptx_sass(SimpleNamespace(result=result))
    assert result.sass == {}


def test_a_whole_networks_ptx_comes_from_the_plan_not_through_the_executors_size_limited_reply():
    # Level 3's AlexNet and GoogleNet on an H200: 40-60 kernels' PTX echoed in the load reply passed its 1 MiB limit,
    # and every attempt was a runtime error. The reply carries each kernel's resources; the trusted side takes the
    # PTX from the plan it already holds, in the plan's kernel order.
    from types import SimpleNamespace

    from sandbox import process
    from sandbox.plan import Kernel
    from sandbox.stages.loading import Loading
    from tools.result import EvalResult

    ptx = "// " + "x" * 40_000 + "\n"
    plan = SimpleNamespace(kernels=[Kernel(kind="triton", name=f"k{i}", ptx=f"{ptx}// {i}") for i in range(60)] +
                           [Kernel(kind="interpreted", name="cpu")])
    assert sum(len(k.ptx) for k in plan.kernels) > process.MAX_REPLY
    rows = [{"kernel": k.name, "source": "triton", "launches": 1, "registers": 32} for k in plan.kernels]
    stage = SimpleNamespace(result=EvalResult())
    Loading._take_resources(stage, rows, plan)
    assert [r.kernel for r in stage.result.resources] == [k.name for k in plan.kernels]
    assert stage.result.ptx["k7"].endswith("// 7") and len(stage.result.ptx) == 60


@pytest.mark.parametrize("cuda, best_us, best_sha, factor, pruned", [
    (True, 100.0, "this", 10.0, True),     # 1500 us against a 100 us best: over 10x
    (True, 200.0, "this", 10.0, False),    # 7.5x: verified and timed as usual
    (True, 100.0, "other", 10.0, False),   # another target's best says nothing about this one
    (True, 100.0, "this", 0.0, False),     # pruning off
    (False, 100.0, "this", 10.0, False),   # the CPU interpreter's times are not real
    (True, None, "this", 10.0, False),     # no standing best yet
])
def test_a_candidate_far_slower_than_the_best_is_pruned_after_two_trials(cuda, best_us, best_sha, factor, pruned,
                                                                          tmp_path):
    from sandbox.evaluate import BestKernel, Evaluation
    from tools.result import Correctness, EvalResult

    session = Session.__new__(Session)
    session.cuda, session._best_lock, session._best_users = cuda, threading.Lock(), {}
    session.best = None if best_us is None else BestKernel(1, tmp_path, best_us, best_sha)
    evaluation = Evaluation.__new__(Evaluation)
    evaluation.session, evaluation.settings = session, EvalSettings(prune_slower_than=factor, seed=1)
    evaluation.target, evaluation.result = SimpleNamespace(sha256="this"), EvalResult()
    assert evaluation._pruned(1500.0, Correctness(trials=2)) is pruned
    if pruned:
        assert evaluation.result.verdict == "timeout" and evaluation.result.correctness.trials == 2
        assert evaluation.result.reasons == ["pruned: its first 2 main-shape calls took 1500 us or more, over 10x the "
                                             "standing best's 100 us; not verified further"]
    else:
        assert evaluation.result.verdict is None


def honest_add_as_a_misread_best(session, misread: float):
    """vector_add's honest kernel judged and adopted as the standing best, its median then multiplied by `misread`
    (a noisy timing); returns the target and the kernel's source, to be judged again against it."""
    target = load_target("vector_add")
    source = (CANDIDATES / "honest_add.py").read_text()
    with session.evaluation(target, source, EvalSettings(baselines=("eager",))) as first:
        first.assemble(), first.verify(), first.profile()
        first.adopt_as_best(1)
    session.best = dataclasses.replace(session.best, median_us=session.best.median_us * misread)
    return target, source


@pytest.mark.gpu
def test_pruning_stops_a_candidate_after_two_trials_on_a_gpu(session):
    # the best read 100x faster than it is: the same kernel is now far slower than it
    target, source = honest_add_as_a_misread_best(session, 1 / 100)
    with session.evaluation(target, source, EvalSettings(baselines=("eager",))) as again:
        again.assemble(), again.verify(), again.profile()
    session.forget_best()
    assert again.result.verdict == "timeout" and again.result.reasons[0].startswith("pruned:"), again.result.reasons
    assert again.result.correctness.trials == 2 and again.result.time_us is None


@pytest.mark.parametrize("ratios, outcome", [
    ([1.0 + 0.002 * ((-1) ** i) for i in range(30)], "tie"),
    ([1.20 + 0.01 * ((-1) ** i) for i in range(30)], "faster"),
    ([0.90 + 0.01 * ((-1) ** i) for i in range(30)], "slower"),
    ([1.3, 0.8, 1.25, 0.85] * 5, "tie"),
])
def test_a_new_best_must_win_a_paired_remeasurement(ratios, outcome):
    found = paired_ratio(ratios, best_attempt=4)
    assert found.outcome == outcome and found.n == len(ratios) and found.best_attempt == 4
    assert found.ci_low <= found.ratio <= found.ci_high


def test_summary_shows_timings_roofline_and_nsight_counters():
    import evaluated
    from agent.cmd_eval import console, print_summary
    from tools.result import Correctness, Resources

    result = evaluated.result(   # a GPU result, made as the evaluator makes one (tests/evaluated.py)
        "correct", 136.6, eager_us=129.9, compile_from_eager=0.9985, gpu=evaluated.H100, language="ptx",
        nbytes=int(0.82 * 136.6 * 3352e3), flops=0, flags=["throttled"],
        correctness=Correctness(trials=9, shapes=3, max_abs_err=4.8e-7),
        resources=[Resources(kernel="gelu", source="ptxas", registers=32, spills=0, occupancy=1.0)],
        ncu=evaluated.counters("gelu", gpu_time_us=127.4, dram_pct=83.7, sm_pct=44.5, achieved_occupancy_pct=82.5,
                               l2_hit_pct=50.4, stalls={"long_scoreboard": 24.5, "wait": 1.1}))
    with console.capture() as captured:
        print_summary(result)
    text = captured.get()
    assert "136.60" in text and "derived from eager" in text and "reached 82%" in text and "registers=32" in text
    assert "ncu gelu: 127.4 us, DRAM 84%" in text and "long_scoreboard 24.5" in text and "flags: throttled" in text


# -- GPU: the timing classes ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["side_stream", "patch_timer", "cache_by_pointer", "lazy_when_timed"])
def test_timing_tricks_buy_nothing(session, name, monkeypatch):
    monkeypatch.setattr(rules, "check_source", lambda source: [])
    r = judge(load_target("vector_add"), name, session)
    if r.verdict == "correct":  # then it is an honest kernel, honestly timed: no real add beats eager by much
        assert r.speedup_over("eager") < 1.3, r.speedup
    else:
        assert r.time_us is None


def test_the_compile_baseline_takes_one_of_two_modes():
    assert EvalSettings(compile_mode="default").compile_mode == "default"
    with pytest.raises(ValueError, match="unknown torch.compile mode 'reduce-overhead'"):
        EvalSettings(compile_mode="reduce-overhead")  # CUDA graphs would time a copy into the graph's own inputs


@pytest.mark.gpu
def test_each_compile_mode_is_measured_before_its_ratio_is_reused(tiny, session):
    """The compile/eager ratio a session keeps is per mode: a "default" baseline is never derived from a
    max-autotune one measured earlier on the same shape, and each result names its mode."""
    first = [judge(tiny, "honest_add", session, baselines=("eager", "compile"), compile_mode=mode)
             for mode in ("default", "max-autotune-no-cudagraphs", "default")]
    assert all(r.verdict == "correct" for r in first), [r.reasons for r in first]
    compiled = [r.baselines["compile"] for r in first]
    assert [t.mode for t in compiled] == ["default", "max-autotune-no-cudagraphs", "default"]
    assert (compiled[0].derived_from_eager, compiled[2].derived_from_eager) == (False, True)
    assert compiled[2].compile_to_eager == pytest.approx(compiled[0].median / first[0].baselines["eager"].median)


@pytest.mark.gpu
def test_illegal_address_is_contained_and_the_executor_restarts(tiny, session):
    r = judge(tiny, "out_of_bounds", session)
    assert r.verdict == "runtime_error", r.reasons
    after = judge(tiny, "honest_add", session)
    assert after.verdict == "correct" and after.time_us.median > 0


def trusted_gpu_bytes(session) -> int:
    """GPU memory the executor and the referee hold (NVML, per process). The GPU's free memory would also count the
    pool's spare planners, whose CUDA contexts come and go between evaluations."""
    import pynvml

    pynvml.nvmlInit()
    pids = {session.executor().proc.pid, session.referee().proc.pid}
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids)


@pytest.mark.gpu
def test_outputs_of_the_wrong_shape_leave_no_memory_behind(session):
    # A shared block the referee never maps stays counted by CUDA IPC and is never freed: with 256 MiB outputs of
    # the wrong shape, four evaluations would hold a GiB more than one.
    target, source = load_target("row_sum"), (CANDIDATES / "copy_input.py").read_text()
    held = []
    for _ in range(4):
        r = judge_source(target, source, session)
        assert r.verdict == "incorrect" and "shape" in r.reasons[0], r.reasons
        held.append(trusted_gpu_bytes(session))
    assert held[-1] - held[0] < 128 * 2**20, [h / 2**30 for h in held]


def test_the_trusted_processes_free_a_set_of_inputs_before_making_the_next(tmp_path, monkeypatch):
    """At KernelBench's full sizes one set of inputs is gigabytes: the executor and the referee each hold one set at
    a time (two did not fit beside the planner's on an 80 GB H100)."""
    import weakref

    from sandbox import executor, referee
    from tools import inputs

    source = (TARGETS / "tiny_add.py").read_text()
    ex, ref = executor.Executor(tmp_path), referee.Referee()
    monkeypatch.setattr(executor, "IN_PLACE_FRACTION", 0)  # on a GPU a set this small is refreshed in place
    ex.shape("s", source, {})
    ref.shape("s", source, {}, 0)
    for module, new_set, held in ((executor, lambda seed: ex.inputs("s", seed), lambda: ex.held["s"]),
                                  (referee, lambda seed: ref._inputs("s", seed), lambda: ref.held["s"][1])):
        new_set(1)
        old = weakref.ref(held()[0])
        alive_when_making = []

        def make(*args, **kwargs):
            alive_when_making.append(old() is not None)
            return inputs.make_inputs(*args, **kwargs)

        monkeypatch.setattr(module, "make_inputs", make)
        new_set(2)
        assert alive_when_making == [False], module.__name__


@pytest.mark.gpu
def test_the_baselines_are_timed_on_reused_memory_like_the_candidate(monkeypatch):
    # Memory new from the driver is first written by the timed call itself, up to 17% slower on an H100
    # (tests/experiments/fresh_memory.py): a referee that gave its set back every round timed eager and torch.compile
    # slower than they are, while the candidate writes into buffers it reuses. Only another shape's set is given back.
    import torch

    from sandbox import referee

    monkeypatch.setattr(referee, "LARGE_FRACTION", 0)  # every set counts as full-size
    ref = referee.Referee()
    source = (TARGETS / "tiny_add.py").read_text()
    ref.shape("s", source, {"N": 2**24}, 0)
    ref.time("eager", "s", 1)
    mallocs = torch.cuda.memory_stats()["num_device_alloc"]
    for seed in range(2, 6):
        assert ref.time("eager", "s", seed)["ms"] > 0
    assert torch.cuda.memory_stats()["num_device_alloc"] == mallocs
    ref.forget()


@pytest.mark.gpu
def test_the_baselines_are_timed_from_a_reset_persisting_l2_like_the_candidate(monkeypatch):
    # evict_last lines (Inductor's kernels mark them too) could outlive the flush: tools/timing.py resets them
    # before every flushed call, the referee's as the executor's
    from sandbox import referee
    from tools import timing

    resets = []
    monkeypatch.setattr(timing, "reset_persisting_l2", lambda: resets.append("reset"))
    ref = referee.Referee()
    ref.shape("s", (TARGETS / "tiny_add.py").read_text(), {"N": 2**20}, 0)
    assert ref.time("eager", "s", 1)["ms"] > 0 and resets == ["reset"]
    ref.forget()


@pytest.mark.gpu
def test_outputs_viewing_one_buffer_leave_no_memory_behind(session):
    # Both outputs share one storage: shared twice and mapped once, CUDA IPC would keep its 512 MiB counted for good
    # (four evaluations, 1.5 GiB held).
    target = load_target(str(TARGETS / "kb_two_outputs.py"))
    source = (CANDIDATES / "honest_one_buffer_two_outputs.py").read_text()
    held = []
    for _ in range(4):
        r = judge_source(target, source, session)
        assert r.verdict == "correct", r.reasons
        held.append(trusted_gpu_bytes(session))
    assert held[-1] - held[0] < 128 * 2**20, [h / 2**30 for h in held]


@pytest.mark.gpu
def test_the_same_kernel_against_itself_is_a_tie(session):
    # the best's own timing read slow, as a noisy one can: every challenger now looks faster and is paired with it
    target, source = honest_add_as_a_misread_best(session, 100)
    outcomes = []
    for _ in range(3):
        with session.evaluation(target, source, EvalSettings(baselines=("eager",))) as again:
            again.assemble(), again.verify(), again.profile()
        outcomes.append(again.result.vs_best and again.result.vs_best.outcome)
    assert len(outcomes) == 3 and set(outcomes) <= {"tie", "slower"}, outcomes


def test_a_closed_session_starts_no_executor_or_referee():
    # A stop closes the session (and removes its folder) while an evaluation may still be finishing on the
    # pipeline's completion thread; its release must not start a GPU process in the removed folder.
    from sandbox.evaluate import Device
    from sandbox.process import ChildDied

    closed = SimpleNamespace(cuda=True, closed=True, directory=Path("/nonexistent/kloop-session"))
    device = Device(closed)
    with pytest.raises(ChildDied, match="session is closed"):
        device.referee()
    with pytest.raises(ChildDied, match="session is closed"):
        device.executor()
    assert device.referee_starts == 0 and device._executor is None and device._referee is None


def test_the_referees_moved_reference_steps_fractional_inputs_and_weights_and_leaves_its_model_alone():
    import torch

    from sandbox import referee

    source = ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.bn = torch.nn.BatchNorm1d(64)\n        self.bias = torch.nn.Parameter(torch.full((64,), 0.3))\n"
              "    def forward(self, x, labels):\n"
              "        return self.bn(x).sum(1), labels * 3, self.bias + labels[:, None] * 0\n"
              "def get_inputs():\n    return [torch.randn(32, 64), torch.randint(0, 5, (32,)).float()]\n"
              "def get_init_inputs():\n    return []\n")
    ref = referee.Referee()
    ref.shape("main", source, {}, 3)
    summed, labels, biased = ref._expected("main", 11)
    running, bias = ref.models["main"].bn.running_mean.clone(), ref.models["main"].bias.detach().clone()
    moved = ref._moved_output("main", 0, summed)
    # one rounding step of x moves a 64-term sum by a few of its ulps; the labels (whole numbers) never move
    assert moved.shape == summed.shape and moved.dtype == summed.dtype and 0 < (moved - summed).abs().max() < 1e-4
    assert torch.equal(ref._moved_output("main", 1, labels), labels)
    # a weight moves by one rounding step too, each element up or down (BatchNorm's weight of ones stays: whole)
    steps = (ref._moved_output("main", 2, biased) - biased) / (0.3 * torch.finfo(torch.float32).eps)
    assert set(steps.round().unique().tolist()) == {-1.0, 1.0}
    # a copy ran: BatchNorm's statistics and the weights stay
    assert torch.equal(ref.models["main"].bn.running_mean, running) and torch.equal(ref.models["main"].bias, bias)


def test_the_referee_warms_up_its_flop_count_and_torch_compile_and_survives_their_failure(monkeypatch):
    # A GPU referee pays these one-time costs before it says it is ready, not during the first candidate's timing.
    import torch

    from sandbox import referee
    from tools import profile

    counted, compiled = [], []
    monkeypatch.setattr(profile, "count_bytes_and_flops", lambda model, inputs, outputs: counted.append(model))
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or fn)
    referee.warm_up()
    assert len(counted) == 1 and isinstance(counted[0], torch.nn.Linear) and len(compiled) == 1

    def broken(fn, **kw):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    referee.warm_up()   # nothing raised: a cold first candidate, as before


def test_lanes_in_one_process_never_see_each_others_random_draws():
    # On the CPU the referee runs inside the evaluator, and a suite's lanes are threads of one process: another lane's
    # reference drawing from torch's one random state (dropout, here) between our seed and our draws would give our
    # referee other inputs than the executor made from the same seed, and a right kernel a wrong verdict.
    import sys
    import threading

    import torch

    from sandbox.evaluate import _InProcess
    from sandbox.referee import Referee
    from tools.inputs import make_inputs
    from tools.target import module_from_source

    dropout = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
               "    def forward(self, x):\n        return torch.nn.functional.dropout(x, 0.5, training=True)\n\n"
               "def get_inputs():\n    return [torch.randn(4096)]\n\ndef get_init_inputs():\n    return []\n")
    ours = (TARGETS / "tiny_add.py").read_text()
    expected = {seed: make_inputs(module_from_source(ours, {}, "kloop_expected"), seed) for seed in range(40)}
    stop = threading.Event()

    def other_lane():
        lane = _InProcess(Referee())
        lane.call(60, "shape", shape="d", target_source=dropout, overrides={}, init_seed=1)
        while not stop.is_set():
            lane.call(60, "time", name="eager", shape="d", seed=2)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # threads take turns as often as they can
    other = threading.Thread(target=other_lane)
    other.start()
    try:
        lane = _InProcess(Referee())
        lane.call(60, "shape", shape="s", target_source=ours, overrides={}, init_seed=0)
        for seed, want in expected.items():
            lane.call(60, "expect", shape="s", seed=seed)
            held = lane.referee.held["s"][1]
            assert all(torch.equal(a, b) for a, b in zip(held, want)), f"seed {seed}: other inputs"
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)


@pytest.mark.gpu
def test_on_a_gpu_the_executor_times_autotuned_configurations_and_runs_the_fastest(tiny, session):
    r = judge(tiny, "honest_autotune_slow_first", session)
    assert r.verdict == "correct", r.reasons
    tuned, = [f for f in r.flags if f.startswith("autotuned:")]
    slow, fast = (float(ms) for ms in tuned.split("medians ")[1].removesuffix(" ms)").split(", "))
    assert tuned.startswith("autotuned: site 0 ran option 1 of 2") and slow > 1.5 * fast, tuned
    assert r.time_us.median < 1e3 * slow, (r.time_us.median, tuned)


@pytest.mark.gpu
def test_on_a_gpu_planners_reach_no_device_and_make_no_context(session, tmp_path):
    # tiny_add, whose module says, where it is loaded, whether that process can reach a GPU device node and has made
    # a CUDA context: a GPU node's planners (sandbox/pool.py, deviceless) must have done neither
    target = tmp_path / "tiny_add_reports_devices.py"
    target.write_text("import os\nimport torch\nprint(f\"devices: nvidiactl={os.path.exists('/dev/nvidiactl')} "
                      "context={torch.cuda.is_initialized()}\")\n" + (TARGETS / "tiny_add.py").read_text())
    r = judge(load_target(str(target)), "honest_add", session)
    assert r.verdict == "correct", r.reasons
    assert "context=False" in r.stdout, r.stdout
    if session.pool.isolation.mode == "bwrap":  # the other modes show the host's /dev (CUDA_VISIBLE_DEVICES is "")
        assert "devices: nvidiactl=False" in r.stdout, r.stdout


@pytest.mark.skipif(HAS_GPU, reason="on a GPU the executor times every configuration")
def test_on_the_cpu_an_autotuned_kernel_runs_its_first_configuration_and_says_so(tiny, session):
    r = judge(tiny, "honest_autotune_slow_first", session)
    assert r.verdict == "correct", r.reasons
    assert "autotuned: the CPU ran the first configuration of every autotuned launch (1 site); a GPU runs the " \
           "fastest, which only a GPU's checks judge" in r.flags, r.flags


def test_an_autotuned_configuration_that_stores_past_its_output_is_incorrect_whichever_is_chosen(tiny, session):
    r = judge(tiny, "autotuned_config_stores_past_end", session)
    assert r.verdict == "incorrect" and r.reasons[0].startswith(
        "main shape: configuration 1 of 2 of an autotuned launch wrote outside its memory: past an end of "), r.reasons
