"""Probe: a try-guarded import, as the rules accept for optional packages, of subprocess (the rules refuse it: the
standard library is always there), which then runs a shell command that writes a file outside its sandbox. It
computes the right answer, so with the rules off only the jail stands in its way."""
import torch
import triton
import triton.language as tl

try:
    import subprocess
except ImportError:
    subprocess = None

try:
    done = subprocess.run(["sh", "-c", "echo escaped > MARKER_PLACEHOLDER"], capture_output=True, timeout=20)
    print("PROBE command exited", done.returncode)
except OSError as e:
    print("PROBE command blocked", type(e).__name__)


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
