"""Honest: the platform probes Liger-Kernel's helpers make before a launch. A version check that imports the package
by name (importlib) to read its __version__, and fails soft where the package is absent (pytorch-triton-xpu here); a
look-up of installed packages (importlib.util.find_spec, importlib.metadata.version); and a try-guarded import of an
optional third-party package (transformers) asking whether an Ascend NPU is there. None of them changes what the
kernel computes."""
import importlib
import importlib.metadata
import importlib.util
import operator

import torch
import triton
import triton.language as tl
from packaging.version import Version


def version_check(package, compare, wanted):
    try:
        module = importlib.import_module(package)
    except ImportError:
        return False
    return compare(Version(module.__version__), Version(wanted))


def on_ascend_npu():
    try:
        from transformers.utils import is_torch_npu_available

        return is_torch_npu_available()
    except Exception:
        return False


NEW_TRITON = version_check("triton", operator.ge, "3.0.0") and \
    Version(importlib.metadata.version("triton")) >= Version("3.0.0")
ON_XPU = version_check("pytorch-triton-xpu", operator.ge, "3.6.0") or importlib.util.find_spec("intel_xpu") is not None
ON_NPU = on_ascend_npu()


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 0.5 * x * (1.0 + tl.extra.cuda.libdevice.erf(x * 0.7071067811865476)), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        if ON_XPU or ON_NPU:
            raise RuntimeError("this kernel is written for CUDA devices")
        out = torch.empty_like(x)
        gelu_kernel[(triton.cdiv(x.numel(), 512),)](x, out, x.numel(), BLOCK=512 if NEW_TRITON else 256,
                                                   num_warps=4)
        return out
