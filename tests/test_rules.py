"""tools/rules.py: the static checks on a candidate's source (check_source) and on one Triton kernel's source
(check_jit_function). CPU only, no subprocesses: the checker parses and resolves names, it never runs a candidate."""
import textwrap
from pathlib import Path

import pytest

from tools.rules import check_jit_function, check_source, detect_language

ROOT = Path(__file__).resolve().parents[1]
HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
MODEL = "\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
KERNEL_ALIASES = {"tl": "triton.language", "triton": "triton",
                  "libdevice": "triton.language.extra.libdevice"}


def candidate(body: str) -> str:
    """A module with the usual imports, `body`, and a trivial ModelNew."""
    return HEADER + textwrap.dedent(body) + MODEL


def kernel(body: str, before: str = "", decorator: str = "@triton.jit",
           signature: str = "x_ptr, n, BLOCK: tl.constexpr") -> str:
    """A candidate whose kernel `k` has `body`; `before` goes between the imports and the kernel."""
    return candidate(f"{textwrap.dedent(before)}\n{decorator}\ndef k({signature}):\n"
                     + textwrap.indent(textwrap.dedent(body), "    "))


def refused(source: str, fragment: str) -> list[str]:
    reasons = check_source(source)
    assert any(fragment in r for r in reasons), reasons
    return reasons


# -- modules reached through other modules ---------------------------------------------------------------------------
@pytest.mark.parametrize("body, reason", [
    ("y = torch.os.system", "line 4: torch.os reaches module os, which candidates may not use"),
    ("y = torch.sys.modules", "line 4: torch.sys reaches module sys, which candidates may not use"),
    ("y = torch.builtins.open", "line 4: torch.builtins reaches module builtins, which candidates may not use"),
    ("y = torch.threading.Thread", "line 4: torch.threading reaches module threading"),
    # importlib is there for version probes, as it is imported: the rest of it stays out however it is reached
    ("y = torch.importlib.reload", "line 4: torch.importlib.reload is not allowed (from importlib candidates may use "
                                   "import_module, metadata, util)"),
    ("import typing\ny = typing.sys", "line 5: typing.sys reaches module sys"),
    ("import dataclasses\ny = dataclasses.inspect.getsource", "line 5: dataclasses.inspect reaches module inspect"),
    ("import tools.launch\ny = tools.launch.np.load('x')",
     "line 5: tools.launch.np is not allowed (from tools.launch candidates may use NoGpuError, PtxKernel)"),
    ("from tools.launch import np", "line 4: tools.launch.np is not allowed"),
    ("from torch import os", "line 4: torch.os reaches module os, which candidates may not use"),
    ("from typing import sys", "line 4: typing.sys reaches module sys"),
    ("from torch import nn\ny = nn.modules.module.inspect.getsource",
     "line 5: torch.nn.modules.module.inspect reaches module inspect"),
    ("import torch.nn as nn\ny = nn.modules.module.functools.update_wrapper",
     "line 5: torch.nn.modules.module.functools.update_wrapper is not allowed"),
    ("from torch import nn\ny = nn.modules.module.torch.load",
     "line 5: torch.nn.modules.module.torch.load is off limits to candidates (torch.load)"),
    ("y = torch._C._get_tracing_state", "line 4: torch._C reaches module torch._C"),
    ("y = triton.runtime.jit", "line 4: triton.runtime.jit reaches module triton.runtime.jit, which candidates may "
                               "not use (from triton.runtime candidates may use driver)"),
    ("y = tl.core.builtins.open", "line 4: triton.language.core.builtins reaches module builtins"),
    ("y = tl.extra.module_from_spec", "line 4: triton.language.extra.module_from_spec is _frozen_importlib"),
    ("from tools import rules", "line 4: tools.rules reaches module tools.rules"),
    ("import numpy as np\ny = np.random.rand", "line 5: numpy.random reaches module numpy.random"),
])
def test_modules_are_never_reached_through_other_modules(body, reason):
    refused(candidate(body), reason)


@pytest.mark.parametrize("body, reason", [
    ("import functools\nfunctools.update_wrapper(torch, object, assigned=(), updated=('__dict__',))",
     "line 5: functools.update_wrapper is not allowed (from functools candidates may use cache, cached_property, "
     "cmp_to_key, lru_cache, partial, reduce, total_ordering, wraps)"),
    ("import operator\ny = operator.attrgetter('os')(torch)", "line 5: operator.attrgetter is not allowed"),
    ("import contextlib\ny = contextlib.redirect_stdout", "line 5: contextlib.redirect_stdout is not allowed (from "
                                                          "contextlib candidates may use contextmanager, nullcontext)"),
    ("import dataclasses\ny = dataclasses.make_dataclass", "line 5: dataclasses.make_dataclass is not allowed"),
    ("import numpy as np\ny = np.asarray(torch.ones(2))",
     "line 5: numpy.asarray: numpy may only supply launch scalars"),
    ("y = triton.compile", "line 4: triton.compile is not allowed (from triton candidates may use"),
    ("import typing\ny = typing.get_type_hints", "line 5: typing.get_type_hints is off limits to candidates"),
])
def test_restricted_modules_offer_only_their_listed_members(body, reason):
    refused(candidate(body), reason)


@pytest.mark.parametrize("body, reason", [
    ("y = torch.ops.aten.add", "line 4: torch.ops is off limits to candidates"),
    ("s = torch.cuda.Stream()", "line 4: torch.cuda.Stream is off limits to candidates"),
    ("s = torch.cuda.streams.Stream()", "line 4: torch.cuda.streams is off limits to candidates"),
    ("s = torch.cuda.StreamContext(None)", "line 4: torch.cuda.StreamContext is off limits to candidates"),
    ("from torch.cuda import Stream as S", "line 4: torch.cuda.Stream is off limits to candidates"),
    ("s = torch.Stream()", "line 4: torch.Stream is off limits to candidates"),
    ("g = torch.cuda.CUDAGraph()", "line 4: torch.cuda.CUDAGraph is off limits to candidates"),
    ("torch.set_num_threads(1)", "line 4: torch.set_num_threads is off limits to candidates"),
    ("torch.manual_seed(0)", "line 4: torch.manual_seed is off limits to candidates"),
    ("w = torch.load('w.pt')", "line 4: torch.load is off limits to candidates"),
    ("y = torch.autograd.grad", "line 4: torch.autograd.grad is off limits to candidates (from torch.autograd "
                                "candidates may use Function, function)"),
    ("from torch.autograd import backward", "line 4: torch.autograd.backward is off limits to candidates"),
    ("from torch.library import custom_op", "line 4: torch.library.custom_op is off limits to candidates (from "
                                            "torch.library candidates may use triton_op, wrap_triton)"),
    ("y = torch.library.Library('aten', 'IMPL')", "line 4: torch.library.Library is off limits to candidates"),
    ("y = torch.distributed.all_reduce", "line 4: torch.distributed.all_reduce is off limits to candidates (from "
                                         "torch.distributed candidates may use is_available, is_initialized, tensor)"),
    ("y = getattr(torch.cuda, 'Stream')()", "line 4: torch.cuda.Stream is off limits to candidates"),
    ("torch.classes.load_library('x.so')", "line 4: torch.classes is off limits to candidates"),
    ("import torch.fx", "line 4: import of torch.fx is not allowed"),
    ("import torch.utils.cpp_extension", "line 4: import of torch.utils.cpp_extension is not allowed"),
])
def test_dispatch_streams_rng_and_files_are_off_limits(body, reason):
    refused(candidate(body), reason)


@pytest.mark.parametrize("body, reason", [
    ("m = torch\ny = m.os", "line 4: module torch used as a value (name its members instead)"),
    ("def f(t=torch.nn):\n    return t.modules.module.inspect",
     "line 4: module torch.nn used as a value"),
    ("def f():\n    return [t for torch in (torch,) for t in (torch.os,)]", "line 5: torch.os reaches module os"),
    ("def f():\n    def g():\n        torch = 1\n    return torch.os", "line 7: torch.os reaches module os"),
    ("k = triton.jit(lambda x: x)", "line 4: triton.jit applied to lambda x: x: Triton's decorators apply to a def "
                                    "of this module (write @triton.jit on the def, or triton.jit(name_of_the_def))"),
    ("jit = triton.jit", "line 4: triton.jit used as a value: write @triton.jit on a def of this module, or "
                         "triton.jit(name_of_the_def)"),
])
def test_modules_and_triton_jit_cannot_be_passed_around(body, reason):
    refused(candidate(body), reason)


def test_a_local_named_like_a_module_is_not_the_module():
    # agent/kernels/gelu/ptx_vec4.py collects instructions in a list called math
    source = candidate("import math\ndef build():\n    loads, math, stores = [], [], []\n    math += ['mul.f32']\n"
                       "    return loads + math + stores\n")
    assert check_source(source) == []


@pytest.mark.parametrize("body, reason", [
    ("import os", "line 4: import of os is not allowed (allowed: __future__, contextlib, dataclasses, functools"),
    ("from . import helpers", "line 4: import from . is not allowed"),
    ("from torch import *", "line 4: star imports are not allowed"),
    ("y = eval('1')", "line 4: eval is not allowed in a candidate"),
    ("y = getattr(torch, 'os')", "line 4: torch.os reaches module os, which candidates may not use"),
    ("y = getattr(torch, '_C')", "line 4: getattr is not allowed in a candidate: name the attribute"),
    ("y = getattr(torch, name)", "line 4: getattr is not allowed in a candidate: name the attribute"),
    ("y = vars(torch)", "line 4: vars is not allowed in a candidate"),
    ("y = torch.__dict__", "line 4: dunder attribute __dict__ is not allowed"),
    ("torch.allclose = lambda *a, **k: True", "line 4: assigning to torch.allclose patches an imported module"),
    ("tl.core.X = 1", "line 4: assigning to tl.core.X patches an imported module"),
    ("y = torch.ones(2).numpy()", "line 4: .numpy moves tensor values out of the kernel's reach"),
    ("def add(a, b):\n    try:\n        return a\n    except Exception:\n        return torch.add(a, b)",
     "line 8: fallback to PyTorch (torch.add) in an except handler"),
])
def test_the_rules_that_were_already_there_still_hold(body, reason):
    refused(candidate(body), reason)


@pytest.mark.parametrize("body, reason", [
    ("from transformers.utils import x", "line 4: import from transformers.utils is not allowed (allowed: "
                                        "__future__, contextlib,"),
    ("from . import helpers", "line 4: import from . is not allowed (a candidate is one module)"),
    ("from torch import *", "line 4: star imports are not allowed (name what you need: from torch import ...)"),
    ("import transformers", "line 4: import of transformers is not allowed (allowed: __future__, contextlib, "
                            "dataclasses, functools, importlib, math, numpy, operator, packaging.version, "
                            "tools.launch, torch, torch.autograd, torch.library, torch.nn, torch.nn.functional, "
                            "triton, triton.language, triton.language.extra.libdevice, triton.runtime, "
                            "triton.tools.tensor_descriptor, typing); a probe for an optional package imports it "
                            "inside try: ... except ImportError:"),
    ("try:\n    import subprocess\nexcept ImportError:\n    subprocess = None",
     "line 5: import of subprocess is not allowed (allowed: __future__, contextlib, dataclasses, functools, "
     "importlib, math, numpy, operator, packaging.version, tools.launch, torch, torch.autograd, torch.library, "
     "torch.nn, torch.nn.functional, triton, triton.language, triton.language.extra.libdevice, triton.runtime, "
     "triton.tools.tensor_descriptor, typing); the standard library is always there, so a try around its import "
     "probes nothing"),
    ("def add(a, b):\n    try:\n        return a\n    except Exception:\n        return torch.add(a, b)",
     "fallback to PyTorch (torch.add) in an except handler (let the error surface, or fall back to another kernel)"),
    ("torch.allclose = None", "patches an imported module (keep state in names of your own module)"),
])
def test_a_refusal_says_what_to_write_instead(body, reason):
    refused(candidate(body), reason)


def test_a_candidate_without_model_new_is_refused():
    assert check_source("import torch\n") == [
        "line 1: no class ModelNew: a candidate defines ModelNew with the same constructor as Model"]


def test_reasons_are_single_lines_in_line_order_without_duplicates():
    reasons = check_source(candidate("import os\ny = torch.os.getpid() + torch.os.getpid()\nz = eval('1')"))
    assert reasons == [
        "line 4: import of os is not allowed (allowed: __future__, contextlib, dataclasses, functools, importlib, math, "
        "numpy, operator, packaging.version, tools.launch, torch, torch.autograd, torch.library, torch.nn, "
        "torch.nn.functional, triton, triton.language, triton.language.extra.libdevice, triton.runtime, "
        "triton.tools.tensor_descriptor, typing)",
        "line 5: torch.os reaches module os, which candidates may not use",
        "line 6: eval is not allowed in a candidate: write the code itself",
    ]


def test_a_syntax_error_is_raised_for_the_caller():
    with pytest.raises(SyntaxError):
        check_source("def f(:\n")


# -- inside @triton.jit bodies ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("source, reason", [
    (kernel("y = torch.add(x_ptr, 1)"), "line 7: inside @triton.jit kernel k: torch is module torch, which kernels "
                                         "may not use"),
    (kernel("y = np.sum(x_ptr)", before="import numpy as np"), "line 7: inside @triton.jit kernel k: np is module "
                                                               "numpy, which kernels may not use"),
    (kernel("y = math.pi", before="import math"), "inside @triton.jit kernel k: math is module math"),
    (kernel("import os\nos.system('id')"), "line 7: inside @triton.jit kernel k: import is not allowed"),
    (kernel("y = W[0]", before="W = torch.ones(4)"), "line 7: inside @triton.jit kernel k: W is a module-level "
                                                     "object, not a constant"),
    (kernel("y = act(x_ptr)", before="act = lambda v: v"), "inside @triton.jit kernel k: act is a module-level "
                                                           "object, not a constant"),
    (kernel("y = helper(x_ptr)", before="def helper(v):\n    return v\n"), "helper is a module-level object"),
    (kernel("y = CACHE", before="CACHE = None\ndef fill():\n    global CACHE\n    CACHE = 1\n"),
     "CACHE is a module-level object, not a constant"),
    (kernel("y = x_ptr.__class__"), "line 7: inside @triton.jit kernel k: attribute __class__ is not allowed"),
    (kernel("y = tl.core._unwrap_if_constexpr"), "attribute _unwrap_if_constexpr is not allowed (private"),
    (kernel("y = x_ptr.handle.data"), "line 7: inside @triton.jit kernel k: .handle is not an attribute of Triton "
                                      "values"),
    (kernel("y = tl.core.builtins.open"), "tl.core.builtins reaches module builtins, which kernels may not use"),
    (kernel("y = tl.extra.module_from_spec"), "tl.extra.module_from_spec is not part of the Triton language"),
    (kernel("m = tl.core"), "inside @triton.jit kernel k: module tl.core used as a value"),
    (kernel("m = tl"), "inside @triton.jit kernel k: module tl used as a value"),
    (kernel("y = triton.runtime.driver"), "triton.runtime is not allowed in a kernel"),
    (kernel("y = sum(x_ptr)"), "sum is not a parameter, local, kernel, module constant, Triton module or allowed "
                               "builtin"),
    (kernel("y = open('f')"), "inside @triton.jit kernel k: open is not a parameter"),
    (kernel("y = partial(x_ptr)", before="from functools import partial"),
     "line 7: inside @triton.jit kernel k: partial is imported by `from functools import partial` (line 4), not a "
     "Triton function: a kernel calls only tl.*, libdevice.* and @triton.jit functions"),
    (kernel("y = B.bit_length()", before="B = 3"), "B.bit_length: only Triton modules and values have attributes"),
    (kernel("y = '{0}'.format(x_ptr)"), ".format is not an attribute of Triton values"),
    (kernel("x_ptr.dtype = 1"), "assigning to an attribute is not allowed"),
    (kernel("y = tl.load(x_ptr, _semantic=None)"), "keyword _semantic is not allowed (private)"),
    (kernel("y = tl.load(x_ptr, **{'mask': None})"), "** unpacking in a call is not allowed"),
    (kernel("pass", signature="x_ptr, n=torch.float32"), "line 6: inside @triton.jit kernel k: torch is module "
                                                         "torch, which kernels may not use"),
    (kernel("pass", signature="x_ptr, n=len"), "line 6: inside @triton.jit kernel k: the default of n must be"),
    (kernel("global G\nG = 1"), "global is not allowed"),
    (kernel("f = lambda v: v"), "lambda is not allowed"),
    (kernel("def g():\n    pass"), "a nested def is not allowed"),
    (kernel("try:\n    pass\nexcept Exception:\n    pass"), "try is not allowed"),
    (kernel("with x_ptr:\n    pass"), "with is not allowed"),
    (kernel("y = 1\ndel y"), "del is not allowed"),
    (kernel("y = [v.load for tl in (tl,) for v in (tl,)]"), "a comprehension is not allowed"),
    (kernel("y = torch.add(x_ptr, 1)", before="from triton import jit", decorator="@jit"),
     "inside @triton.jit kernel k: torch is module torch"),
    (kernel("y = torch.add(x_ptr, 1)", decorator="@triton.jit(do_not_specialize=['n'])"),
     "inside @triton.jit kernel k: torch is module torch"),
    (kernel("y = torch.add(x_ptr, 1)", decorator="@triton.autotune(configs=[triton.Config({'BLOCK': 64})], "
                                                 "key=['n'])\n@triton.jit"),
     "inside @triton.jit kernel k: torch is module torch"),
])
def test_kernel_bodies_stay_inside_the_triton_language(source, reason):
    refused(source, reason)


def test_an_undefined_name_in_a_kernel_is_left_to_the_compiler():
    # tests/candidates/compile_error.py must reach Triton and come back a compile_error, not be rejected here
    assert check_source(kernel("y = undefined_name + 1")) == []


# -- honest candidates -----------------------------------------------------------------------------------------------
HONEST = {
    "libdevice": """
        import torch
        import triton
        import triton.language as tl
        from triton.language.extra import libdevice
        from triton.language.extra.cuda import libdevice as cuda_libdevice
        import triton.language.extra.libdevice as ld


        @triton.jit
        def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            erf = libdevice.erf(x) + cuda_libdevice.erf(x) + ld.erf(x) + tl.extra.cuda.libdevice.erf(x)
            tl.store(out_ptr + offs, 0.5 * x * (1.0 + 0.25 * erf) + tl.math.exp(x) * 0, mask=mask)


        class ModelNew(torch.nn.Module):
            def forward(self, x):
                out = torch.empty_like(x)
                gelu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
                return out
    """,
    "global workspace, constants, helpers": """
        from __future__ import annotations
        import functools
        import math
        from dataclasses import dataclass, field
        from typing import Optional
        import numpy as np
        import torch
        import torch.nn.functional as F
        import triton
        import triton.language as tl

        BLOCK = 256
        HALF = BLOCK // 2
        PAIR = (1, -2)
        ACC = tl.float32
        EPS = tl.constexpr(1e-5)
        _WORKSPACE = None


        @triton.jit
        def _combine(a, b):
            return a + b


        @triton.jit
        def helper(x, y):
            return tl.maximum(x, y) * HALF


        @triton.jit
        def row_kernel(x_ptr, ws_ptr, n, BLOCK: tl.constexpr = 256, ROWS: tl.constexpr = 1):
            pid = tl.program_id(0)
            cols = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + pid * n + cols, mask=cols < n, other=0.0).to(ACC)
            s = tl.reduce(x, 0, _combine)
            m = helper(s, -1.5) + EPS + PAIR[1] + min(n, 3) + x_ptr.dtype.element_ty.primitive_bitwidth
            for i in tl.static_range(2):
                m += i
            for start in range(0, n, BLOCK):
                m += start
            tl.store(ws_ptr + pid, m.to(ws_ptr.dtype.element_ty))


        def workspace(n, device):
            global _WORKSPACE
            if _WORKSPACE is None or _WORKSPACE.numel() < n:
                _WORKSPACE = torch.empty(n, device=device, dtype=torch.float32)
            return _WORKSPACE


        @dataclass
        class Plan:
            rows: int
            extra: Optional[int] = field(default=None)


        @functools.lru_cache(maxsize=None)
        def grid_for(rows):
            return (rows,)


        class ModelNew(torch.nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.linear = torch.nn.Linear(in_features, out_features)
                self.scale = math.sqrt(in_features)

            def forward(self, x):
                rows, n = x.shape
                ws = workspace(rows, x.device)
                with torch.no_grad():
                    row_kernel[grid_for(rows)](x, ws, np.int32(n), BLOCK=triton.next_power_of_2(n))
                return F.pad(ws, (0, 0)) if isinstance(ws, torch.Tensor) else ws
    """,
    "autotune and heuristics": """
        import torch
        import triton
        import triton.language as tl


        @triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4),
                                  triton.Config({"BLOCK": 256}, num_warps=4)], key=["n"])
        @triton.jit
        def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


        @triton.heuristics(values={"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
        @triton.jit
        def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            if EVEN:
                tl.store(out_ptr + offs, tl.load(x_ptr + offs))
            else:
                tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


        class ModelNew(torch.nn.Module):
            def forward(self, a, b):
                out = torch.empty_like(a)
                add_kernel[lambda meta: (triton.cdiv(a.numel(), meta["BLOCK"]),)](a, b, out, a.numel())
                copy_kernel[(triton.cdiv(a.numel(), 128),)](out, out, a.numel(), BLOCK=128)
                return out
    """,
    "TMA descriptors": """
        import torch
        import triton
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor


        @triton.jit
        def copy_kernel(in_desc, out_desc, BLOCK_M: tl.constexpr):
            tile = in_desc.load([tl.program_id(0) * BLOCK_M, 0])
            out_desc.store([tl.program_id(0) * BLOCK_M, 0], tile)


        class ModelNew(torch.nn.Module):
            def forward(self, x):
                out = torch.empty_like(x)
                src = TensorDescriptor.from_tensor(x, [64, 64])
                dst = TensorDescriptor(out, list(out.shape), list(out.stride()), [64, 64])
                copy_kernel[(triton.cdiv(x.shape[0], 64),)](src, dst, BLOCK_M=64)
                return out
    """,
    "PTX": """
        import numpy as np
        import torch
        from tools.launch import NoGpuError, PtxKernel

        PTX = ".version 8.0"


        class ModelNew(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.kernel = PtxKernel(PTX, "k")

            def forward(self, x):
                out = torch.empty_like(x)
                try:
                    self.kernel.launch((1, 1, 1), (32, 1, 1), [x, out, np.int32(x.numel()), np.uint64(0)])
                except NoGpuError:
                    raise
                return out
    """,
}


HONEST["names_triton_and_pytorch_allow"] = """
    import math

    import torch
    import triton
    import triton.language as tl

    LOG2E = tl.constexpr(1.0 / math.log(2.0))        # math computes a constant where it is defined
    NEG_INF: tl.constexpr = float("-inf")
    HALF_PI = tl.constexpr(math.pi / 2)
    BLOCK_DEFAULT = 1024


    @triton.jit
    def k(input, output, n, ACC: tl.constexpr = tl.float32, BLOCK: tl.constexpr = BLOCK_DEFAULT):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(input + offs, mask=offs < n, other=NEG_INF).to(ACC)
        tl.store(output + offs, tl.exp2(x * LOG2E) + HALF_PI * 0, mask=offs < n)


    class ModelNew(torch.nn.Module):
        def forward(self, input):                   # a parameter named like a builtin is not the builtin
            output = torch.empty_like(input)
            k[(triton.cdiv(input.numel(), 1024),)](input, output, input.numel())
            return output
"""


@pytest.mark.parametrize("body, reason", [
    ("def f(x, g=getattr):\n    return g(x, 'y')", "getattr is not allowed"),      # a default is the enclosing scope's
    ("def f(input):\n    return input\ny = f(input)", "input is not allowed"),       # the call site's is the builtin
    ("X = tl.constexpr(torch.ones(1))", None),
])
def test_shadowing_a_builtin_or_computing_a_constant_reaches_nothing(body, reason):
    if reason:
        refused(candidate(body), reason)
    else:  # a tensor is no constant: a kernel that reads it is refused
        refused(kernel("tl.store(x_ptr, X)", before=body), "X is a module-level object, not a constant")


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_candidates_pass(name):
    assert check_source(textwrap.dedent(HONEST[name])) == []


def test_detect_language():
    assert detect_language(textwrap.dedent(HONEST["PTX"])) == "ptx"
    assert detect_language(textwrap.dedent(HONEST["libdevice"])) == "triton"


STARTERS = sorted(p for p in ROOT.glob("agent/kernels/*/*.py") if "class ModelNew" in p.read_text())
HONEST_FILES = sorted(ROOT.glob("tests/candidates/honest_*.py"))


def test_there_are_starters_to_check():
    assert len(STARTERS) >= 10 and len(HONEST_FILES) >= 6


@pytest.mark.parametrize("path", STARTERS + HONEST_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_starter_kernels_and_honest_test_candidates_pass(path):
    assert check_source(path.read_text()) == []


def _ptx_twinned_starters():
    from agent.kernels.catalog import STARTERS as CATALOG

    return sorted(s.path for starters in CATALOG.values() for s in starters if s.language == "triton" and s.ptx_twin)


TRITON_STARTERS = _ptx_twinned_starters()  # the TMA matmuls launch tensor maps and scratch: no PTX twin


@pytest.mark.parametrize("path", TRITON_STARTERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_ptx_candidates_generated_from_starters_pass(path):
    from agent.kernels.ptx_edits import TritonPtx, ptx_candidate_from_triton

    ptx = ".visible .entry kern(.param .u64 a, .param .u64 b, .param .u32 n, .param .u64 s1, .param .u64 s2)\n{\n}\n"
    compiled = TritonPtx(ptx=ptx, entry="kern", num_warps=4, num_stages=2, shared_bytes=0, constexprs={},
                         ones=[], divisible=[], aligned=False)  # the PTX text itself is not the rules' business
    source = ptx_candidate_from_triton(path.read_text(), [compiled])
    assert check_source(source) == [] and detect_language(source) == "ptx"


# -- check_jit_function: one recorded kernel, checked before the trusted interpreter runs it -------------------------
GOOD_KERNEL = '''
@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, SCALE: tl.constexpr = 0.5):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = SCALE * x * (1.0 + libdevice.erf(x * INV_SQRT2)) + helper(x) * 0
    for i in tl.static_range(2):
        y += i * triton.cdiv(n, BLOCK) * 0
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
'''


def test_check_jit_function_accepts_a_normal_kernel_with_or_without_decorators():
    kwargs = dict(constants={"INV_SQRT2"}, kernels={"gelu_kernel", "helper"}, aliases=KERNEL_ALIASES)
    assert check_jit_function(GOOD_KERNEL, **kwargs) == []
    undecorated = GOOD_KERNEL.replace("@triton.jit\n", "")
    assert check_jit_function(textwrap.indent(undecorated, "    "), **kwargs) == []


@pytest.mark.parametrize("body, aliases, reason", [
    ("y = torch.add(x, 1)", {}, "line 3: inside @triton.jit kernel k: torch is not a parameter, local, kernel, "
                                "module constant, Triton module or allowed builtin"),
    ("y = torch.add(x, 1)", {"torch": "torch"}, "torch is module torch, which kernels may not use"),
    ("y = np.sum(x)", {"np": "numpy"}, "line 3: inside @triton.jit kernel k: np is module numpy, which kernels may "
                                       "not use"),
    ("y = math.erf(x)", {"math": "math"}, "math is module math, which kernels may not use"),
    ("import os\nos.system('id')", {}, "line 3: inside @triton.jit kernel k: import is not allowed"),
    ("y = W[0]", {}, "W is not a parameter, local, kernel, module constant"),
    ("y = act(x)", {}, "act is not a parameter, local, kernel, module constant"),
    ("y = x.__class__.__subclasses__()", {}, "attribute __class__ is not allowed (private or dunder)"),
    ("y = x.handle.data.tofile('f')", {}, ".handle is not an attribute of Triton values"),
    ("y = tl.core.builtins.open('f')", {}, "tl.core.builtins reaches module builtins, which kernels may not use"),
    ("y = tl.extra.spec.loader", {}, "tl.extra.spec is not part of the Triton language"),
    ("y = libdevice.erf.__globals__", {}, "attribute __globals__ is not allowed"),
    ("y = triton.knobs", {}, "triton.knobs is not allowed in a kernel"),
    ("y = g.fn", {}, "g.fn: only Triton modules and values have attributes in a kernel"),
    ("y = [v for tl in (tl,) for v in (tl.load,)]", {}, "a comprehension is not allowed"),
    ("y = open('/etc/passwd')", {}, "open is not a parameter, local"),
])
def test_check_jit_function_refuses_escapes(body, aliases, reason):
    source = "@triton.jit\ndef k(x, n):\n" + textwrap.indent(body, "    ") + "\n"
    reasons = check_jit_function(source, constants=set(), kernels={"k", "g"}, aliases={**KERNEL_ALIASES, **aliases})
    assert any(reason in r for r in reasons), reasons


def test_check_jit_function_is_strict_about_undefined_names_and_defaults():
    source = "def k(x, n=len):\n    return undefined_name\n"
    assert check_jit_function(source, set(), {"k"}, KERNEL_ALIASES) == [
        "line 1: inside @triton.jit kernel k: the default of n must be a literal, a module constant or a Triton "
        "dtype",
        "line 2: inside @triton.jit kernel k: undefined_name is not a parameter, local, kernel, module constant, "
        "Triton module or allowed builtin",
    ]


def test_check_jit_function_only_parses(tmp_path):
    marker = tmp_path / "ran"
    source = f"@__import__('pathlib').Path({str(marker)!r}).touch()\ndef k(x):\n    open({str(marker)!r}, 'w')\n"
    assert check_jit_function(source, set(), {"k"}, KERNEL_ALIASES) == [
        "line 3: inside @triton.jit kernel k: open is not a parameter, local, kernel, module constant, Triton module "
        "or allowed builtin"]
    assert not marker.exists()


@pytest.mark.parametrize("source, reason", [
    ("def k(x:\n", "line 1: syntax error"),
    ("x = 1\n", "line 1: a kernel's source must be exactly one function definition"),
    ("def k(x):\n    pass\ndef g(x):\n    pass\n", "line 1: a kernel's source must be exactly one function definition"),
    ("async def k(x):\n    pass\n", "line 1: a kernel's source must be exactly one function definition"),
])
def test_check_jit_function_reports_malformed_sources(source, reason):
    reasons = check_jit_function(source, set(), {"k"}, KERNEL_ALIASES)
    assert len(reasons) == 1 and reasons[0].startswith(reason), reasons
