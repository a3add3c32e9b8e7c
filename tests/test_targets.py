"""Built-in targets: registry, kloop extras, and every reference Model at its CPU and hidden shapes."""
import pytest
import torch

from tools.target import load_target
from tools.targets import BUILTIN_TARGETS, path_of


def test_registry_lists_existing_files_and_rejects_unknown_names():
    assert len(BUILTIN_TARGETS) == len(set(BUILTIN_TARGETS)) == 8
    for name in BUILTIN_TARGETS:
        assert path_of(name).is_file()
    with pytest.raises(ValueError, match="unknown built-in target"):
        path_of("no_such_op")


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_extras_override_existing_globals(name):
    module = load_target(name).module
    assert isinstance(module.KLOOP_DESCRIPTION, str) and "\n" not in module.KLOOP_DESCRIPTION
    overrides = [module.KLOOP_SMALL, *module.KLOOP_VARIANTS, *module.KLOOP_SMALL_VARIANTS]
    for override in overrides:
        assert set(override) <= set(vars(module)), f"{name}: {override} names a missing global"


def _run(target, shape):
    with target.overrides(shape):
        model = target.module.Model(*target.module.get_init_inputs())
        inputs = target.module.get_inputs()
        with torch.no_grad():
            out = model(*inputs)
    return inputs, out


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_model_runs_at_every_cpu_shape(name):
    target = load_target(name)
    for shape in target.shapes(small=True):
        inputs, out = _run(target, shape)
        assert all(t.device.type == "cpu" for t in inputs)
        assert torch.isfinite(out.float()).all()
        assert out.dtype == inputs[0].dtype


@pytest.mark.parametrize("name", BUILTIN_TARGETS)
def test_hidden_variants_have_the_expected_output_shape(name):
    target = load_target(name)
    module = target.module
    for variant in module.KLOOP_VARIANTS:
        with target.overrides(variant):
            rows = getattr(module, "ROWS", getattr(module, "M", None))
            cols = getattr(module, "COLS", getattr(module, "N", None))
        _, out = _run(target, variant)
        expected = {"vector_add": (variant.get("N"),), "gelu": (variant.get("N"),), "row_sum": (rows,)}
        assert out.shape == expected.get(name, (rows, cols))


def test_bf16_targets_read_their_dtype_from_a_global_and_run_fp16_small():
    for name in ("matmul_bf16", "matmul_bias_relu"):
        target = load_target(name)
        assert target.module.DTYPE is torch.bfloat16
        inputs, out = _run(target, target.shapes(small=True)[0])
        assert inputs[0].dtype == out.dtype == torch.float16
