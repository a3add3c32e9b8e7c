"""Triton as the public writes it (the Triton tutorials, Liger-Kernel, Unsloth, FlagGems): the rules accept its
idioms, and every rule relaxed for them has its cheat, which the rules, the jail or the replay still stop. The
kernels are kloop's own, written in those idioms (no other project's code); tests/experiments/public_triton.py runs the
libraries' own kernels."""
import textwrap
from pathlib import Path

import pytest

from sandbox import jail
from sandbox.evaluate import EvalSettings, Session, evaluate
from tools import rules
from tools.rules import check_source
from tools.target import load_target

from conftest import HAS_GPU

HERE = Path(__file__).parent
CANDIDATES = HERE / "candidates"
TARGETS = HERE / "targets"

# -- the rules: idioms accepted ----------------------------------------------------------------------------------------
IDIOMS = {
    "libdevice functions imported by name, and Liger's fallback chain of such imports": """
        import torch
        import triton
        import triton.language as tl
        from triton.language.extra.cuda.libdevice import rsqrt

        try:
            from triton.language.extra.libdevice import tanh
        except ModuleNotFoundError:
            try:
                from triton.language.extra.cuda.libdevice import tanh
            except ModuleNotFoundError:
                from triton.language.math import tanh


        @triton.jit
        def k(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            tl.store(x_ptr + offs, rsqrt(x) + tanh(x), mask=offs < n)
    """,
    "Unsloth's module-level aliases, one per Triton version, and jit and heuristics applied as calls": """
        import torch
        import triton
        import triton.language as tl
        from packaging.version import Version

        if Version(triton.__version__) >= Version("3.0.0"):
            from triton.language.extra import libdevice
            triton_tanh = libdevice.tanh
            triton_cast = tl.cast
        else:
            triton_tanh = tl.math.tanh

            @triton.jit
            def triton_cast(x, dtype):
                return x.to(dtype)


        def _forward(x_ptr, n, SOFTCAP: tl.constexpr, DO_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + triton_cast(offs, tl.int64), mask=offs < n)
            if DO_SOFTCAP:
                x = SOFTCAP * triton_tanh(x / SOFTCAP)
            tl.store(x_ptr + offs, x, mask=offs < n)


        _forward = triton.jit(_forward)
        _forward = triton.heuristics({"DO_SOFTCAP": lambda args: bool(args["SOFTCAP"] != 0)})(_forward)


        def _backward(x_ptr, n, BLOCK: tl.constexpr):
            tl.store(x_ptr + tl.arange(0, BLOCK), triton_cast(n, tl.float32))


        _backward = triton.jit(do_not_specialize=["n"])(_backward)
    """,
    "the tutorials' DEVICE, driver properties, target checks, and warmup for the register count": """
        import torch
        import triton
        import triton.language as tl
        from triton.runtime import driver

        DEVICE = triton.runtime.driver.active.get_active_torch_device()
        properties = driver.active.utils.get_device_properties(DEVICE.index)
        NUM_SM = properties["multiprocessor_count"]


        def is_hip():
            return triton.runtime.driver.active.get_current_target().backend == "hip"


        @triton.jit
        def k(x_ptr, n, BLOCK: tl.constexpr, num_stages: tl.constexpr):
            for row in tl.range(tl.program_id(0), n, tl.num_programs(0), num_stages=num_stages):
                tl.store(x_ptr + row, 1.0)


        def launch(x):
            kernel = k.warmup(x, x.numel(), BLOCK=128, num_stages=2, grid=(1,))
            kernel._init_handles()
            programs = NUM_SM * max(1, 65536 // (kernel.n_regs * 32 * 4))
            kernel[(programs, 1, 1)](x, x.numel(), 128, 2)
    """,
    "Liger's launch helpers: ensure_contiguous, autograd.Function, device_context, SM counts, DTensor checks": """
        import functools
        import operator
        from contextlib import contextmanager

        import torch
        import triton
        import triton.language as tl
        from torch.distributed.tensor import DTensor

        MAX_FUSED_SIZE: tl.constexpr = 65536
        _REDUCTION_MODE_SUM = tl.constexpr(1)


        def ensure_contiguous(fn):
            @functools.wraps(fn)
            def wrapper(ctx, *args, **kwargs):
                def maybe_to_contiguous(x):
                    return x.contiguous() if isinstance(x, torch.Tensor) else x

                args = [maybe_to_contiguous(arg) for arg in args]
                kwargs = {k: maybe_to_contiguous(v) for k, v in kwargs.items()}
                return fn(ctx, *args, **kwargs)

            return wrapper


        @contextmanager
        def device_context(device):
            device = torch.device(device)
            backend = getattr(torch, device.type, None)
            if backend is not None and hasattr(backend, "device"):
                with backend.device(device):
                    yield
            else:
                yield


        def get_amp_custom_fwd():
            if hasattr(torch, "npu") and getattr(torch.npu, "amp", None) is not None:
                return torch.npu.amp.custom_fwd
            return functools.partial(torch.amp.custom_fwd, device_type="cuda")


        @triton.jit
        def _k(x_ptr, n, BLOCK_SIZE: tl.constexpr, MODE: tl.constexpr = _REDUCTION_MODE_SUM):
            offs = tl.arange(0, BLOCK_SIZE)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * MODE, mask=offs < n)


        def forward(x):
            if isinstance(x, DTensor):
                x = x.full_tensor()
            if operator.ge(x.shape[-1], MAX_FUSED_SIZE):
                raise RuntimeError("row too long")
            sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
            with device_context(x.device), torch.cuda.device(x.device):
                _k[(min(sm_count, x.shape[0]),)](x, x.numel(), BLOCK_SIZE=triton.next_power_of_2(x.shape[-1]))
            return x


        class LigerFunction(torch.autograd.Function):
            @staticmethod
            @ensure_contiguous
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return forward(x)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, dy):
                return dy
    """,
    "autotune configs built in loops, pruned, with restore_value and reset_to_zero; constexpr helpers": """
        import torch
        import triton
        import triton.language as tl


        def get_autotune_config():
            return [triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128) for w in (2, 4)]


        configs = []
        for b in [32, 64]:
            configs.append(triton.Config({"BLOCK": b}, num_stages=2))


        def prune(configs, named_args, **kwargs):
            return [c for c in configs if c.kwargs["BLOCK"] <= 128]


        @triton.jit
        def _helper(x, SCALE: tl.constexpr):
            return x * SCALE


        @triton.autotune(configs=get_autotune_config() + configs, key=["n"],
                         prune_configs_by={"early_config_prune": prune}, restore_value=["x_ptr"],
                         reset_to_zero=["out_ptr"])
        @triton.jit
        def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, _helper(tl.load(x_ptr + offs, mask=offs < n), 2.0), mask=offs < n)


        def cdiv(a, b):
            return triton.cdiv(a, b)
    """,
    "torch.library.triton_op and wrap_triton": """
        import torch
        import triton
        import triton.language as tl
        from torch.library import triton_op, wrap_triton


        @triton.jit
        def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


        @triton_op("mylib::copy", mutates_args={})
        def copy(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            wrap_triton(k)[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel(), BLOCK=128)
            return out
    """,
    "Liger's platform probes: a version check through importlib, an optional package imported in a try": """
        import importlib
        import importlib.metadata
        import importlib.util
        import operator
        from typing import Callable

        import torch
        from packaging.version import Version


        def compare(package: str, op: Callable, target: str):
            try:
                module = importlib.import_module(package)
            except ImportError:
                return False
            return op(Version(module.__version__), Version(target))


        def on_npu() -> bool:
            try:
                from transformers.utils import is_torch_npu_available

                return is_torch_npu_available()
            except Exception:
                return False


        try:
            import intel_extension_for_pytorch as ipex
        except (ImportError, ModuleNotFoundError):
            ipex = None

        HAS_TRITON = importlib.util.find_spec("triton") is not None and importlib.metadata.version("triton") != ""
    """,
}
MODEL = "\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


@pytest.mark.parametrize("name", sorted(IDIOMS))
def test_the_rules_accept_the_public_idioms(name):
    assert check_source(textwrap.dedent(IDIOMS[name]) + MODEL) == []


# -- the rules: each relaxed rule's cheat -----------------------------------------------------------------------------
HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
KERNEL = "\n@triton.jit\ndef k(x_ptr, n, BLOCK: tl.constexpr):\n    tl.store(x_ptr, CALL)\n"


def kernel_calling(call: str, before: str) -> str:
    return HEADER + textwrap.dedent(before) + KERNEL.replace("CALL", call) + MODEL


@pytest.mark.parametrize("source, reason", [
    # an alias of a PyTorch function, or a fallback chain whose last branch binds one: the import the candidate wrote
    (kernel_calling("tanh(x_ptr)", "tanh = torch.tanh\n"),
     "line 8: inside @triton.jit kernel k: tanh is bound to torch.tanh (line 4), not a Triton function: a kernel "
     "calls only tl.*, libdevice.* and @triton.jit functions"),
    (kernel_calling("tanh(x_ptr)", """
        try:
            from triton.language.extra.libdevice import tanh
        except ImportError:
            from torch import tanh
     """), "tanh is imported by `from torch import tanh` (line 8), not a Triton function"),
    (kernel_calling("rsqrt(x_ptr)", "from triton.language.extra.cuda.libdevice import rsqrt\nrsqrt = torch.rsqrt\n"),
     "rsqrt is bound to torch.rsqrt (line 5), not a Triton function"),
    (kernel_calling("erf(x_ptr)", "import math\nerf = math.erf\n"), "erf is bound to math.erf (line 5)"),
    (kernel_calling("f(x_ptr)", "from triton.language.core import _unwrap_if_constexpr as f\n"),
     "f is imported by `from triton.language.core import _unwrap_if_constexpr`"),
    # a libdevice that is really another module
    (kernel_calling("libdevice.erf(x_ptr)", "from torch import special as libdevice\n"),
     "libdevice is module torch.special, which kernels may not use"),
    (kernel_calling("libdevice.erf(x_ptr)", "import numpy as libdevice\n"), "libdevice is module numpy"),
    # triton.jit applied as a call to what is not a def of the module, or to a def whose body is not Triton
    (HEADER + "k = triton.jit(torch.add)" + MODEL, "line 4: triton.jit applied to torch.add: Triton's decorators "
                                                   "apply to a def of this module"),
    (HEADER + "f = torch.add\nk = triton.jit(f)" + MODEL, "line 5: triton.jit applied to f"),
    (HEADER + "class C:\n    pass\nk = triton.jit(C)" + MODEL, "line 6: triton.jit applied to C"),
    (HEADER + "def f(x):\n    return torch.add(x, x)\nf = triton.jit(f)" + MODEL,
     "line 5: inside @triton.jit kernel f: torch is module torch, which kernels may not use"),
    (HEADER + "if torch:\n    def f(x):\n        return torch.add(x, x)\nelse:\n    def f(x):\n        return x\n"
              "f = triton.jit(f)" + MODEL, "line 6: inside @triton.jit kernel f: torch is module torch"),
    (HEADER + "def f(x):\n    return x\nk = triton.heuristics({})(f)" + MODEL,
     "line 6: triton.heuristics applied to f, a def that is not a @triton.jit kernel: apply triton.jit first"),
    (HEADER + "def make():\n    return triton.jit(lambda x: x)" + MODEL, "line 5: triton.jit applied to lambda"),
    # functools.wraps rewriting another object, operator's getattr
    (HEADER + "import functools\nfunctools.wraps(object, assigned=(), updated=('__dict__',))(torch.nn)" + MODEL,
     "line 5: functools.wraps may only decorate a def, as @functools.wraps(fn) with no other arguments"),
    (HEADER + "import functools\ndef g(f):\n    @functools.wraps(f, updated=('__dict__',))\n    def h():\n"
              "        pass\n    return h" + MODEL, "line 6: functools.wraps may only decorate a def"),
    (HEADER + "import operator\nos = operator.attrgetter('os')(torch)" + MODEL,
     "line 5: operator.attrgetter is not allowed (from operator candidates may use"),
    # the rest of torch.autograd and torch.library, Triton's launchers
    (HEADER + "g = torch.autograd.grad" + MODEL, "line 4: torch.autograd.grad is off limits to candidates"),
    (HEADER + "from torch.library import Library" + MODEL, "line 4: torch.library.Library is off limits"),
    (HEADER + "from torch.library import custom_op" + MODEL, "line 4: torch.library.custom_op is off limits"),
    (HEADER + "torch.distributed.init_process_group('gloo')" + MODEL,
     "line 4: torch.distributed.init_process_group is off limits to candidates (from torch.distributed candidates "
     "may use is_available, is_initialized, tensor)"),
    (HEADER + "import packaging.markers" + MODEL, "line 4: import of packaging.markers is not allowed"),
    (HEADER + "b = triton.runtime.driver.active.utils.load_binary" + MODEL,
     "line 4: triton.runtime.driver.active.utils.load_binary is not for candidates (they may call "
     "triton.runtime.driver.active.get_active_torch_device()"),
    (HEADER + "from triton.runtime import jit" + MODEL, "line 4: triton.runtime.jit reaches module "
                                                        "triton.runtime.jit"),
    # getattr beyond the literal name and Liger's getattr(torch, device.type)
    (HEADER + "os = getattr(torch, 'os')" + MODEL, "line 4: torch.os reaches module os"),
    (HEADER + "name = 'os'\nos = getattr(torch, name)" + MODEL,
     "line 5: getattr is not allowed in a candidate: name the attribute, as in torch.cuda.device(x.device)"),
    (HEADER + "s = getattr(torch.cuda, 'Stream')()" + MODEL, "line 4: torch.cuda.Stream is off limits"),
    # ... and only Python's own getattr and hasattr: a def of that name would receive the module
    (HEADER + "def hasattr(m, name):\n    return m.os\nos = hasattr(torch, 'x')" + MODEL,
     "line 6: module torch used as a value"),
    (HEADER + "def getattr(m, name):\n    return m.os\nos = getattr(torch, 'cuda')" + MODEL,
     "line 6: module torch used as a value"),
    (HEADER + "import contextlib\nr = contextlib.redirect_stdout" + MODEL,
     "line 5: contextlib.redirect_stdout is not allowed"),
    # importlib for probes only: not its loaders, and not reached past its listed members
    (HEADER + "import importlib.util\nspec = importlib.util.spec_from_file_location('m', '/tmp/m.py')" + MODEL,
     "line 5: importlib.util.spec_from_file_location is not allowed (from importlib.util candidates may use "
     "find_spec)"),
    (HEADER + "from importlib import reload" + MODEL, "line 4: importlib.reload is not allowed"),
    (HEADER + "from importlib.metadata import files" + MODEL, "line 4: importlib.metadata.files is not allowed"),
    (HEADER + "import importlib.machinery" + MODEL, "line 4: import of importlib.machinery is not allowed"),
    # a probe is an optional package's import in a try that does without it: not the standard library, not a
    # module the rules refuse, not an import in a def the try only defines, not a try that lets the failure through
    (HEADER + "try:\n    import subprocess\nexcept ImportError:\n    subprocess = None" + MODEL,
     "line 5: import of subprocess is not allowed (allowed: __future__,"),
    (HEADER + "try:\n    from os import system\nexcept Exception:\n    system = None" + MODEL,
     "line 5: import from os is not allowed (allowed: __future__, contextlib, dataclasses, functools, importlib, "
     "math, numpy, operator, packaging.version, tools.launch, torch, torch.autograd, torch.library, torch.nn, "
     "torch.nn.functional, triton, triton.language, triton.language.extra.libdevice, triton.runtime, "
     "triton.tools.tensor_descriptor, typing); the standard library is always there, so a try around its import "
     "probes nothing"),
    (HEADER + "try:\n    import torch.ops as ops\nexcept ImportError:\n    ops = None" + MODEL,
     "line 5: import of torch.ops is not allowed"),
    (HEADER + "try:\n    from sandbox import record\nexcept ImportError:\n    record = None" + MODEL,
     "line 5: import from sandbox is not allowed"),
    (HEADER + "try:\n    def probe():\n        import transformers\nexcept ImportError:\n    pass" + MODEL,
     "line 6: import of transformers is not allowed (allowed: __future__,"),
    (HEADER + "try:\n    import transformers\nexcept ValueError:\n    transformers = None" + MODEL,
     "a probe for an optional package imports it inside try: ... except ImportError:"),
    (HEADER + "try:\n    from transformers import *\nexcept ImportError:\n    pass" + MODEL,
     "line 5: star imports are not allowed"),
])
def test_each_relaxed_rule_still_refuses_its_cheat(source, reason):
    reasons = check_source(source)
    assert any(reason in r for r in reasons), reasons


def test_a_refused_fallback_chain_names_the_import_the_candidate_wrote():
    # The chain binds tanh three times; the one line names the binding that is not Triton's, not another branch.
    source = kernel_calling("tanh(x_ptr)", """
        try:
            from triton.language.extra.libdevice import tanh
        except ModuleNotFoundError:
            try:
                from triton.language.extra.cuda.libdevice import tanh
            except ModuleNotFoundError:
                from math import tanh
    """)
    assert check_source(source) == [
        "line 15: inside @triton.jit kernel k: tanh is imported by `from math import tanh` (line 11), not a Triton "
        "function: a kernel calls only tl.*, libdevice.* and @triton.jit functions, and reads literal module "
        "constants; pass anything else as an argument"]


# -- end to end: honest kernels credited, cheats stopped --------------------------------------------------------------
CUSTOM_OP = ("the recorder sees a triton_op as one PyTorch op and refuses it; it must run the op's Python "
             "(sandbox/record.py)")


@pytest.fixture(scope="module")
def session():
    with Session(spares=1) as s:
        yield s


def judge(target: str, source: str, session):
    return evaluate(load_target(str(TARGETS / f"{target}.py")), source, EvalSettings(baselines=("eager",)), session)


@pytest.mark.device
@pytest.mark.parametrize("target, name, cpu_gap", [
    ("tiny_gelu", "honest_libdevice_import", None),
    ("kb_leaky_relu", "honest_triton_alias", None),
    ("tiny_add", "honest_jit_applied", None),
    ("tiny_gelu", "honest_launch_helpers", None),
    ("tiny_gelu", "honest_platform_probes", None),
    ("tiny_add", "honest_autotune_pruned", None),
    ("tiny_add", "honest_triton_op", CUSTOM_OP),
    ("kb_softmax", "honest_tutorial_device", None),
])
def test_honest_kernels_in_public_idioms_are_credited(session, target, name, cpu_gap, request):
    if name == "honest_triton_op" or (cpu_gap and not HAS_GPU):
        request.applymarker(pytest.mark.xfail(reason=cpu_gap, strict=True))
    r = judge(target, (CANDIDATES / f"{name}.py").read_text(), session)
    assert r.verdict == "correct", r.reasons
    assert r.correctness.trials >= 5 + 2 and r.correctness.max_abs_err < 1e-3


@pytest.mark.device
@pytest.mark.parametrize("target, name, bypass, why", [
    ("tiny_add", "autograd_forward_torch", False, "ModelNew.forward computed with PyTorch ops: aten.add"),
    ("tiny_add", "triton_op_torch", False, "ModelNew.forward computed with PyTorch ops: kloop_cheat.add"),
    ("tiny_add", "importlib_torch_compute", False, "ModelNew.forward computed with PyTorch ops: aten.add"),
    # the rules refuse these; without them the planner and the executor's own checks must (on a GPU, Triton's
    # compiler, in its own words: a kernel calls no PyTorch function)
    ("tiny_add", "alias_smuggles_torch", True, "kernel add_kernel: cannot access global variable triton_add"),
    ("tiny_add", "jit_applied_torch", True, "kernel _add_kernel uses module torch"),
    ("tiny_gelu", "libdevice_is_torch", True, "kernel gelu_kernel uses module torch.special"),
])
def test_cheats_in_public_idioms_are_never_credited(session, monkeypatch, target, name, bypass, why):
    if bypass:
        monkeypatch.setattr(rules, "check_source", lambda source: [])
    r = judge(target, (CANDIDATES / f"{name}.py").read_text(), session)
    assert r.verdict in ("rejected", "compile_error"), (r.verdict, r.reasons)
    if not (bypass and HAS_GPU):
        assert any(why in reason for reason in r.reasons), r.reasons


@pytest.mark.device
@pytest.mark.skipif(jail.detect().mode == "none", reason="no jail here: isolation mode none keeps nothing away")
def test_os_reached_through_getattr_on_a_device_type_stays_in_the_jail(tmp_path, monkeypatch):
    """getattr(torch, device.type) is accepted for Liger's device context; a device type of the candidate's making
    reaches os with it. The rules let it through: the jail is what keeps the file system and the secrets away."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-real")
    marker = tmp_path / "escaped"
    source = (CANDIDATES / "getattr_smuggles_os.py").read_text().replace("MARKER_PLACEHOLDER", str(marker))
    assert check_source(source) == []
    with Session(spares=0) as fresh:   # started after the key was set
        r = judge("tiny_add", source, fresh)
    assert r.verdict == "correct", r.reasons
    assert not marker.exists() and "PROBE write blocked" in r.stdout, r.stdout[-2000:]


@pytest.mark.device
@pytest.mark.skipif(jail.detect().mode == "none", reason="no jail here: isolation mode none keeps nothing away")
@pytest.mark.parametrize("name, bypass, probe", [
    ("importlib_smuggles_os", False, "PROBE write blocked"),   # importlib.import_module names any module
    ("probe_smuggles_files", False, "PROBE write blocked"),    # a probed package does what it can do
    ("probe_runs_command", True, "PROBE command"),            # the rules refuse subprocess; without them, the jail
])
def test_modules_reached_by_probes_stay_in_the_jail(session, tmp_path, monkeypatch, name, bypass, probe):
    """The rules let importlib and try-guarded imports of optional packages through, unfollowed: what such a module
    can do to the host, the jail must stop."""
    marker = tmp_path / "escaped"
    source = (CANDIDATES / f"{name}.py").read_text().replace("MARKER_PLACEHOLDER", str(marker))
    assert bool(check_source(source)) == bypass
    if bypass:
        monkeypatch.setattr(rules, "check_source", lambda source: [])
    r = judge("tiny_add", source, session)
    assert r.verdict == "correct", r.reasons
    assert not marker.exists() and probe in r.stdout, r.stdout[-2000:]
