"""Honest: launch code that checks for CUDA as public Triton does (asserts, a PyTorch fallback off the GPU, a grid
sized from the SM count, allocations on device="cuda"); on the CPU it must plan its GPU path, as on a GPU. (The
tutorials' `triton.runtime.driver.active.get_active_torch_device()` answers too, tests/test_cpu_parity.py; the
static rules refuse triton.runtime for now.)"""
import torch
import triton
import triton.language as tl

DEVICE = torch.device("cuda", 0)


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        if not a.is_cuda or not torch.cuda.is_available():
            return a + b   # a PyTorch fallback, never taken where CUDA is
        assert a.is_cuda and b.device.type == "cuda" and a.device == DEVICE
        assert torch.cuda.current_device() == 0 and torch.cuda.get_device_capability() >= (8, 0)
        with torch.cuda.device(a.device.index):
            out = torch.empty(a.shape, device="cuda", dtype=a.dtype)
            sms = torch.cuda.get_device_properties(a.device).multi_processor_count
            grid = (min(sms, triton.cdiv(a.numel(), 256)),)
            add_kernel[grid](a, b, out, a.numel(), BLOCK=256)
        return out
