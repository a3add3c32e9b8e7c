"""The offline policy's starter for any target: Inductor's Triton made standalone (agent/kernels/inductor.py).

The translation is checked on a wrapper written the way Inductor writes it for a CUDA device (device guard, stream
look-up, size assertions), run here under the interpreter; the generator itself runs on CPU (Inductor's Triton
backend), and its starters are verified by the evaluator (more kinds in tests/test_suite.py's suite)."""
import re

import pytest
import torch

from agent.kernels import inductor
from agent.kernels.inductor import NoStarter, build_candidate, launcher, parse_kernel
from agent.policies import make_policy
from tools.records.store import offline_marker as read_marker
from agent.policy import AttemptView, ProposeContext
from tools.result import EvalResult
from tools.target import load_target

KERNEL = '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 1048576}, filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'in_ptr1': '*fp32', 'out_ptr0': '*fp32', 'xnumel': 'i32'},
                 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9,
                                            regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                            warp_size=32), 'constants': {}},
    inductor_meta={'grid_type': 'Grid1D', 'kernel_name': 'triton_poi_fused_add_mul_0', 'mutated_arg_names': []},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_add_mul_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = tl.load(in_ptr1 + (x0), xmask)
    tmp2 = triton_helpers.maximum(tmp0, tmp1)
    tmp3 = tmp2 * tmp0
    tl.store(out_ptr0 + (x0), tmp3, xmask)
'''
# Inductor's wrapper for a CUDA device, as its codegen writes it (torch/_inductor/codegen/wrapper.py)
WRAPPER = f'''
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda

triton_poi_fused_add_mul_0 = async_compile.triton('triton_poi_fused_add_mul_0', {KERNEL!r}, device_str='cuda')

async_compile.wait(globals())
del async_compile

def call(args):
    arg0_1, arg1_1, arg2_1 = args
    args.clear()
    s0 = arg0_1
    assert_size_stride(arg1_1, (s0, ), (1, ))
    assert_size_stride(arg2_1, (s0, ), (1, ))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((s0, ), (1, ), torch.float32)
        # Topologically Sorted Source Nodes: [maximum, mul], Original ATen: [aten.maximum, aten.mul]
        stream0 = get_raw_stream(0)
        triton_poi_fused_add_mul_0.run(arg1_1, arg2_1, buf0, s0, stream=stream0)
        del arg1_1
        del arg2_1
    return (buf0, )
'''
REFERENCE = '''import torch


class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.maximum(a, b) * a


def get_inputs():
    return [torch.randn(1000), torch.randn(1000)]


def get_init_inputs():
    return []
'''
SOURCES = ["L['args'][0].size()[0]", "L['args'][0]", "L['args'][1]"]


def test_a_cuda_wrapper_becomes_a_standalone_candidate_that_computes_the_reference():
    generated = build_candidate(WRAPPER, SOURCES, REFERENCE, single_output=True)
    source = generated.source
    for gone in ("torch._inductor", "_DeviceGuard", "set_device", "get_raw_stream", "assert_size_stride",
                 "triton_helpers", "get_inputs"):
        assert gone not in source
    assert "_th_maximum(tmp0, tmp1)" in source and "def _th_maximum(a, b):" in source
    # of kloop's runtime helpers only those the call uses (a starter is training data: no dead code)
    assert "def _empty_strided(" in source and "_next_power_of_2" not in source and "_reinterpret" not in source
    assert generated.tunables == {"K0_XBLOCK": [128, 256, 512, 1024, 2048, 4096], "K0_NUM_WARPS": [1, 2, 4, 8, 16]}
    assert generated.kernels == ["triton_poi_fused_add_mul_0"]
    namespace = {}
    exec(compile(source, "candidate", "exec"), namespace)  # under TRITON_INTERPRET=1 (tests/conftest.py)
    a, b = torch.randn(1000), torch.randn(1000)
    out = namespace["ModelNew"]()(a, b)
    assert torch.equal(out, torch.maximum(a, b) * a)
    assert namespace["ModelNew"]()(a[:0], b[:0]).shape == (0,)   # an empty grid launches nothing


def test_library_calls_and_kernel_free_graphs_say_why_there_is_no_starter():
    extern = WRAPPER.replace("triton_poi_fused_add_mul_0.run(arg1_1, arg2_1, buf0, s0, stream=stream0)",
                             "extern_kernels._mm_plus_mm(arg1_1, arg2_1, arg1_1, arg2_1, out=buf0)")
    with pytest.raises(NoStarter, match=r"makes a library call \(extern_kernels\._mm_plus_mm\) instead of generating"):
        build_candidate(extern, SOURCES, REFERENCE, single_output=True)
    only_extern = extern.split("triton_poi_fused_add_mul_0 = async_compile")[0] + "\ndef call(args):\n" \
        "    arg0_1, arg1_1 = args\n    buf0 = empty_strided_cuda((4, 4), (4, 1), torch.float32)\n" \
        "    extern_kernels._mm_plus_mm(arg0_1, arg1_1, arg0_1, arg1_1, out=buf0)\n    return (buf0, )\n"
    with pytest.raises(NoStarter, match="^library_call: .*library call"):  # the library, not "no Triton kernel"
        build_candidate(only_extern, SOURCES[1:], REFERENCE, single_output=True)
    fallback = WRAPPER.replace("buf0 = empty_strided_cuda((s0, ), (1, ), torch.float32)",
                               "buf0 = torch.ops.aten.sort.default(arg1_1)")
    with pytest.raises(NoStarter, match=r"a PyTorch fallback \(torch\.ops\.aten\.sort\.default\)"):
        build_candidate(fallback, SOURCES, REFERENCE, single_output=True)
    identity = "def call(args):\n    arg0_1, = args\n    return (arg0_1, )\n"
    with pytest.raises(NoStarter, match="generated no Triton kernel"):
        build_candidate(identity, SOURCES[1:2], REFERENCE, single_output=True)


class _Recorder:
    """Stands in for a @triton.jit kernel in a launcher: records the grid and the keywords it is launched with."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, kwargs))


def test_a_kernels_configurations_are_inductors_own_and_the_first_is_its_default():
    """Inductor's heuristics give the kernel its configurations (torch.compile autotunes over them); the starter
    starts from the first and, on a GPU, times them all (tests/test_starter_tune.py)."""
    kernel = parse_kernel("triton_poi_fused_add_mul_0", KERNEL)
    assert kernel.size_hints == {"x": 1048576} and len(kernel.configs) > 1
    tunables, defaults = inductor.kernel_tunables(0, kernel)
    first = kernel.configs[0]
    assert defaults == {"K0_XBLOCK": first["kwargs"]["XBLOCK"], "K0_NUM_WARPS": first["num_warps"]}
    choices = inductor.kernel_choices(0, kernel, defaults)
    assert [s["K0_XBLOCK"] for s in choices] == [c["kwargs"]["XBLOCK"] for c in kernel.configs]
    assert all(s["K0_XBLOCK"] in tunables["K0_XBLOCK"] for s in choices)


# A GEMM template over fp32 operands as Inductor writes one (shortened): TF32 off, so its product runs on the FMA units
TEMPLATE = KERNEL[:KERNEL.index("@triton.jit")].replace(
    "@triton_heuristics.pointwise(\n    size_hints={'x': 1048576}, filename=__file__,",
    "@triton_heuristics.template(\n    num_stages=3, num_warps=4, filename=__file__,").replace(
    "'grid_type': 'Grid1D'", "'grid_type': 'FixedGrid'").replace("in_ptr0", "arg_A").replace(
    "in_ptr1", "arg_B").replace("triton_poi_fused_add_mul_0", "triton_tem_fused_mm_0") + \
    """@triton.jit
def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0, ks0):
    ALLOW_TF32 : tl.constexpr = False
    BLOCK : tl.constexpr = 16
    r = tl.arange(0, BLOCK)
    a = tl.load(arg_A + r[:, None] * BLOCK + r[None, :])
    b = tl.load(arg_B + r[:, None] * BLOCK + r[None, :])
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, ks0):
        acc += tl.dot(a, b, allow_tf32=ALLOW_TF32)
    tl.store(out_ptr0 + r[:, None] * BLOCK + r[None, :], acc)
"""


def test_an_fp32_gemm_template_can_switch_to_3xtf32_and_the_switch_is_a_tunable_timed_both_ways():
    kernel = parse_kernel("triton_tem_fused_mm_0", TEMPLATE)
    assert kernel.constexprs == ["TF32X3"] and "def triton_tem_fused_mm_0(arg_A, arg_B, out_ptr0, ks0, TF32X3 : " \
        "tl.constexpr):" in kernel.source
    assert 'acc += tl.dot(a, b, input_precision="tf32x3")' in kernel.source
    tunables, defaults = inductor.kernel_tunables(0, kernel)
    assert tunables["K0_TF32X3"] == [0, 1] and defaults["K0_TF32X3"] == 0   # Inductor's own product by default
    assert [s["K0_TF32X3"] for s in inductor.kernel_choices(0, kernel, defaults)] == [0, 1]
    namespace = {"K0_NUM_WARPS": 4, "K0_NUM_STAGES": 3}
    exec("import triton\nimport triton.language as tl\n" + kernel.source + launcher(0, kernel), namespace)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    for switch in (0, 1):   # the interpreter computes both in fp32: the switch changes nothing but the instruction
        out = torch.zeros(16, 16)
        namespace["K0_TF32X3"] = switch
        namespace["_launch_0"](a, b, out, 2, 1, 1, 1)
        torch.testing.assert_close(out, 2 * a @ b)
    half = TEMPLATE.replace("'arg_A': '*fp32'", "'arg_A': '*fp16'")   # not fp32: nothing to switch
    assert "TF32X3" not in parse_kernel("triton_tem_fused_mm_0", half).constexprs


def test_launch_grids_follow_inductors_grid_types():
    text = KERNEL.replace("'grid_type': 'Grid1D'", "'grid_type': 'Grid2DWithYZOverflow'").replace(
        "def triton_poi_fused_add_mul_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr)",
        "def triton_poi_fused_add_mul_0(in_ptr0, in_ptr1, out_ptr0, ynumel, xnumel, YBLOCK : tl.constexpr, "
        "XBLOCK : tl.constexpr)")
    kernel = parse_kernel("triton_poi_fused_add_mul_0", text)
    assert (kernel.kind, kernel.grid, kernel.constexprs) == ("pointwise", "Grid2DWithYZOverflow", ["YBLOCK", "XBLOCK"])
    recorder = _Recorder()
    namespace = {"triton_poi_fused_add_mul_0": recorder, "K0_XBLOCK": 32, "K0_YBLOCK": 16, "K0_NUM_WARPS": 4}
    exec(launcher(0, kernel), namespace)
    namespace["_launch_0"](None, None, None, 16 * 70000, 100)   # 70,000 y programs: folded into z, as Inductor does
    namespace["_launch_0"](None, None, None, 16 * 3, 100)
    assert [grid for grid, _ in recorder.launches] == [(4, 35000, 2), (4, 3, 1)]
    assert recorder.launches[0][1] == {"YBLOCK": 16, "XBLOCK": 32, "num_warps": 4}

    template = parse_kernel("triton_tem_fused_mm_0", KERNEL.replace("triton_poi_fused_add_mul_0",
                                                                   "triton_tem_fused_mm_0").replace(
        "@triton_heuristics.pointwise(\n    size_hints={'x': 1048576}, filename=__file__,",
        "@triton_heuristics.template(\n    num_stages=3, num_warps=8, filename=__file__,").replace(
        "'grid_type': 'Grid1D'", "'grid_type': 'FixedGrid'").replace(", XBLOCK : tl.constexpr", ""))
    assert (template.kind, template.grid, template.configs[0]["num_stages"]) == ("template", "FixedGrid", 3)
    tunables, defaults = inductor.kernel_tunables(0, template)
    assert defaults == {"K0_NUM_WARPS": 8, "K0_NUM_STAGES": 3} and set(tunables) == set(defaults)
    recorder = _Recorder()
    namespace = {"triton_tem_fused_mm_0": recorder, **defaults}
    exec(launcher(0, template), namespace)
    namespace["_launch_0"](None, None, None, 7, 12, 1, 1)   # the wrapper's grid, computed for the template's tiles
    assert recorder.launches == [((12, 1, 1), {"num_warps": 8, "num_stages": 3})]


@pytest.mark.parametrize("kind, blocks", [
    ("pointwise", ["XBLOCK"]), ("pointwise", ["YBLOCK", "XBLOCK"]), ("persistent_reduction", ["XBLOCK", "R0_BLOCK"]),
    ("reduction", ["XBLOCK", "R0_BLOCK"]),
    ("reduction", ["YBLOCK", "XBLOCK", "R0_BLOCK"]),   # a tiled reduction (level 2's 24: its hidden variants failed)
])
def test_every_constant_a_launcher_reads_is_a_tunable_with_a_default(kind, blocks):
    params = ", ".join(["in_ptr0", "out_ptr0"] + [f"{b[0].lower()}numel" for b in ("Y", "X") if f"{b}BLOCK" in blocks]
                       + (["r0_numel"] if "R0_BLOCK" in blocks else [])
                       + [f"{b} : tl.constexpr" for b in blocks])
    text = KERNEL.replace("@triton_heuristics.pointwise(", f"@triton_heuristics.{kind}(").replace(
        "(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr)", f"({params})")
    kernel = parse_kernel("triton_poi_fused_add_mul_0", text)
    assert (kernel.kind, kernel.constexprs) == (kind, blocks)
    tunables, defaults = inductor.kernel_tunables(0, kernel)
    launch = launcher(0, kernel)
    read = set(re.findall(r"\bK0_\w+", launch))
    assert read <= set(defaults), read - set(defaults)
    if kind == "persistent_reduction":   # its block holds the whole reduction: sized by the launcher, not tuned
        assert "R0_BLOCK = _next_power_of_2(r0_numel)" in launch and "K0_R0_BLOCK" not in defaults
    assert set(tunables) == set(defaults) and all(defaults[name] in tunables[name] for name in defaults)


# A generated starter as a run's settings pin it (agent.kernels.inductor.Generated.to_dict()): nothing is generated.
GIVEN_STARTER = {"source": "import torch\nK0_XBLOCK = 1024\nK0_NUM_WARPS = 4\nclass ModelNew(torch.nn.Module):\n"
                           "    pass\n", "tunables": {"K0_XBLOCK": [512, 1024, 2048], "K0_NUM_WARPS": [2, 4, 8]},
                 "defaults": {"K0_XBLOCK": 1024, "K0_NUM_WARPS": 4}, "notes": "from torch.compile", "kernels": ["k"]}


def test_the_offline_policy_starts_any_target_from_its_inductor_starter(tmp_path):
    target = load_target("tests/targets/kb_leaky_relu.py")
    starter = GIVEN_STARTER
    policy = make_policy("offline", target=target, inductor_starter=starter)  # given: nothing is generated
    assert policy.pinned == {"inductor_starter": starter}
    history, proposals = [], []
    for turn in range(1, 5):   # each proposal recorded as a correct attempt, as the loop would
        proposals.append(policy.propose(ProposeContext(run_id="r", branch=0, turn=turn, target_name=target.name,
                                                       target_source="", language="auto", gpu=None, history=history,
                                                       best=None)))
        history.append(AttemptView(turn, turn, 0, "triton", proposals[-1].source, "correct", [], None, None, None,
                                   None, "", EvalResult()))
    assert read_marker(proposals[0].source) == {"template": "inductor/kb_leaky_relu",
                                                "values": {"K0_NUM_WARPS": 4, "K0_XBLOCK": 1024}}
    assert proposals[0].source.split("\n", 1)[1] == starter["source"]
    assert {p.language for p in proposals} == {"triton"}   # no PTX twin: Inductor's launch is not the catalog's
    assert "K0_XBLOCK = 2048" in proposals[1].source and "from torch.compile" in proposals[0].reasoning


def test_the_offline_policy_stops_when_the_starter_fails_only_at_hidden_variants():
    """torch.compile fixed a size of the main shape (KernelBench 34, 40, 41, 55, ... on an H100): every tunable
    fails the same hidden variant, so searching on would spend the whole budget for nothing."""
    target = load_target("tests/targets/kb_leaky_relu.py")
    starter = GIVEN_STARTER

    def run(outcomes):
        policy = make_policy("offline", target=target, inductor_starter=starter)
        history = []
        for turn, (verdict, reason) in enumerate(outcomes, 1):
            proposal = policy.propose(ProposeContext(run_id="r", branch=0, turn=turn, target_name=target.name,
                                                     target_source="", language="auto", gpu=None, history=history,
                                                     best=None))
            assert not proposal.done, (turn, proposal.reasoning)
            history.append(AttemptView(turn, turn, 0, "triton", proposal.source, verdict, [reason], None, None, None,
                                       None, "", EvalResult()))
        return policy.propose(ProposeContext(run_id="r", branch=0, turn=len(outcomes) + 1, target_name=target.name,
                                             target_source="", language="auto", gpu=None, history=history, best=None))

    hidden = ("incorrect", "hidden variant 1: incorrect")
    stopped = run([hidden] * 3)
    assert stopped.done and not stopped.source and "fixed a size of the main shape" in stopped.reasoning
    assert not run([hidden] * 2).done                                                 # two could be bad luck
    assert not run([hidden, ("incorrect", "main shape, trial 1: output 0: 12 of 4096 elements outside"),
                    hidden]).done                                                     # wrong at the main shape too
    assert not run([hidden, ("runtime_error", "hidden variant 2: runtime_error"), ("correct", "")]).done


@pytest.mark.slow
def test_generated_starters_for_a_gemm_template_and_a_tiled_transpose_are_verified_by_the_evaluator(tmp_path):
    from sandbox.evaluate import evaluate

    transpose = tmp_path / "transpose_add.py"
    transpose.write_text("import torch\nrows = 96\ncols = 80\n\n\nclass Model(torch.nn.Module):\n"
                         "    def forward(self, x, y):\n        return x.t() + y\n\n\ndef get_inputs():\n"
                         "    return [torch.randn(rows, cols), torch.randn(cols, rows)]\n\n\n"
                         "def get_init_inputs():\n    return []\n")
    for spec, kind in (("tests/targets/tiny_linear.py", "triton_tem_"), (str(transpose), "triton_poi_")):
        generated = inductor.generate(spec, small=True)
        assert all(k.startswith(kind) for k in generated.kernels), generated.kernels
        result = evaluate(load_target(spec), generated.source)
        assert result.verdict == "correct", result.reasons


def test_the_main_shape_runs_kernels_compiled_for_its_sizes_and_any_other_shape_the_dynamic_ones():
    """Softmax over 1000 columns: for the main shape's static sizes Inductor makes a persistent reduction (the row in
    one block); for dynamic sizes it cannot prove the row short enough and loops over it. The main kernels' tunables
    are the searched ones; both paths compute the reference, and the evaluator credits the starter."""
    from agent.kernels.starter_tune import _loaded
    from sandbox.evaluate import evaluate

    generated = inductor.generate("softmax", small=True)
    dynamic = [k for k in generated.kernels if not k.endswith("_main")]
    assert [k.startswith("triton_red_") for k in dynamic] == [True]
    assert [k for k in generated.kernels if k.endswith("_main")] == ["triton_per_fused__softmax_0_main"]
    assert sorted(generated.tunables) == ["K1_NUM_WARPS", "K1_XBLOCK"]         # the main kernel's only
    assert {"K0_XBLOCK", "K0_R0_BLOCK"} <= set(generated.defaults)             # the dynamic one keeps its first
    # the interpreter runs libdevice's CPU stand-in, as the evaluator's executor does (sandbox/executor.py)
    cpu_source = generated.source.replace("from triton.language.extra import libdevice",
                                          "import sandbox.libdevice_cpu as libdevice")
    with _loaded(cpu_source) as module:
        assert module._MAIN_LAYOUT == (((64, 1000), (1000, 1), 0, "torch.float32"),)
        called = []
        for name in ("_inductor_call", "_inductor_call_main"):
            original = getattr(module, name)
            setattr(module, name, lambda args, device, name=name, original=original:
                    called.append(name) or original(args, device))
        for x in (torch.randn(64, 1000), torch.randn(33, 517)):   # the main shape, a hidden variant's kind
            torch.testing.assert_close(module.ModelNew()(x), torch.softmax(x, dim=1))
        assert called == ["_inductor_call_main", "_inductor_call"]
    result = evaluate(load_target("softmax"), generated.source)
    assert result.verdict == "correct", result.reasons


def test_split_counts_fill_the_gpu_and_divide_k():
    assert inductor._split_count(256, 256, 131072 * 4) == 32      # 16 tiles of 64x64: 512 programs
    assert inductor._split_count(16, 24, 4096) == 64              # at most MAX_SPLIT_K
    assert inductor._split_count(16, 24, 4104) == 8               # a power of two that divides K
    assert inductor._split_count(1024, 1024, 16384) == 1          # K < 32 x max(M, N): one GEMM
    assert inductor._split_count(4096, 4096, 131072 * 4) == 1     # 4096 tiles already fill the GPU


def test_only_a_full_precision_long_k_matmul_is_split():
    """The rewrite on Dynamo's graph, before Inductor: fp32 splits K; bf16 partial products would each be rounded, so
    bf16 keeps one GEMM; a matrix-vector product is a reduction in any precision."""
    import torch._dynamo

    graphs = []

    def backend(gm, example_inputs):
        graphs.append((inductor.rewrite_long_matmuls(gm), {str(n.target) for n in gm.graph.nodes}))
        return gm.forward

    for dtype, k, n in ((torch.float32, 4096, 24), (torch.bfloat16, 4096, 24), (torch.bfloat16, 4096, 1),
                        (torch.float32, 256, 24)):
        torch._dynamo.reset()
        a, b = torch.rand(16, k, dtype=dtype), torch.rand(k, n, dtype=dtype)
        torch.testing.assert_close(torch.compile(lambda x, y: x @ y, backend=backend, dynamic=False)(a, b), a @ b,
                                   rtol=1e-2, atol=1e-2)
    assert [count for count, _ in graphs] == [1, 0, 1, 0]
    assert any("bmm" in t for t in graphs[0][1]) and not any("bmm" in t for t in graphs[2][1])


@pytest.mark.slow
@pytest.mark.parametrize("spec, main_kernels", [
    ("tests/targets/kb_long_k_matmul.py", ["_tem_fused_bmm_transpose_view_0_main", "_fused_sum_1_main"]),
    ("tests/targets/kb_matvec.py", ["_fused_mul_sum_view_0_main"]),   # a reduction, not a template
])
def test_a_long_k_matmul_splits_k_and_a_matrix_vector_product_is_a_reduction(spec, main_kernels):
    """Inductor offers no GEMM template when K >= 32 x max(M, N) (level 1's 4 and 6 had no main-shape kernels), and one
    GEMM would leave most SMs idle: the static trace splits K (a batched GEMM, then a sum) or, for a matrix-vector
    product, reduces a product. The dynamic kernels stay one GEMM; the evaluator credits both paths."""
    from sandbox.evaluate import evaluate

    generated = inductor.generate(spec, small=True)
    main = [k for k in generated.kernels if k.endswith("_main")]
    assert len(main) == len(main_kernels) and all(k.endswith(e) for k, e in zip(main, main_kernels)), main
    result = evaluate(load_target(spec), generated.source)
    assert result.verdict == "correct", result.reasons


@pytest.mark.slow
@pytest.mark.parametrize("spec, expect", [
    ("tests/targets/kb_conv_transpose_gelu.py", "_conv("),     # conv + fused epilogue: channels change in variants
    ("tests/targets/kb_grouped_conv.py", "_conv("),            # grouped, strided: a starter with no Triton of its own
    ("tests/targets/kb_depthwise_conv.py", "_conv("),          # groups = channels, which the variants change
    ("tests/targets/tiny_layernorm.py", "triton_"),            # the normalized shape is a module constant
    ("tests/targets/kb_max_pool1d.py", "triton_poi_"),         # ATen's max_pool1d reads the length as an int
    ("tests/targets/kb_avg_pool3d.py", "triton_poi_"),         # Inductor calls ATen for a 27-element window
    ("tests/targets/kb_attention.py", "triton_tem_"),          # ... and for attention: here batched GEMM templates
    ("tests/targets/kb_multihead_attention.py", "triton_tem_"),  # nn.MultiheadAttention: a width check, a float scale
    ("tests/targets/kb_linear_instancenorm.py", "triton_tem_"),  # InstanceNorm's warning broke Dynamo's graph
    ("tests/targets/kb_instance_norm.py", "triton_red_"),      # ... and its channel check fixed the channel count
    ("tests/targets/kb_feature_view.py", "self.feature_size"),  # a module's int, which Dynamo makes a constant
])
def test_starters_take_the_sizes_that_the_hidden_variants_change_at_run_time(spec, expect):
    """torch.compile alone fixes these sizes as constants (a conv template's channels, a LayerNorm's normalized shape, a
    pooled length, a multi-head attention's width): such a starter passes the main shape and fails every hidden
    variant. Or it has no starter (a transposed conv, a large avg_pool3d window, attention, a warning that breaks the
    graph)."""
    from sandbox.evaluate import evaluate

    target = load_target(spec)
    generated = inductor.generate(spec, small=True)
    assert expect in generated.source
    if expect == "_conv(":
        assert {"CONV_BLOCK_M", "CONV_NUM_WARPS"} <= set(generated.tunables) and "cuDNN" not in generated.source
    assert len(target.shapes(small=True)) == 3          # the main shape and two hidden variants
    result = evaluate(target, generated.source)
    assert result.verdict == "correct", result.reasons


# -- level 3: several graphs, recurrent layers, library calls ----------------------------------------------------
def test_a_no_starter_reason_leads_with_its_class_and_keeps_it_through_a_child_reply():
    reason = "torch.compile splits the reference into 0 graphs (graph breaks); a standalone starter needs one"
    error = NoStarter(reason)
    assert (error.kind, error.reason, str(error)) == ("graph_break", reason, f"graph_break: {reason}")
    again = NoStarter(str(error))   # generate() re-raises the child's one line
    assert (again.kind, again.reason) == ("graph_break", reason)
    assert NoStarter("torch.compile did not finish generating Triton within 300 s").kind == "timeout"
    assert NoStarter("Inductor's code for this reference makes a library call (x) instead").kind == "library_call"
    assert NoStarter("something new").kind == "other"


def _cpu_module(source: str) -> dict:
    """A starter's module as the evaluator's CPU executor runs it (libdevice's CPU stand-in)."""
    namespace = {}
    cpu_source = source.replace("from triton.language.extra import libdevice",
                                "import sandbox.libdevice_cpu as libdevice")
    exec(compile(cpu_source, "starter", "exec"), namespace)
    return namespace


# Built without the rules (which refuse torch._dynamo in a candidate): a graph break the test puts there
TWO_GRAPHS = """import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 48), torch.nn.Linear(48, 32)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
        return self.fc2(y) * 2 + x, y
"""


def test_a_reference_split_into_two_graphs_runs_both_graphs_kernels_in_one_forward():
    """Each graph's own kernels; the second takes the first's output and the forward's input, as the reference's
    forward passed them; the outputs come from both graphs."""
    torch.manual_seed(0)
    model = _cpu_module(TWO_GRAPHS)["Model"]()
    wrapper, sources = inductor.capture(model, [torch.randn(16, 32)])
    assert sources == [f"L['args'][{i}]" for i in range(5)]   # 4 parameters and the input
    assert "args_c1 = [args[2], args[3], out0[0].shape[0], out0[0], args[4]]" in wrapper
    generated = build_candidate(wrapper, sources, TWO_GRAPHS, single_output=False, interpreter=True)
    assert [k[-3:] for k in generated.kernels] == ["_g0", "_g1"]
    new = _cpu_module(generated.source)["ModelNew"]()
    new.load_state_dict(model.state_dict())
    with torch.no_grad():
        for batch in (16, 5):   # the traced size and another: sizes pass between the graphs at run time
            x = torch.randn(batch, 32)
            for got, want in zip(new(x), model(x)):
                torch.testing.assert_close(got, want)


BREAK_FIRST = TWO_GRAPHS.replace("""        y = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
""", """        torch._dynamo.graph_break()
        y = torch.relu(self.fc1(x)) * x.shape[0]
""")


def test_a_graph_break_before_the_first_op_leaves_one_graph_named_by_the_forwards_locals():
    """Dynamo then compiles the forward's resumed frame: its inputs are L['x'], L['x'].size()[0],
    L['self']._modules['fc1']._parameters['weight'], not the traced function's arguments (level 3's 31 and 32 had no
    starter on torch 2.11: "a graph input the generator cannot rebuild"). Found by identity, as between graphs."""
    torch.manual_seed(0)
    model = _cpu_module(BREAK_FIRST)["Model"]()
    wrapper, sources = inductor.capture(model, [torch.randn(16, 32)])
    assert sources == [f"L['args'][{i}]" for i in range(5)]
    assert "args[4].shape[0]" in wrapper
    generated = build_candidate(wrapper, sources, BREAK_FIRST, single_output=False, interpreter=True)
    new = _cpu_module(generated.source)["ModelNew"]()
    new.load_state_dict(model.state_dict())
    with torch.no_grad():
        for batch in (16, 5):
            x = torch.randn(batch, 32)
            for got, want in zip(new(x), model(x)):
                torch.testing.assert_close(got, want)


def test_a_reference_whose_tiling_analysis_asserts_is_captured_without_it(monkeypatch):
    """torch 2.11's coalescing analysis asserts, on a GPU, on a reduction over the channels of a convolution's
    output (KernelBench level 2's 25, 36, 58, 92): that failure is made here, and the capture goes on without it."""
    import torch._inductor.config as inductor_config
    import torch._inductor.tiling_utils as tiling_utils

    analysed = []

    def asserting(*args, **kwargs):
        analysed.append(inductor_config.triton.coalesce_tiling_analysis)
        raise AssertionError

    monkeypatch.setattr(tiling_utils, "get_pw_red_splits", asserting)

    class ConvMin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.tanh(torch.min(self.conv(x), dim=1, keepdim=True)[0])

    wrapper, _ = inductor.capture(ConvMin(), [torch.randn(2, 3, 8, 8)])
    assert analysed and set(analysed) == {True} and "def call(" in wrapper
    monkeypatch.setattr(inductor, "_capture", lambda *args: analysed.append("again") or 1 / 0)
    with pytest.raises(ZeroDivisionError):   # any other failure is not captured again
        inductor.capture(ConvMin(), [torch.randn(2, 3, 8, 8)])
    assert analysed[-1] == "again" and analysed.count("again") == 1


def test_a_graph_break_that_reads_tensor_data_has_no_starter():
    class Scaled(torch.nn.Module):
        def forward(self, x):
            return x / x.abs().max().item()   # the value would be a constant of the second graph

    with pytest.raises(NoStarter, match=r"^graph_break: .*reads a tensor's data"):
        inductor.capture(Scaled(), [torch.randn(8, 8)])


def test_inductors_library_matmuls_and_convolutions_run_kloops_own_triton():
    """cuBLAS and cuDNN calls in Inductor's wrapper (extern_kernels.addmm, bmm, convolution) become kloop's GEMM and
    convolution launchers, their tunables the starter's."""
    wrapper = WRAPPER.split("triton_poi_fused_add_mul_0 = async_compile")[0] + """
def call(args):
    arg0_1, arg1_1, arg2_1, arg3_1, arg4_1 = args
    buf0 = empty_strided_cuda((6, 5), (5, 1), torch.float32)
    extern_kernels.addmm(arg2_1, arg0_1, reinterpret_tensor(arg1_1, (7, 5), (1, 7), 0), alpha=1, beta=1, out=buf0)
    buf1 = empty_strided_cuda((2, 3, 5), (15, 5, 1), torch.float32)
    extern_kernels.bmm(reinterpret_tensor(buf0, (2, 3, 5), (15, 5, 1), 0), arg3_1, out=buf1)
    buf2 = extern_kernels.convolution(arg4_1, arg3_1, None, stride=(1,), padding=(0,), dilation=(1,),
                                      transposed=False, output_padding=(0,), groups=1)
    return (buf0, buf1, buf2)
"""
    sources = [f"L['args'][{i}]" for i in range(5)]
    generated = build_candidate(wrapper, sources, REFERENCE.replace("return torch.maximum(a, b) * a", "pass"),
                                single_output=False)
    assert {"GEMM_BLOCK_M", "CONV_BLOCK_M"} <= set(generated.tunables) and "extern_kernels" not in generated.source
    assert "def _addmm(" in generated.source and "def _mm(" not in generated.source   # only the launchers it calls
    call = _cpu_module(generated.source)["_inductor_call"]
    a, w, bias, b, x = torch.randn(6, 7), torch.randn(5, 7), torch.randn(5), torch.randn(2, 5, 5), torch.randn(2, 5, 9)
    mm, bmm, conv = call([a, w, bias, b, x], None)
    torch.testing.assert_close(mm, torch.addmm(bias, a, w.t()))
    torch.testing.assert_close(bmm, torch.bmm(mm.view(2, 3, 5), b))
    torch.testing.assert_close(conv, torch.nn.functional.conv1d(x, b))


@pytest.mark.parametrize("layer", [
    torch.nn.LSTM(12, 20, num_layers=2, batch_first=True),
    torch.nn.GRU(12, 20, num_layers=2, bidirectional=True),
    torch.nn.RNN(12, 20, nonlinearity="relu", bias=False),
    torch.nn.RNN(12, 20, bidirectional=True, batch_first=True),
])
@pytest.mark.parametrize("persistent", [0, 1], ids=["a launch per step", "a launch per layer"])
def test_kloops_recurrence_computes_lstm_gru_and_rnn_layers(monkeypatch, layer, persistent):
    from agent.kernels import inductor_rnn
    import sandbox.libdevice_cpu

    monkeypatch.setattr(inductor_rnn, "libdevice", sandbox.libdevice_cpu)   # as the CPU executor runs it
    monkeypatch.setattr(inductor_rnn, "RNN_PERSISTENT", persistent)
    monkeypatch.setattr(inductor_rnn, "RNN_BLOCK_H", 16)   # 20 hidden units: two tiles a step, the second partial
    torch.manual_seed(0)
    directions = 2 if layer.bidirectional else 1
    x = torch.randn(5, 7, 12)
    h0 = torch.randn(layer.num_layers * directions, 5 if layer.batch_first else 7, 20)
    c0 = torch.randn_like(h0) if layer.mode == "LSTM" else None
    weights = [getattr(layer, name) for name in layer._flat_weights_names]
    with torch.no_grad():
        out, h, c = inductor_rnn._recurrent(x, h0, c0, weights, layer.mode, layer.num_layers, layer.bidirectional,
                                            layer.batch_first)
        want_out, want_state = layer(x, (h0, c0) if c0 is not None else h0)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(h, want_state[0] if c0 is not None else want_state)
    if c0 is not None:
        torch.testing.assert_close(c, want_state[1])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_on_a_gpu_the_layer_kernels_programs_meet_at_every_step(monkeypatch, mode):
    """The one-launch-per-layer recurrence on a GPU, where its programs really run at once and wait for each other
    after every step: 200 steps, both directions, 6 tiles a direction; a missed barrier reads a stale h."""
    from agent.kernels import inductor_rnn

    monkeypatch.setattr(inductor_rnn, "RNN_PERSISTENT", 1)
    monkeypatch.setattr(inductor_rnn, "RNN_BLOCK_H", 16)
    torch.manual_seed(0)
    layer = getattr(torch.nn, mode)(24, 48, num_layers=2, bidirectional=True).cuda().double()
    x, h0 = torch.randn(200, 20, 24, device="cuda"), torch.randn(4, 20, 48, device="cuda")
    c0 = torch.randn_like(h0) if mode == "LSTM" else None
    weights = [getattr(layer, name).float() for name in layer._flat_weights_names]
    with torch.no_grad():
        out, h, c = inductor_rnn._recurrent(x, h0, c0, weights, mode, 2, True, False)
        want, state = layer(x.double(), (h0.double(), c0.double()) if c0 is not None else h0.double())
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h.double(), state[0] if c0 is not None else state, atol=1e-4, rtol=1e-4)


def test_a_recurrent_layer_kloop_does_not_compute_says_so():
    class Projected(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, proj_size=4)

        def forward(self, x):
            return self.lstm(x)[0]

    with pytest.raises(NoStarter, match=r"^recurrent: recurrent layer lstm \(LSTM\) projects its hidden state"):
        inductor.capture(Projected(), [torch.randn(3, 2, 8)])


@pytest.mark.slow
@pytest.mark.parametrize("spec, expect", [
    ("tests/targets/kb_lstm.py", "_recurrent("),        # no graph for the LSTM: kloop's recurrence, a GEMM template
    ("tests/targets/kb_small_cnn.py", "_conv("),        # kloop's convolution, Inductor's pool and GEMM template
])
def test_level3_kinds_of_network_get_starters_the_evaluator_verifies(spec, expect):
    from sandbox.evaluate import evaluate

    generated = inductor.generate(spec, small=True)
    assert expect in generated.source and "triton_tem_" in " ".join(generated.kernels)
    result = evaluate(load_target(spec), generated.source)
    assert result.verdict == "correct", result.reasons


@pytest.mark.gpu
def test_on_a_gpu_the_lstm_starter_times_its_recurrence_settings_and_the_evaluator_verifies_it(tmp_path):
    """On a GPU the recurrence's products are 3xTF32 tensor-core dots, its error carried over every step (level 3's
    LSTMs run 512 steps through 6 layers), and its RNN_* and GEMM_* settings are timed at generation."""
    from sandbox.evaluate import evaluate

    spec = tmp_path / "lstm_long.py"
    spec.write_text(open("tests/targets/kb_lstm.py").read().replace("sequence_length = 6", "sequence_length = 512")
                    .replace("num_layers = 2", "num_layers = 6").replace("hidden_size = 24", "hidden_size = 256"))
    generated = inductor.generate(str(spec), small=False)
    assert "_recurrent(" in generated.source and "defaults timed at generation" in generated.notes
    assert any("RNN_BLOCK_H" in choice for group in generated.choices for choice in group)
    result = evaluate(load_target(str(spec)), generated.source)
    assert result.verdict == "correct", result.reasons


def test_a_reference_import_the_rules_refuse_becomes_a_probe_in_the_starter():
    """Level 3's Mamba problems import einops, which only their forward uses (ModelNew replaces it): the starter
    keeps the import in a try that does without it, which the rules allow; an allowed import stays as it is."""
    from tools.rules import check_source

    reference = ("import math\nimport torch\nfrom einops import rearrange\nimport einops.layers.torch as lt\n\n\n"
                 "class Model(torch.nn.Module):\n    def forward(self, x):\n        return rearrange(x, 'a b -> b a')\n\n"
                 "\ndef get_inputs():\n    return [torch.randn(2, 3)]\n")
    part = inductor.reference_part(reference)
    assert part.startswith("import math\nimport torch\ntry:  # the reference's forward alone uses it\n"
                           "    from einops import rearrange\nexcept ImportError:\n    pass\ntry:")
    assert "get_inputs" not in part
    candidate = part + "\n\nclass ModelNew(Model):\n    def forward(self, x):\n        return x\n"
    assert not [r for r in check_source(candidate) if "import" in r]
    assert [r for r in check_source(reference + candidate[len(part):]) if "einops is not allowed" in r]


def test_the_ints_of_the_references_own_modules_that_checked_shapes_change_become_the_captures_arguments():
    """A module's int that a hidden variant changes (NetVLAD's feature_size) must not be a constant of the starter;
    one that no checked shape changes (or that only some shapes' Models have, ResNet101's deeper layers) stays one,
    and torch.nn's own modules keep their sizes in their weights."""
    checked = [{"n_head": 8, "layer3.7.stride": 1, "dim": 1}, {"n_head": 4, "dim": 1},
               {"n_head": 2, "dim": 1, "layer3.7.stride": 1}]
    assert inductor.varying_ints(checked) == ["n_head"]
    assert inductor.varying_ints(None) == []
    ints = load_target("tests/targets/kb_feature_view.py").module_ints()
    assert [i["feature_size"] for i in ints] == [24, 9, 11, 24, 9, 5]    # full size's shapes, then the CPU size's
    assert load_target("tests/targets/kb_multihead_attention.py").module_ints() == [{}] * 6
    assert inductor.argument_expressions(["L['module']._modules['attn'].n_head", "L['args'][2].size()[1]"]) == \
        ["self._modules['attn'].n_head", "flat[2].shape[1]"]
    block = torch.nn.Module()   # the main shape's value of such an input, read by attribute lookups
    block.attn = torch.nn.Module()
    block.attn.n_head, block.width = 6, 32
    assert inductor.module_int(block, "L['module']._modules['attn'].n_head") == 6
    assert inductor.module_int(block, "L['module'].width") == 32


def test_weight_sizes_no_checked_shape_changes_are_constants_and_the_starter_refuses_others():
    """Every weight size symbolic, ResNet18's capture spent over 600 s in Inductor and sympy (30 s with its sizes
    fixed). A size only the constructor reads (tiny_linear's out_features) is a constant of the starter's dynamic
    kernels; in_features, which the hidden variants change, stays an argument. A Model built with another
    out_features is refused, never computed with the wrong size."""
    from agent.kernels.starter_tune import _loaded
    from sandbox.evaluate import evaluate

    spec = "tests/targets/tiny_linear.py"
    assert inductor.fixed_sizes([(40, 48), (40,)], load_target(spec).state_shapes()) == ((0, 0, 40), (1, 0, 40))
    assert inductor.fixed_sizes([(4, 3)], [[(4, 3)], [(4, 5)]]) == ((0, 0, 4),)
    # a Model with another tensor (fewer layers at CPU size) is one this starter cannot serve: it fixes nothing
    assert inductor.fixed_sizes([(4, 3)], [[(4, 3)], [(4, 5), (2,)]]) == ((0, 0, 4), (0, 1, 3))
    assert inductor.fixed_sizes([(4, 3)], None) == ()                       # no Model on the meta device
    generated = inductor.generate(spec, small=True)
    with _loaded(generated.source) as module:
        assert module._FIXED_SIZES == ((0, 0, 40), (1, 0, 40))
        for in_features in (48, 17):   # the main shape's kernels, then the dynamic ones
            model = module.ModelNew(in_features, 40)
            x = torch.randn(5, in_features)
            torch.testing.assert_close(model(x), torch.nn.functional.linear(x, model.linear.weight, model.linear.bias))
        with pytest.raises(ValueError, match="parameter or buffer 0 has 24 in dim 0; this starter's kernels were "
                                             "generated for 40"):
            module.ModelNew(48, 24)(torch.randn(5, 48))
    result = evaluate(load_target(spec), generated.source)   # the main shape and two hidden variants
    assert result.verdict == "correct", result.reasons
