"""Targets: built-in registry and kloop extras, shapes as overrides re-executed from source, and the shapes derived
for KernelBench-style files (tests/targets/kb_*.py; the real KernelBench level 1 in the slow test)."""
import json
import math
import re
import time
from pathlib import Path

import pytest
import torch

from tools.target import SMALL_ELEMENTS, TargetError, load_target, module_from_source, size_constants
from tools.targets import BUILTIN_TARGETS, path_of

HERE = Path(__file__).resolve().parent
KB = {name: HERE / "targets" / f"kb_{name}.py" for name in
      ("leaky_relu", "row_cumsum", "grouped_conv", "cross_entropy", "inline_sizes")}
KERNELBENCH_LEVEL1 = HERE.parent / "kernelbench" / "level1"


def _run(target, shape, device="cpu"):
    module = target.module_for(shape)
    torch.manual_seed(0)
    with torch.device(device), torch.no_grad():
        inputs = module.get_inputs()
        out = module.Model(*module.get_init_inputs())(*inputs)
    return inputs, out


def _elements(target, shape):
    return sum(x.numel() for x in _run(target, shape, "meta")[0] if isinstance(x, torch.Tensor))


def _is_prime(n):
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


# --- built-ins -------------------------------------------------------------------------------------------------

def test_registry_lists_existing_files_and_rejects_unknown_names():
    assert len(BUILTIN_TARGETS) == len(set(BUILTIN_TARGETS)) == 8
    for name in BUILTIN_TARGETS:
        assert path_of(name).is_file()
    with pytest.raises(ValueError, match="unknown built-in target"):
        path_of("no_such_op")


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_builtin_extras_win_and_are_json(name):
    target = load_target(name)
    module = target.module
    assert isinstance(module.KLOOP_DESCRIPTION, str) and "\n" not in module.KLOOP_DESCRIPTION
    assert target.shapes(small=False)[1:] == [dict(v) for v in module.KLOOP_VARIANTS]
    small = target.shapes(small=True)
    assert small[0].keys() == module.KLOOP_SMALL.keys()
    assert small[1:] == [{**small[0], **v} for v in module.KLOOP_SMALL_VARIANTS]
    assert "KLOOP_VARIANTS" in target.shape_note(False) and "KLOOP_SMALL_VARIANTS" in target.shape_note(True)
    for shape in target.shapes(False) + small:
        assert json.loads(json.dumps(shape)) == shape
        target.module_for(shape)  # every override names a module-level assignment


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_model_runs_at_every_cpu_shape(name):
    target = load_target(name)
    for shape in target.shapes(small=True):
        inputs, out = _run(target, shape)
        assert torch.isfinite(out.float()).all()
        assert out.dtype == inputs[0].dtype


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_hidden_variants_have_the_expected_output_shape(name):
    target = load_target(name)
    for variant in target.shapes(small=False)[1:]:
        module = target.module_for(variant)
        rows = getattr(module, "ROWS", getattr(module, "M", None))
        cols = getattr(module, "COLS", getattr(module, "N", None))
        _, out = _run(target, variant, "meta")
        expected = {"vector_add": (cols,), "gelu": (cols,), "row_sum": (rows,)}
        assert out.shape == expected.get(name, (rows, cols))


def test_bf16_targets_run_fp16_small_from_a_dtype_string():
    for name in ("matmul_bf16", "matmul_bias_relu"):
        target = load_target(name)
        assert target.module.DTYPE is torch.bfloat16
        small = target.shapes(small=True)[0]
        assert small["DTYPE"] == "torch.float16"
        inputs, out = _run(target, small)
        assert inputs[0].dtype == out.dtype == torch.float16
        assert "DTYPE=torch.float16" in target.describe_shape(small)


# --- module_from_source ----------------------------------------------------------------------------------------

def test_module_from_source_gives_bit_identical_inputs_in_separate_calls():
    source = KB["cross_entropy"].read_text()
    made = []
    for name in ("one_process", "another_process"):
        module = module_from_source(source, {"batch_size": 33, "num_classes": 17}, name)
        torch.manual_seed(1234)
        made.append(module.get_inputs())
    for a, b in zip(*made):
        assert a.shape == b.shape and torch.equal(a, b)


def test_derived_constants_follow_their_overrides():
    target = load_target(str(KB["cross_entropy"]))
    module = target.module_for({"num_classes": 37})
    assert module.input_shape == (37,) and target.module.input_shape == (1000,)
    predictions, labels = _run(target, {"num_classes": 37, "batch_size": 50})[0]
    assert predictions.shape == (50, 37) and labels.max() < 37
    assert target.module_for({"num_classes": 37}) is module  # cached per shape
    # A list replaces a tuple as a tuple.
    assert load_target(str(KB["row_cumsum"])).module_for({"input_shape": [77]}).input_shape == (77,)


def test_overrides_split_chained_and_annotated_assignments():
    source = "import torch\nheight = width = 128\nrows: int = 4\nDTYPE = None\narea = height * width\n"
    module = module_from_source(source, {"height": 3, "rows": 5, "DTYPE": "torch.float16"})
    assert (module.height, module.width, module.area, module.rows, module.DTYPE) == (3, 128, 384, 5, torch.float16)


def test_bad_overrides_raise_one_line_target_errors():
    source = KB["leaky_relu"].read_text()
    for overrides in ({"batch_sise": 3}, {"dim": (1, 2)}, {"dim": torch.float16}):
        with pytest.raises(TargetError) as info:
            module_from_source(source, overrides)
        assert "\n" not in str(info.value)
    with pytest.raises(TargetError, match="batch_sise"):
        module_from_source(source, {"batch_sise": 3})


# --- derived shapes ------------------------------------------------------------------------------------------

def test_size_constants_are_what_get_inputs_reads():
    assert size_constants(KB["leaky_relu"].read_text()) == {"batch_size": 256, "dim": 3072}
    assert size_constants(KB["row_cumsum"].read_text()) == {"batch_size": 512, "input_shape": (3000,)}
    # out_channels, kernel_size, stride, padding and groups reach only Model: hyper-parameters.
    assert size_constants(KB["grouped_conv"].read_text()) == {"batch_size": 16, "in_channels": 32, "height": 64,
                                                               "width": 48}
    assert size_constants(KB["cross_entropy"].read_text()) == {"batch_size": 1024, "num_classes": 1000}
    assert size_constants(KB["inline_sizes"].read_text()) == {}


@pytest.mark.parametrize("name", [n for n in KB if n != "inline_sizes"])
def test_derived_shapes_change_only_sizes_and_run_on_the_cpu(name):
    target = load_target(str(KB[name]))
    sizes = size_constants(target.source)
    main, variants = target.shapes(small=False)[0], target.shapes(small=False)[1:]
    small = target.shapes(small=True)
    assert main == {} and len(variants) == 2 and len(small) == 3
    main_elements = _elements(target, {})
    init_sizes = size_constants(target.source, "get_init_inputs")
    for shape in variants + small:
        # full-size variants keep the constructor's sizes; CPU sizes divide them too (out_channels), nothing else
        assert set(shape) <= set(sizes) | (set(init_sizes) if shape in small else set())
        assert json.loads(json.dumps(shape)) == shape
        assert _elements(target, shape) < main_elements
        _, out = _run(target, shape)
        assert torch.isfinite(out.float()).all()
    for shape in small:
        assert _elements(target, shape) <= SMALL_ELEMENTS
    assert target.shapes(small=False) == load_target(str(KB[name])).shapes(small=False)  # deterministic


def test_hidden_variants_are_odd_then_prime_and_smaller():
    target = load_target(str(KB["leaky_relu"]))
    odd, prime = target.shapes(small=False)[1:]
    assert odd == {"batch_size": 85, "dim": 1025} and all(v % 2 for v in odd.values())
    assert all(_is_prime(v) for v in prime.values()) and prime["dim"] < odd["dim"]
    assert target.shape_note(False) == "2 hidden variant(s) derived from batch_size, dim (odd, prime)"
    small, small_odd, small_prime = target.shapes(small=True)
    assert small == {"batch_size": 32, "dim": 384}
    assert all(v % 2 for v in small_odd.values()) and all(_is_prime(v) for v in small_prime.values())
    assert target.shape_note(True).startswith("CPU sizes derived from batch_size, dim (x1/8, 12288 input elements)")
    assert target.describe_shape({}) == "batch_size=256, dim=3072"
    rows = load_target(str(KB["row_cumsum"]))
    assert [s["input_shape"] for s in rows.shapes(small=False)[1:]] == [[1001], [601]]
    assert rows.module_for(rows.shapes(small=False)[1]).dim == 1  # the axis stays
    assert rows.describe_shape({}) == "batch_size=512, input_shape=(3000,)"


def test_grouped_conv_variants_keep_channels_divisible_by_groups():
    target = load_target(str(KB["grouped_conv"]))
    for shape in target.shapes(small=False)[1:] + target.shapes(small=True):
        module = target.module_for(shape)
        assert module.in_channels % module.groups == 0 and module.out_channels % module.groups == 0
        assert (module.kernel_size, module.stride, module.groups) == (3, 2, 4)
        # out_channels only the constructor reads: full-size variants keep it, CPU sizes divide it like the others
        assert module.out_channels == (96 if shape in target.shapes(small=False) else 24)
    odd, prime = target.shapes(small=False)[1:]
    assert (odd["height"], odd["width"], odd["in_channels"]) == (21, 17, 12)  # 11 channels fall back to 12
    assert _is_prime(prime["height"]) and _is_prime(prime["width"])


def test_sizes_written_inline_give_the_main_shape_only():
    target = load_target(str(KB["inline_sizes"]))
    assert target.shapes(small=False) == target.shapes(small=True) == [{}]
    assert target.shape_note(True) == "no size constants found: the main shape only"
    assert target.describe_shape({}) == "the sizes written in get_inputs()"
    assert load_target(str(HERE / "targets" / "broken_inputs.py")).shapes(small=True) == [{}]


def test_explicit_small_shape_wins_and_variants_derive_from_it(tmp_path):
    path = tmp_path / "with_small.py"
    path.write_text(KB["leaky_relu"].read_text() + '\nKLOOP_SMALL = {"batch_size": 8, "dim": 100}\n')
    target = load_target(str(path))
    assert target.shapes(small=True) == [{"batch_size": 8, "dim": 100}, {"batch_size": 3, "dim": 33},
                                         {"batch_size": 5, "dim": 23}]
    assert target.shape_note(True).startswith("sizes from KLOOP_SMALL; 2 hidden variant(s) derived")


def test_a_reference_without_meta_kernels_is_checked_on_the_cpu(tmp_path):
    path = tmp_path / "no_meta.py"
    path.write_text(KB["leaky_relu"].read_text().replace(
        "return torch.nn.functional.leaky_relu(x, self.negative_slope)",
        "return x * x.abs().max().item()"))  # .item() has no value on the meta device
    target = load_target(str(path))
    assert target.shapes(small=False) == [{}]
    assert "meta" in target.shape_note(False)
    small = target.shapes(small=True)
    assert small[0] == {"batch_size": 32, "dim": 384} and len(small) == 3


RANDOM_OR_STATEFUL = {
    "dropout": ("self.drop = torch.nn.Dropout(0.2)", "return self.drop(x)"),   # active: the reference trains
    "rand": ("pass", "return x * torch.rand_like(x)"),
    "state": ("self.calls = 0", "self.calls += 1\n        return x * self.calls"),
}


@pytest.mark.parametrize("kind", sorted(RANDOM_OR_STATEFUL))
def test_a_reference_that_is_no_function_of_its_inputs_is_refused_in_one_line(tmp_path, kind):
    # two calls on the same inputs must agree, or no kernel can be checked against it (level 2's 66 and 83 drop out,
    # level 3's 33 carries its hidden state from call to call)
    from tools.target import check_reference

    init, forward = RANDOM_OR_STATEFUL[kind]
    source = (f"import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              f"        {init}\n\n    def forward(self, x):\n        {forward}\n\n\n"
              "def get_inputs():\n    return [torch.randn(64, 256)]\n\n\ndef get_init_inputs():\n    return []\n")
    path = tmp_path / f"{kind}.py"
    path.write_text(source)
    with pytest.raises(TargetError) as refused:
        check_reference(load_target(str(path)))
    message = str(refused.value)
    assert "\n" not in message and "two calls on the same inputs disagree (output 0: " in message
    path.write_text(source.replace(forward, "return x * 2"))   # the same file, deterministic: accepted
    check_reference(load_target(str(path)))


def test_another_threads_random_draws_never_make_a_reference_look_random(tmp_path):
    # a suite's lanes are threads of one process: the second call must see the very inputs of the first, whatever
    # another lane draws from torch's one random state meanwhile
    import threading

    from tools.target import check_reference

    target = load_target(str(KB["leaky_relu"]))
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            torch.randn(64)

    other = threading.Thread(target=draw)
    other.start()
    try:
        for _ in range(20):
            check_reference(target)
    finally:
        stop.set()
        other.join()


def test_io_bytes_counts_inputs_and_outputs_at_the_main_shape_without_memory(tmp_path):
    """What a planner holds at full size (the pipeline's memory gate): the outputs count, however small the
    inputs are (an outer product), and a reference with no meta version counts its outputs as its inputs."""
    outer = tmp_path / "outer.py"
    outer.write_text("import torch\nN = 40000\n\nclass Model(torch.nn.Module):\n"
                     "    def forward(self, a, b):\n        return a[:, None] * b[None, :]\n\n"
                     "def get_inputs():\n    return [torch.rand(N), torch.rand(N)]\n\n"
                     "def get_init_inputs():\n    return []\n")
    assert load_target(str(outer)).io_bytes(False) == 4 * (2 * 40000 + 40000 * 40000)   # 6.4 GB, nothing allocated
    assert load_target(str(KB["cross_entropy"])).io_bytes(False) == 4 * 1024 * 1000 + 8 * 1024 + 4
    no_meta = tmp_path / "no_meta.py"
    no_meta.write_text(KB["leaky_relu"].read_text().replace(
        "return torch.nn.functional.leaky_relu(x, self.negative_slope)", "return x * x.abs().max().item()"))
    assert load_target(str(no_meta)).io_bytes(False) == 2 * 4 * 256 * 3072


def test_state_bytes_counts_the_weights_at_full_size_without_memory(tmp_path):
    """What a candidate holds on the host while it builds its model: KernelBench's widest MLP is 8 GiB of fp32."""
    wide = tmp_path / "wide.py"
    wide.write_text("import torch\nN = 32768\n\nclass Model(torch.nn.Module):\n"
                    "    def __init__(self, n):\n        super().__init__()\n        self.fc = torch.nn.Linear(n, n)\n"
                    "        self.register_buffer('scale', torch.ones(n))\n"
                    "    def forward(self, x):\n        return self.fc(x) * self.scale\n\n"
                    "def get_inputs():\n    return [torch.rand(8, N)]\n\n"
                    "def get_init_inputs():\n    return [N]\n")
    assert load_target(str(wide)).state_bytes(False) == 4 * (32768 * 32768 + 2 * 32768)   # 4 GiB, none allocated
    assert load_target(str(HERE / "targets" / "tiny_linear.py")).state_bytes(False) == 4 * (48 * 40 + 40)
    assert load_target(str(KB["leaky_relu"])).state_bytes(False) == 0   # no parameters
    no_meta = tmp_path / "no_meta.py"   # a Model that cannot be built on the meta device counts nothing
    no_meta.write_text(wide.read_text().replace("super().__init__()", "super().__init__()\n        torch.ones(1).item()"))
    assert load_target(str(no_meta)).state_bytes(False) == 0


@pytest.mark.slow
@pytest.mark.skipif(not KERNELBENCH_LEVEL1.is_dir(), reason="KernelBench is not checked out in kernelbench/")
def test_every_kernelbench_level1_problem_gets_shapes():
    files = sorted(KERNELBENCH_LEVEL1.glob("*.py"), key=lambda p: int(re.match(r"\d+", p.name).group()))
    assert len(files) == 100
    counts, slowest, started = {}, (0.0, ""), time.perf_counter()
    for path in files:
        target = load_target(str(path))
        main = target.shapes(small=False)
        assert main[0] == {}
        counts[len(main) - 1] = counts.get(len(main) - 1, 0) + 1
        for shape in target.shapes(small=True):
            began = time.perf_counter()
            _, out = _run(target, shape)
            took = time.perf_counter() - began
            assert took < 10, f"{path.name} at {shape}: {took:.1f} s"
            slowest = max(slowest, (took, f"{path.name} {shape}"))
    print(f"\nhidden variants per file: {counts}; slowest small shape {slowest[0]:.2f} s ({slowest[1]}); "
          f"{time.perf_counter() - started:.0f} s in all")
    assert sum(n for k, n in counts.items() if k >= 1) >= 90


@pytest.mark.parametrize("name", ["matmul_bf16", "matmul_bias_relu"])
@pytest.mark.parametrize("small", [False, True])
def test_matmul_hidden_variants_break_easy_assumptions(name, small):
    variants = load_target(name).shapes(small)[1:]
    assert any(v["K"] % 64 and v["K"] % 2 for v in variants)                     # K odd: no tile multiple
    assert any(v["M"] % 2 and v["N"] % 2 for v in variants)                      # M and N odd
    assert any(v["M"] >= 4 * v["N"] for v in variants)                           # tall and skinny
    # rows TMA can describe (16-byte multiples in half precision), every edge ragged against a 128x128x64 tile
    assert any(v["K"] % 8 == 0 and v["N"] % 8 == 0 and v["M"] % 2 and v["N"] % 128 and v["K"] % 64
               for v in variants)


def test_a_size_only_the_constructor_reads_is_divided_at_cpu_size(tmp_path):
    """An 8192-wide Linear: out_features reaches only Model. Undivided, one CPU round multiplies 16 x 1024 inputs by
    a 1024 x 8192 weight under the interpreter and runs into its time limit."""
    (tmp_path / "wide_linear.py").write_text(
        "import torch\nimport torch.nn as nn\n\nbatch_size = 128\nin_features = 8192\nout_features = 8192\n\n\n"
        "class Model(nn.Module):\n    def __init__(self, in_features, out_features):\n        super().__init__()\n"
        "        self.linear = nn.Linear(in_features, out_features)\n\n    def forward(self, x):\n"
        "        return self.linear(x)\n\n\ndef get_inputs():\n    return [torch.randn(batch_size, in_features)]\n\n\n"
        "def get_init_inputs():\n    return [in_features, out_features]\n")
    target = load_target(str(tmp_path / "wide_linear.py"))
    small = target.shapes(small=True)
    assert small[0] == {"batch_size": 16, "in_features": 1024, "out_features": 1024}
    assert all(shape["out_features"] == 1024 for shape in small[1:])     # hidden CPU variants vary the inputs only
    assert [set(shape) for shape in target.shapes(small=False)[1:]] == [{"batch_size", "in_features"}] * 2
    assert "CPU sizes derived from batch_size, in_features, out_features (x1/8" in target.shape_note(True)
