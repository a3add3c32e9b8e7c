"""Starter kernels: Triton starters against their targets under the interpreter, PTX starters and PTX edits through
ptxas, the PTX GELU's erf approximation in NumPy, and the catalog's rendering of tunables."""
import ast
import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch

from agent.kernels import ptx_edits
from agent.kernels.catalog import STARTERS, default_values, render, starters_for
from tools.assemble import assemble_ptx
from tools.launch import NoGpuError
from tools.target import load_target
from tools.targets import BUILTIN_TARGETS

ALL_STARTERS = [s for name in BUILTIN_TARGETS for s in starters_for(name)]
TRITON_STARTERS = [s for s in ALL_STARTERS if s.language == "triton"]
PTX_STARTERS = [s for s in ALL_STARTERS if s.language == "ptx"]


def _non_default_values(starter):
    """For each tunable, the first listed value that differs from the file's own."""
    defaults = default_values(starter)
    return {name: next(v for v in values if v != defaults[name]) for name, values in starter.tunables.items()}


def _exec_module(source):
    namespace = {"__name__": "kloop_candidate"}
    exec(compile(source, "candidate", "exec"), namespace)
    return namespace


def _import_file(source, tmp_path):
    # @triton.jit (even interpreted) needs its source in a file.
    import importlib.util
    path = tmp_path / f"candidate_{abs(hash(source))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tolerance(target_name, dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return {"atol": 1e-2, "rtol": 1e-2}
    if target_name == "row_sum":  # sums of thousands of values: a different order moves the last bits
        return {"atol": 1e-4, "rtol": 1e-5}
    return {"atol": 1e-5, "rtol": 1e-5}


@contextlib.contextmanager
def _full_precision_reductions():
    """cuBLAS may otherwise split K and add the partial sums in bf16/fp16 (torch's default), which puts the
    reference, not the fp32-accumulating candidate, several ulps off (e.g. exact zeros at K=777)."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved


def _check_against_reference(target, candidate_module, shapes, device="cpu"):
    for shape in shapes:
        module = target.module_for(shape)
        torch.manual_seed(0)  # the same seed gives Model and ModelNew the same parameters
        reference = module.Model(*module.get_init_inputs()).to(device)
        torch.manual_seed(0)
        candidate = candidate_module.ModelNew(*module.get_init_inputs()).to(device)
        torch.manual_seed(1)
        inputs = [t.to(device) for t in module.get_inputs()]
        with torch.no_grad(), _full_precision_reductions():
            expected = reference(*inputs)
        with torch.no_grad():
            got = candidate(*inputs)
        torch.testing.assert_close(got, expected, **_tolerance(target.name, expected.dtype),
                                   msg=lambda m: f"{target.name} at {shape}: {m}")


def test_every_target_has_a_triton_starter_and_files_exist():
    assert set(STARTERS) == set(BUILTIN_TARGETS)
    for starter in ALL_STARTERS:
        assert starter.path.is_file(), starter.path
        assert starter.target == starter.name.split("/")[0]
        assert set(starter.tunables) == set(default_values(starter))
    assert {s.target for s in TRITON_STARTERS} == set(BUILTIN_TARGETS)
    assert {s.target for s in PTX_STARTERS} >= {"vector_add", "gelu", "row_sum"}
    assert starters_for("user_target") == []


@pytest.mark.parametrize("starter", TRITON_STARTERS, ids=lambda s: s.name)
@pytest.mark.parametrize("tunables", ["default", "non_default"])
def test_triton_starter_matches_reference_at_cpu_shapes(starter, tunables, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("interpreter check; the GPU test covers this on a GPU")
    values = {} if tunables == "default" else _non_default_values(starter)
    module = _import_file(render(starter, values), tmp_path)
    target = load_target(starter.target)
    _check_against_reference(target, module, target.shapes(small=True))


@pytest.mark.parametrize("starter", PTX_STARTERS, ids=lambda s: s.name)
@pytest.mark.parametrize("tunables", ["default", "non_default"])
def test_ptx_starter_assembles_for_sm90(starter, tunables):
    values = {} if tunables == "default" else _non_default_values(starter)
    namespace = _exec_module(render(starter, values))
    assembly = assemble_ptx(namespace["PTX"], "sm_90")
    usage = next(iter(assembly.kernels.values()))
    assert usage["spill_stores_bytes"] == 0
    model = namespace["ModelNew"]()  # builds (assembles) its PtxKernel
    if not torch.cuda.is_available():
        target = load_target(starter.target)
        with pytest.raises(NoGpuError):
            model(*target.module_for(target.shapes(small=True)[0]).get_inputs())


@pytest.mark.parametrize("starter", PTX_STARTERS, ids=lambda s: s.name)
def test_ptx_starter_rejects_an_impossible_thread_count(starter):
    with pytest.raises(ValueError, match="THREADS must be a multiple of 32"):
        _exec_module(render(starter, {"THREADS": 100}))


def test_render_rewrites_values_keeps_comments_and_rejects_unknown_tunables():
    starter = next(s for s in ALL_STARTERS if s.name == "vector_add/triton_block")
    source = render(starter, {"BLOCK_SIZE": 1024, "EVICTION": ""})
    assert "BLOCK_SIZE = 1024      # elements per program" in source
    assigned = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(source).body
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
    assert assigned["BLOCK_SIZE"] == 1024 and assigned["EVICTION"] == "" and assigned["NUM_WARPS"] == 8
    with pytest.raises(ValueError, match="no tunable"):
        render(starter, {"BLOCK": 64})
    with pytest.raises(ValueError, match="must be a bool, int, float or str"):
        render(starter, {"BLOCK_SIZE": [1024]})


def _gelu_ptx_math_in_numpy(x):
    """The PTX GELU's exact fp32 operation sequence; fma = product and sum in float64, rounded once to fp32."""
    from agent.kernels.gelu import ptx_vec4 as g  # noqa: PLC0415 (tools.launch imports fine without a GPU)
    f32 = np.float32

    def fma(a, b, c):
        return (a.astype(np.float64) * b.astype(np.float64) + np.float64(c)).astype(f32)

    def horner(var, coeffs):
        acc = np.full_like(var, f32(coeffs[0]))
        for c in coeffs[1:]:
            acc = fma(acc, var, f32(c))
        return acc

    z = (x * f32(g.INV_SQRT2)).astype(f32)
    t = np.abs(z)
    s = (z * z).astype(f32)
    small = fma(horner(s, g.ERF_SMALL_COEFFS), z, f32(1.0))
    r = horner(np.minimum(t, f32(g.TAIL_CLAMP)), g.ERFC_LOG_COEFFS)
    e = np.exp2((r * f32(g.NEG_LOG2E)).astype(f32)).astype(f32)  # ex2.approx is within 2 ulp of this
    large = np.where(z < 0, e, (f32(2.0) - e).astype(f32))
    cdf = np.where(t < f32(g.SPLIT), small, large)
    return ((x * f32(0.5)).astype(f32) * cdf).astype(f32)


def test_ptx_gelu_immediates_are_the_exact_fp32_bits():
    import struct
    from agent.kernels.gelu import ptx_vec4 as g
    for value in (*g.ERF_SMALL_COEFFS, *g.ERFC_LOG_COEFFS, g.INV_SQRT2, g.NEG_LOG2E, 0.5, 2.0, -3.0e-5, 0.0):
        assert g._f32(value) == "0f" + struct.pack(">f", value).hex().upper()


def test_starters_pass_the_candidate_rules():
    from tools.rules import check_source, detect_language
    for starter in ALL_STARTERS:
        assert check_source(starter.source) == [], starter.name
        assert detect_language(starter.source) == starter.language, starter.name


def test_ptx_gelu_erf_approximation_is_fp32_accurate():
    x = np.concatenate([np.linspace(-12, 12, 400001), [-1.4142135, 1.4142135, 0.0]]).astype(np.float32)
    got = _gelu_ptx_math_in_numpy(x).astype(np.float64)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])
    error = np.abs(got - exact)
    assert error.max() < 2e-6  # absolute, over |x| <= 12
    assert (error <= 1e-5 * np.abs(exact) + 1e-6).all()
    assert error[np.abs(x) < 4].max() < 1e-6


def test_cache_hint_variants_only_return_changed_text():
    plain = "\tld.global.b32 { %r1 }, [ %rd1 + 0 ];\n\tld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd2];\n" \
            "\tst.global.v4.b32 [ %rd3 + 0 ], { %r1, %r2, %r3, %r4 };\n"
    variants = ptx_edits.cache_hint_variants(plain)
    assert variants["loads_nc"].count("ld.global.nc.") == 2
    assert "ld.global.L1::no_allocate.v4.f32" in variants["loads_l1_no_allocate"]
    assert "st.global.cs.v4.b32" in variants["stores_cs"] and "ld.global.b32" in variants["stores_cs"]
    assert "ld.global.nc.b32" in variants["loads_nc_stores_cs"] and "st.global.cs." in variants["loads_nc_stores_cs"]
    already_hinted = "ld.global.L1::evict_first.b32 %r1, [%rd1];\nst.global.cs.b32 [%rd2], %r1;\n"
    assert ptx_edits.cache_hint_variants(already_hinted) == {}


def test_compile_triton_starter_refuses_the_interpreter(monkeypatch):
    import triton
    monkeypatch.setattr(triton.knobs.runtime, "interpret", True)
    starter = next(s for s in ALL_STARTERS if s.name == "vector_add/triton_block")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        ptx_edits.compile_triton_starter(starter.source, [], [torch.randn(16), torch.randn(16)], specialize=True)


@pytest.fixture(scope="module")
def softmax_ptx():
    """softmax/triton_row compiled to PTX (specialized, generic) at the small main shape, with no GPU, in a fresh
    process (the interpreter must be off); a failure carries the subprocess's stderr."""
    starter = next(s for s in ALL_STARTERS if s.name == "softmax/triton_row")
    return ptx_edits.compile_for_target(starter.source, "softmax", small=True)


def _softmax_candidate(compiled):
    starter = next(s for s in ALL_STARTERS if s.name == "softmax/triton_row")
    return ptx_edits.ptx_candidate_from_triton(starter.source, compiled)


def test_triton_ptx_and_its_cache_hint_variants_assemble(softmax_ptx):
    specialized, generic = softmax_ptx
    assert (specialized.entry, generic.entry) == ("softmax_row_kernel", "softmax_row_kernel_generic")
    assert specialized.num_warps == generic.num_warps == 16
    assert specialized.constexprs == generic.constexprs == {"BLOCK_COLS": 1024, "ROWS_PER_PROGRAM": 1}
    assert specialized.aligned and not generic.aligned and generic.divisible == generic.ones == []
    for compiled in softmax_ptx:
        assemble_ptx(compiled.ptx)
        variants = ptx_edits.cache_hint_variants(compiled.ptx)
        assert {"loads_nc", "stores_cs"} <= set(variants)
        for text in variants.values():
            assemble_ptx(text)


def test_ptx_candidate_from_triton_compiles_assembles_and_matches_params(softmax_ptx):
    source = _softmax_candidate(softmax_ptx)
    assert "import triton" not in source and "@triton.jit" not in source
    from tools.rules import check_source, detect_language
    assert check_source(source) == [] and detect_language(source) == "ptx"
    namespace = _exec_module(source)
    # x, out, n_rows, n_cols + Triton's 2 scratch pointers, in both compilations
    assert namespace["PTX_PARAM_BYTES"] == {"softmax_row_kernel": [8, 8, 4, 4, 8, 8],
                                            "softmax_row_kernel_generic": [8, 8, 4, 4, 8, 8]}
    assert namespace["PTX_MASKED_CONSTEXPRS"] == ("BLOCK_COLS",)
    model = namespace["ModelNew"]()
    assert [k.name for k in model.ptx_kernels] == ["softmax_row_kernel", "softmax_row_kernel_generic"]
    if not torch.cuda.is_available():
        # NoGpuError is raised by PtxKernel.launch, after the candidate picked a compilation that fits.
        with pytest.raises(NoGpuError):
            model(torch.randn(4, 100))


def test_ptx_candidates_parse_on_every_python_kloop_supports(softmax_ptx):
    # The candidate is written by ast.unparse. On Python 3.12+ it renders a string literal inside an f-string's
    # braces in the f-string's own quotes, which Python 3.10 and 3.11 cannot parse: a kernel logged on a GPU
    # machine's 3.12 was a syntax error when re-verified on 3.11.
    tree = ast.parse(_softmax_candidate(softmax_ptx))
    for fstring in (n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)):
        for value in (v for v in fstring.values if isinstance(v, ast.FormattedValue)):
            literals = [n.value for n in ast.walk(value.value) if isinstance(n, ast.Constant) and
                        isinstance(n.value, str)]
            assert not literals, ast.unparse(fstring)


def test_ptx_candidate_picks_specialized_generic_or_refuses(softmax_ptx):
    namespace = _exec_module(_softmax_candidate(softmax_ptx))
    fits, (specialized, generic) = namespace["ptx_variant_fits"], namespace["PTX_VARIANTS"]
    divisible = specialized["divisible"]
    assert divisible, "the small shape's n_cols (1000) is a multiple of 8 but n_rows (64) of 16"
    x = torch.zeros(64 * 1024 + 4)
    aligned_args = [x, torch.zeros(16), 64, 1000]
    block = {"BLOCK_COLS": 1024, "ROWS_PER_PROGRAM": 1}
    assert fits(specialized, None, aligned_args, block)
    assert not fits(specialized, None, [x[1:], *aligned_args[1:]], block)        # a pointer off 16-byte alignment
    odd = list(aligned_args)
    odd[divisible[0]] += 1
    assert not fits(specialized, None, odd, block) and fits(generic, None, odd, block)
    smaller = {"BLOCK_COLS": 256, "ROWS_PER_PROGRAM": 1}                       # masked: a compiled 1024 serves it
    assert fits(generic, None, [x[1:], x, 5, 201], smaller)
    assert not fits(generic, None, aligned_args, {"BLOCK_COLS": 4096, "ROWS_PER_PROGRAM": 1})
    assert not fits(generic, None, aligned_args, {"BLOCK_COLS": 1024, "ROWS_PER_PROGRAM": 2})
    assert not fits(generic, None, [x, x, 64, 2**31], block)                    # does not fit the i32 parameter
    starter = next(s for s in ALL_STARTERS if s.name == "softmax/triton_row")
    other_rendering = ptx_edits.ptx_candidate_from_triton(render(starter, {"ROWS_PER_PROGRAM": 2}), softmax_ptx)
    with pytest.raises(RuntimeError, match="no compiled PTX fits"):
        _exec_module(other_rendering)["ModelNew"]()(torch.randn(4, 100))


@pytest.mark.parametrize("starter", [s for s in TRITON_STARTERS if "MASKED_CONSTEXPRS" in s.source],
                         ids=lambda s: s.name)
def test_masked_constexprs_may_be_larger_than_the_launch_asks(starter, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("interpreter check")
    module = _import_file(starter.source, tmp_path)
    kernel = next(v for k, v in vars(module).items() if k.endswith("_kernel"))  # the starters' naming
    doubled = {name: 2 for name in module.MASKED_CONSTEXPRS}

    def launch(self, grid, args, constexprs):
        constexprs = {k: v * doubled.get(k, 1) for k, v in constexprs.items()}
        kernel[grid](*args, **constexprs, num_warps=module.NUM_WARPS)

    module.ModelNew.launch = launch
    target = load_target(starter.target)
    _check_against_reference(target, module, target.shapes(small=True))


def test_ptx_candidate_from_triton_rejects_sources_without_the_launch_convention(softmax_ptx):
    with pytest.raises(ValueError, match="launch"):
        ptx_edits.ptx_candidate_from_triton("class ModelNew:\n    def forward(self, x):\n        return x\n",
                                            softmax_ptx)
    with pytest.raises(ValueError, match="distinct entry names"):
        ptx_edits.ptx_candidate_from_triton("", [softmax_ptx[0], softmax_ptx[0]])
    with pytest.raises(ValueError, match="no .entry"):
        ptx_edits.ptx_candidate_from_triton("", [dataclasses.replace(softmax_ptx[0], entry="missing")])


@pytest.mark.gpu
@pytest.mark.parametrize("starter", ALL_STARTERS, ids=lambda s: s.name)
def test_starter_matches_reference_on_gpu_at_every_shape(starter, tmp_path):
    module = _import_file(starter.source, tmp_path)
    target = load_target(starter.target)
    _check_against_reference(target, module, target.shapes(small=False), device="cuda")


@pytest.mark.gpu
def test_ptx_candidate_from_triton_matches_reference_on_gpu(softmax_ptx):
    namespace = _exec_module(_softmax_candidate(softmax_ptx))

    class Module:
        ModelNew = namespace["ModelNew"]

    target = load_target("softmax")
    # Compiled at the small main shape (BLOCK_COLS 1024): rows up to 1024 run, longer ones are refused, not wrong.
    shapes = target.shapes(small=True)
    _check_against_reference(target, Module, [s for s in shapes if s["COLS"] <= 1024], device="cuda")
    with pytest.raises(RuntimeError, match="fits"):
        Module.ModelNew()(target.module_for(next(s for s in shapes if s["COLS"] > 1024)).get_inputs()[0].cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["vector_add/triton_block", "row_sum/triton_row", "matmul_bf16/triton_grouped"])
def test_ptx_candidate_compiled_at_the_main_shape_matches_at_every_shape_on_gpu(name):
    """Specialized PTX at the main shape, generic PTX at the odd hidden variants (e.g. N = 2**20 + 3)."""
    starter = next(s for s in ALL_STARTERS if s.name == name)
    namespace = _exec_module(ptx_edits.ptx_candidate_from_triton(
        starter.source, ptx_edits.compile_for_target(starter.source, starter.target)))

    class Module:
        ModelNew = namespace["ModelNew"]

    target = load_target(starter.target)
    _check_against_reference(target, Module, target.shapes(small=False), device="cuda")
