"""The CPU path judges as a GPU would: the planner answers CUDA probes as an H100 (sandbox/cuda_probes.py), the
interpreter executor computes as compiled Triton (sandbox/libdevice_cpu.py: fp32 scalars, bf16, tf32 dots, typed
comparisons, fast math with the GPU's error), and the recorder refuses the globals Triton's compiler refuses.
Each end-to-end pair (an honest kernel credited, a cheat refused) is in tests/test_evaluator.py; these are the
parts, fast. Scripts that patch torch or Triton run in a process of their own."""
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda.libdevice import rsqrt
from triton.runtime.interpreter import TensorHandle

from sandbox import libdevice_cpu
from sandbox.record import PlanRefused, _interpreted_kernel

REPO = Path(__file__).resolve().parent.parent


# One process for both (each start imports torch and Triton: seconds on a shared machine); it patches both.
SCRIPT = """import numpy as np, torch, triton, triton.language as tl
from sandbox import cuda_probes
from sandbox.libdevice_cpu import gpu_numerics, scalar_argument

cuda_probes.install()
x = torch.randn(4)
y = torch.empty(4, device="cuda")
print(x.is_cuda, x.is_cpu, x.device, x.get_device(), x.device == triton.runtime.driver.active.get_active_torch_device())
print(y.untyped_storage().device, x.cuda() is x, x.to("cuda").untyped_storage().device, torch.zeros(2, device=0).device)
print(torch.cuda.is_available(), torch.cuda.current_device(), torch.cuda.get_device_capability(),
      torch.cuda.get_device_properties(x.device).multi_processor_count,
      triton.runtime.driver.active.utils.get_device_properties(0)["multiprocessor_count"], torch.version.cuda)
with torch.cuda.device(x.device.index):
    print(torch.empty(2, device="meta").device, torch.empty(2, device="meta").is_cuda)

gpu_numerics()

@triton.jit
def bf16_ops(x_ptr, y_ptr, out_ptr, stats_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(out_ptr + offs, x * y + x)
    tl.store(stats_ptr, tl.max(x, 0))
    tl.store(stats_ptr + 1, tl.min(x, 0))
    tl.store(stats_ptr + 2, (x > y).to(tl.int32).to(tl.bfloat16).sum(0))

@triton.jit
def rows(x_ptr, out_ptr, n_rows, n_cols, eps, big, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = (row < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0) + (big - 3_000_000_000).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (x + eps.to(tl.float32)).to(tl.bfloat16), mask=mask)

@triton.jit
def persistent(x_ptr, out_ptr, n_rows, BLOCK: tl.constexpr):
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):   # the tutorials' persistent loop
        cols = tl.arange(0, BLOCK)
        tl.store(out_ptr + row * BLOCK + cols, tl.load(x_ptr + row * BLOCK + cols) * 2)

@triton.jit
def dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
    r = tl.arange(0, M)
    tile = r[:, None] * M + r[None, :]
    tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))

torch.manual_seed(0)
x, y = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
out, stats = torch.empty_like(x), torch.empty(3, dtype=torch.bfloat16)
bf16_ops[(1,)](x, y, out, stats, BLOCK=64)
print(torch.equal(out, x * y + x), stats.tolist() == [x.max().item(), x.min().item(), float((x > y).sum())])
a, o = torch.randn(3, 10), torch.empty(3, 10, dtype=torch.bfloat16)
rows[(3,)](a, o, 3, 10, scalar_argument(0.1, "fp32"), scalar_argument(3_000_000_001, "i64"), BLOCK=16)
print(torch.equal(o, (a + 1 + torch.tensor(0.1, dtype=torch.float32)).bfloat16()))
for dtype in (torch.bfloat16, torch.float32):
    a, b, c = torch.randn(16, 16, dtype=dtype), torch.randn(16, 16, dtype=dtype), torch.empty(16, 16)
    dot[(1,)](a, b, c, M=16)
    cut = lambda t: (t.float().view(torch.int32) & -8192).view(torch.float32) if dtype == torch.float32 else t.float()
    print(dtype, (c.double() - cut(a).double() @ cut(b).double()).abs().max().item() < 1e-4,
          (c.double() - a.double() @ b.double()).abs().max().item() > 1e-3)
a, o = torch.randn(7, 8), torch.empty(7, 8)
persistent[(3,)](a, o, 7, BLOCK=8)
print("persistent loop", torch.equal(o, a * 2))
"""


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> list[str]:
    path = tmp_path_factory.mktemp("parity") / "script.py"
    path.write_text(SCRIPT)   # Triton's interpreter reads a kernel's source from its file
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout.split("\n")


def test_cuda_probes_answer_as_one_h100_and_allocations_stay_on_the_cpu(printed):
    assert printed[:4] == ["True False cuda:0 0 True", "cpu True cpu cuda:0", "True 0 (9, 0) 132 132 13.0", "meta False"]


def test_the_interpreter_computes_as_compiled_triton(printed):
    """bf16 values, not bit patterns; fp32 and int64 scalars; a scalar & block mask; bf16 dots exact in fp32, fp32 dots at
    tf32 (the low 13 mantissa bits dropped); a program id as a loop's start (Triton 3.6's interpreter alone refused
    it: sandbox/libdevice_cpu.interpreter_compat)."""
    assert printed[4:10] == ["True True", "True", "torch.bfloat16 True False", "torch.float32 True True",
                             "persistent loop True", ""]


def _fast(name, *xs):
    args = [tl.tensor(TensorHandle(np.asarray(x, dtype=np.float32), tl.float32), tl.float32) for x in xs]
    return getattr(libdevice_cpu, name)(*args).handle.data.astype(np.float64)


def _ulps(got, exact):
    return np.abs(got - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


def test_fast_math_has_the_gpus_error_not_none():
    """CUDA's documented bounds: __expf 2 + floor(|1.16 x|) ulp, __sinf 2^-21.41 absolute on [-pi, pi], tanh.approx
    2^-10.987 relative; exact results would let a kernel that leans on the GPU's error pass on the CPU."""
    x = np.linspace(-20, 20, 4001, dtype=np.float32)
    ulps = _ulps(_fast("fast_expf", x), np.exp(x.astype(np.float64)))
    assert (ulps <= 2 + np.floor(np.abs(1.16 * x))).all() and ulps.max() > 4
    small = np.linspace(-math.pi, math.pi, 4001, dtype=np.float32)
    sin_error = np.abs(_fast("fast_sinf", small) - np.sin(small.astype(np.float64)))
    assert sin_error.max() <= 2**-21 and sin_error.max() > 2**-24   # CUDA documents 2^-21.41
    big = np.float32([12345.678, -30000.5])   # the argument, in turns, keeps only fp32's bits: off by ~1e-3
    assert np.abs(_fast("fast_sinf", big) - np.sin(big.astype(np.float64))).max() > 1e-4
    nonzero = x[x != 0]
    tanh_error = np.abs(_fast("fast_tanhf", nonzero) / np.tanh(nonzero.astype(np.float64)) - 1)
    assert tanh_error.max() <= 2**-10.98 and tanh_error.max() > 2**-13
    quotients = _fast("fast_dividef", np.float32([1.0, 14.0, 1.0]), np.float32([3.0, -7.0, 2.0**127]))
    assert _ulps(quotients[:2], np.float64([1 / 3, -2.0])).max() <= 2 and quotients[2] == 0   # 0 past 2^126
    assert _ulps(_fast("fast_logf", np.float32([0.75, 5.0, 1e6])), np.log([0.75, 5.0, 1e6])).max() < 8


def test_bf16_libdevice_calls_compute_on_values():
    bits = np.array([0xBF80, 0x4000], dtype=np.uint16)   # -1.0, 2.0 in bf16
    x = tl.tensor(TensorHandle(bits, tl.bfloat16), tl.bfloat16)
    out = libdevice_cpu.abs(x).handle.data
    assert out.dtype == np.uint16 and out.tolist() == [0x3F80, 0x4000]


triton_cast = tl.cast
LIMIT = 4
LIMIT_CONSTEXPR = tl.constexpr(4)
CALLS = [0]


def reads_plain_global(x_ptr):
    return x_ptr + LIMIT


def mutates_global_list(x_ptr):
    CALLS[0] = CALLS[0] + 1


def reads_constexpr_globals(x_ptr, n=LIMIT):
    return x_ptr + LIMIT_CONSTEXPR + n + tl.float32.primitive_bitwidth


triton_erf = libdevice.erf   # a module-level alias of a Triton function, as Unsloth writes tanh


def calls_triton_functions_by_module_names(x):
    return triton_erf(x) + rsqrt(x) + triton_cast(x, tl.float32)


@pytest.mark.parametrize("fn, name", [(reads_plain_global, "LIMIT (a int)"), (mutates_global_list, "CALLS (a list)")])
def test_a_kernel_reads_only_the_globals_tritons_compiler_lets_it(fn, name):
    with pytest.raises(PlanRefused) as refused:
        _interpreted_kernel(fn)
    assert refused.value.status == "compile_error" and f"cannot access global variable {name}" in str(refused.value)
    # a tl.constexpr global, a dtype's module and a global in a parameter's default (as Triton allows) travel
    assert _interpreted_kernel(reads_constexpr_globals)["constants"] == {"LIMIT_CONSTEXPR": 4, "LIMIT": 4}


def test_triton_functions_a_module_names_travel_written_out_from_triton():
    kernel = _interpreted_kernel(calls_triton_functions_by_module_names)
    assert kernel["aliases"]["kloop_triton"] == "triton" and kernel["constants"] == {}
    assert kernel["source"].splitlines()[1].strip() == (
        "return kloop_triton.language.extra.libdevice.erf(x) + kloop_triton.language.extra.libdevice.rsqrt(x) + "
        "kloop_triton.language.cast(x, tl.float32)")


def test_a_bare_assert_names_its_line_and_a_gpu_only_failure_says_so(tmp_path, monkeypatch):
    from sandbox.planner import _said

    (tmp_path / "candidate.py").write_text("def forward(x):\n    assert x > 1\n")
    namespace = {}
    exec(compile((tmp_path / "candidate.py").read_text(), str(tmp_path / "candidate.py"), "exec"), namespace)
    with pytest.raises(AssertionError) as failed:
        namespace["forward"](0)
    assert _said(failed.value) == "AssertionError: `assert x > 1` failed (candidate line 2)"
    monkeypatch.setenv("TRITON_INTERPRET", "1")   # a planner on a GPU machine compiles for its GPU
    gpu_only = _said(RuntimeError("Torch not compiled with CUDA enabled"))
    assert gpu_only.endswith("(planned under Triton's CPU interpreter, which cannot run this: it needs a GPU)")
    monkeypatch.delenv("TRITON_INTERPRET")
    assert _said(RuntimeError("Torch not compiled with CUDA enabled")) == \
        "RuntimeError: Torch not compiled with CUDA enabled"


# -- on a GPU: the emulation against the hardware it stands for ------------------------------------------------
FAST_UNARY = ["fast_expf", "fast_exp10f", "fast_logf", "fast_log2f", "fast_log10f", "fast_sinf", "fast_cosf",
              "fast_tanf", "fast_tanhf"]


def _gpu_fast(name: str, x):
    import torch
    import triton

    @triton.jit
    def apply(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n)
        if FN == 0:
            y = libdevice.fast_expf(v)
        elif FN == 1:
            y = libdevice.fast_exp10f(v)
        elif FN == 2:
            y = libdevice.fast_logf(v)
        elif FN == 3:
            y = libdevice.fast_log2f(v)
        elif FN == 4:
            y = libdevice.fast_log10f(v)
        elif FN == 5:
            y = libdevice.fast_sinf(v)
        elif FN == 6:
            y = libdevice.fast_cosf(v)
        elif FN == 7:
            y = libdevice.fast_tanf(v)
        else:
            y = libdevice.fast_tanhf(v)
        tl.store(out_ptr + offs, y, mask=offs < n)

    data = torch.tensor(x, dtype=torch.float32, device="cuda")
    out = torch.empty_like(data)
    apply[(triton.cdiv(data.numel(), 1024),)](data, out, data.numel(), FN=FAST_UNARY.index(name), BLOCK=1024)
    return out.cpu().double().numpy()


def _error_bound(name: str, x, y):
    """The documented error of each fast function at x (result y): CUDA's __expf 2 + 1.16|x| ulp, sin/cos.approx
    2^-20.9 plus one fp32 step of the argument in turns, lg2.approx 2^-21, tanh.approx 2^-10.987 relative."""
    x, y = np.abs(x).astype(np.float64), np.abs(y)
    ulp = np.spacing(y.astype(np.float32)).astype(np.float64)
    turn_step = 2 * math.pi * np.spacing((x / (2 * math.pi)).astype(np.float32)).astype(np.float64)
    return {"fast_expf": (2 + 1.16 * x) * ulp, "fast_exp10f": (2 + 2.95 * x) * ulp,
            "fast_logf": 2**-21 + 2 * ulp, "fast_log2f": 2**-21 + 2 * ulp, "fast_log10f": 2**-21 + 2 * ulp,
            "fast_sinf": 2**-20.9 + turn_step, "fast_cosf": 2**-20.9 + turn_step,
            "fast_tanf": (2**-20 + turn_step) * (1 + y * y), "fast_tanhf": 2**-10.98 * y}[name]


@pytest.mark.gpu
@pytest.mark.parametrize("name", FAST_UNARY)
def test_the_fast_math_emulation_has_the_gpus_error(name):
    """The CPU's value lies within the approximation's documented error of the GPU's (large sin/cos arguments,
    __expf's growth with |x|, tanh.approx's 11 bits): a check that one fails the other fails but at its edge."""
    import triton.language.extra.cuda.libdevice as cuda_libdevice

    if not hasattr(cuda_libdevice, name):
        pytest.skip(f"CUDA's libdevice in this Triton has no {name} (3.6 and 3.9 have no fast_tanhf)")
    x = np.linspace(1e-3 if name.startswith("fast_log") else -60.0, 60.0, 20001, dtype=np.float32)
    if name in ("fast_sinf", "fast_cosf"):
        x = np.concatenate([x, np.linspace(-30000, 30000, 20001, dtype=np.float32)])
    if name == "fast_tanf":
        x = x[np.abs(x) < 1.4]   # away from the poles
    if name in ("fast_expf", "fast_exp10f"):
        x = x[np.abs(x) < (80 if name == "fast_expf" else 35)]
    gpu, cpu = _gpu_fast(name, x), _fast(name, x)
    assert (np.isfinite(gpu) == np.isfinite(cpu)).all()
    finite = np.isfinite(gpu)
    excess = np.abs(gpu - cpu)[finite] / np.maximum(2 * _error_bound(name, x, gpu)[finite], 1e-38)
    assert excess.max() <= 1, (name, x[finite][excess.argmax()], gpu[finite][excess.argmax()],
                               cpu[finite][excess.argmax()])


@pytest.mark.gpu
def test_an_fp32_dot_at_tf32_drops_the_low_mantissa_bits_as_the_interpreter_does():
    """The CPU truncates fp32 operands of a default-precision tl.dot to tf32 (sandbox/libdevice_cpu._dot): on the
    GPU the product must match truncated operands to fp32 accumulation error, not exact ones."""
    import torch
    import triton

    @triton.jit
    def dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
        r = tl.arange(0, M)
        tile = r[:, None] * M + r[None, :]
        tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))

    torch.manual_seed(0)
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    c = torch.empty_like(a)
    dot[(1,)](a, b, c, M=64)
    cut = lambda t: (t.view(torch.int32) & -8192).view(torch.float32).double()
    assert (c.double() - cut(a) @ cut(b)).abs().max().item() < 1e-4
    assert (c.double() - a.double() @ b.double()).abs().max().item() > 1e-3
