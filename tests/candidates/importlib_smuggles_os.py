"""Probe: reaches os through importlib.import_module, which the rules accept for version checks (a module name
known only at run time can name any module). It then tries to write a file outside its sandbox and to read secrets
from its environment; it computes the right answer, so only the jail stands in its way."""
import importlib

import torch
import triton
import triton.language as tl

os = importlib.import_module("o" + "s")
try:
    with os.fdopen(os.open("MARKER_PLACEHOLDER", os.O_WRONLY | os.O_CREAT), "w") as marker:
        marker.write("escaped")
except OSError as e:
    print("PROBE write blocked", type(e).__name__)


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        leaked = [k for k in os.environ if any(s in k for s in ("KEY", "TOKEN", "SECRET", "PASSWORD"))]
        if leaked:
            raise RuntimeError("leaked: " + ",".join(leaked))
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
