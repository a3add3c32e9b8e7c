"""A starter's defaults timed at generation (agent/kernels/starter_tune.py): the fastest setting whose outputs
match the reference becomes the default; here under the interpreter, with timings given by a fake clock."""
import re
import sys

import pytest
import torch

from agent.kernels.inductor import Generated, Kernel, kernel_choices
from agent.kernels.starter_tune import tune

SOURCE = '''import torch
import triton
import triton.language as tl

K0_XBLOCK = 64
K0_SCALE = 1


@triton.jit
def _double(x_ptr, y_ptr, n, XBLOCK: tl.constexpr, SCALE: tl.constexpr):
    offsets = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2 * SCALE, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2


class ModelNew(Model):
    def forward(self, x):
        y = torch.empty_like(x)
        _double[(triton.cdiv(x.numel(), K0_XBLOCK),)](x, y, x.numel(), XBLOCK=K0_XBLOCK, SCALE=K0_SCALE)
        return y
'''


def starter(*settings):
    defaults = {"K0_XBLOCK": 64, "K0_SCALE": 1}
    return Generated(SOURCE, {"K0_XBLOCK": [32, 64], "K0_SCALE": [1]}, defaults, "a doubling kernel", ["_double"],
                     [[defaults] + [{**defaults, **s} for s in settings]])


def tuned(generated, milliseconds, expected=lambda x: x * 2):
    """tune() with each run's time looked up by the XBLOCK it ran with (a list: its timings in turn)."""
    x = torch.randn(1000)
    seen = []

    def measure(fn):  # the setting timed is the candidate module's globals at the time
        block = next(vars(m)["K0_XBLOCK"] for name, m in sys.modules.items() if name.startswith("kloop_starter_tune"))
        seen.append(block)
        fn()
        times = milliseconds[block]
        return times.pop(0) if isinstance(times, list) else times

    return tune(generated, lambda cls: cls(), [x], expected(x), measure=measure), seen


def test_the_fastest_setting_with_the_references_outputs_becomes_the_default():
    # 16 is fastest but doubles twice (SCALE 2): never timed; 3 is no power of two: Triton refuses it
    generated = starter({"K0_XBLOCK": 32}, {"K0_XBLOCK": 16, "K0_SCALE": 2}, {"K0_XBLOCK": 3})
    result, seen = tuned(generated, {64: 3.0, 32: 2.0, 16: 0.5, 3: 0.1})
    assert seen == [64, 32] * 3   # three rounds
    assert result.defaults == {"K0_XBLOCK": 32, "K0_SCALE": 1}
    assert "K0_XBLOCK = 32\n" in result.source and "K0_XBLOCK = 64" not in result.source
    assert "2 of 4 settings timed" in result.notes and "first 3 ms, kept 2 ms" in result.notes
    assert result.tunables == generated.tunables


def test_a_timing_stretched_by_another_process_does_not_decide():
    # 32 is the faster; its first timing overlapped another generation's kernels, 64's second did
    result, _ = tuned(starter({"K0_XBLOCK": 32}), {64: [3.0, 9.0, 3.1], 32: [8.0, 2.0, 2.1]})
    assert result.defaults["K0_XBLOCK"] == 32
    assert "first 3 ms, kept 2 ms" in result.notes


def test_a_win_under_one_percent_keeps_inductors_first_configuration():
    result, _ = tuned(starter({"K0_XBLOCK": 32}), {64: 1.0, 32: 0.995})
    assert result.defaults["K0_XBLOCK"] == 64 and "K0_XBLOCK = 64\n" in result.source


def test_a_chosen_value_joins_its_tunables_list():
    result, _ = tuned(starter({"K0_XBLOCK": 128}), {64: 2.0, 128: 1.0})
    assert result.defaults["K0_XBLOCK"] == 128 and result.tunables["K0_XBLOCK"] == [32, 64, 128]


def test_a_first_setting_that_does_not_reproduce_the_reference_is_not_tuned_from():
    with pytest.raises(ValueError, match="does not reproduce the reference"):
        tuned(starter({"K0_XBLOCK": 32}), {64: 2.0, 32: 1.0}, expected=lambda x: x * 3)


def test_nothing_to_choose_leaves_the_starter_as_it_is():
    generated = starter()
    assert tune(generated, lambda cls: cls(), [torch.randn(8)], None, measure=None) is generated


def test_inductors_configurations_become_settings_of_a_kernels_tunables():
    kernel = Kernel("k", "", "reduction", "Grid1D", ["in_ptr0"], ["XBLOCK", "R0_BLOCK"], configs=[
        {"kwargs": {"XBLOCK": 1, "R0_BLOCK": 1024}, "num_warps": 8, "num_stages": 1},   # the defaults again
        {"kwargs": {"XBLOCK": 64, "R0_BLOCK": 8}, "num_warps": 4, "num_stages": 1},
        {"kwargs": {"XBLOCK": 8, "R0_BLOCK": 64, "RSPLIT": 4}, "num_warps": 4, "num_stages": 1},  # not tunable
    ])
    defaults = {"K2_XBLOCK": 1, "K2_R0_BLOCK": 1024, "K2_NUM_WARPS": 8, "K2_NUM_STAGES": 1}
    assert kernel_choices(2, kernel, defaults) == [
        defaults, {"K2_XBLOCK": 64, "K2_R0_BLOCK": 8, "K2_NUM_WARPS": 4, "K2_NUM_STAGES": 1}]


OUTER_SUM = '''import torch


class Model(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 64
dim1 = 1024
dim2 = 1023


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
'''


MATMUL = '''import torch


class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


M = 1024
K = 1023
N = 1024


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
'''


def _load(path, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
def test_on_a_gpu_the_starters_settings_are_timed_and_each_computes_the_reference(tmp_path):
    """An outer sum (Inductor's first configuration reads one row of the reduced dimension per program: KernelBench
    47-53 at 0.3x of torch.compile on an H200) and an fp32 GEMM template (its 3xTF32 switch): every setting is
    timed at generation (which wins is the benchmark's business, not this test's), and the starter with the chosen
    defaults, and the template both ways, compute the reference."""
    from agent.kernels import inductor

    for name, source in (("outer_sum", OUTER_SUM), ("matmul", MATMUL)):
        (tmp_path / f"{name}.py").write_text(source)
        generated = inductor.generate(str(tmp_path / f"{name}.py"), small=False)
        timed = re.search(r"defaults timed at generation: (\d+) of (\d+) settings", generated.notes)
        assert timed and int(timed.group(1)) >= 2, generated.notes
        (tmp_path / f"{name}_starter.py").write_text(generated.source)
        module = _load(tmp_path / f"{name}_starter.py", f"kloop_test_{name}")
        if name == "outer_sum":
            inputs, model = [torch.randn(64, 1024, 1023, device="cuda")], module.ModelNew(1).cuda()
            want, switches = inputs[0].double().sum(1, keepdim=True), [None]
        else:
            inputs, model = [torch.randn(1024, 1023, device="cuda"), torch.randn(1023, 1024, device="cuda")], \
                module.ModelNew().cuda()
            want, switches = inputs[0].double() @ inputs[1].double(), [0, 1]
        # the main shape's kernels (compiled for its sizes) carry the searched tunables, after the dynamic ones
        switch_names = [name for name in generated.tunables if name.endswith("_TF32X3")]
        assert len(switch_names) == len(switches) - 1 and all(generated.tunables[n] == [0, 1] for n in switch_names)
        for switch in switches:
            if switch is not None:
                setattr(module, switch_names[0], switch)
            torch.testing.assert_close(model(*inputs).double(), want, rtol=1e-4, atol=1e-3)


def test_outputs_are_compared_relative_to_the_reference_and_exactly_where_not_finite_or_integer():
    from agent.kernels import starter_tune

    want = torch.tensor([1.0, -4.0, float("nan"), float("inf")])
    assert starter_tune._error(want.clone(), want) == 0.0
    assert starter_tune._error(torch.tensor([1.0, -4.002, float("nan"), float("inf")]), want) == pytest.approx(5e-4, rel=1e-3)
    assert starter_tune._error(torch.tensor([1.0, -4.0, 0.0, float("inf")]), want) == float("inf")
    assert starter_tune._error((torch.tensor([3, 1]),), (torch.tensor([3, 2]),)) == float("inf")
    assert starter_tune._error(torch.zeros(3), torch.zeros(2)) == float("inf")


def test_a_captured_fp32_gemm_starter_is_timed_both_ways_end_to_end(tmp_path, monkeypatch):
    """The GPU path's plumbing under the interpreter: Inductor's template with its TF32X3 switch, its choices, the
    model built with the reference's parameters, the timed defaults written into the source."""
    from agent.kernels import inductor, starter_tune
    from tools.inputs import make_inputs
    from tools.target import load_target

    (tmp_path / "matmul.py").write_text(MATMUL.replace("1024", "32").replace("1023", "31"))
    target = load_target(str(tmp_path / "matmul.py"))
    module = target.module_for({})
    model = module.Model()
    inputs = make_inputs(module, 0)
    with torch.no_grad():
        expected = model(*inputs)
    wrapper, sources = _captured(model, inputs)
    generated = inductor.build_candidate(wrapper, sources, target.source, True)   # as on a GPU: with choices
    assert [s["K0_TF32X3"] for s in generated.choices[0]] == [0, 1]

    def measure(fn):   # 3xTF32 "faster", as on a GPU's tensor cores
        fn()
        switch = next(vars(m)["K0_TF32X3"] for name, m in sys.modules.items() if name.startswith("kloop_starter_tune"))
        return 1.0 if switch else 2.0

    monkeypatch.setattr(starter_tune.tune, "__defaults__", (measure, starter_tune.TUNE_BUDGET_S))
    tuned = inductor._timed(generated, module, model, inputs, expected)
    assert "2 of 2 settings timed" in tuned.notes, tuned.notes
    assert tuned.defaults["K0_TF32X3"] == 1 and "\nK0_TF32X3 = 1\n" in tuned.source


def _captured(model, inputs):
    """inductor.capture in this process (generation runs it in a child), Dynamo's and Inductor's settings as they
    were afterwards."""
    import warnings

    import torch._dynamo
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    from agent.kernels import inductor

    saved = inductor_config.save_config(), dynamo_config.save_config()
    try:
        return inductor.capture(model, inputs)
    finally:
        with warnings.catch_warnings():   # loading them back names their deprecated keys
            warnings.simplefilter("ignore", FutureWarning)
            inductor_config.load_config(saved[0])
            dynamo_config.load_config(saved[1])
        torch._dynamo.reset()
