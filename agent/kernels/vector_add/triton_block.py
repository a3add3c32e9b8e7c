"""vector_add in Triton: each program adds one contiguous block; big blocks keep enough bytes in flight for HBM3."""
import torch
import triton
import triton.language as tl

BLOCK_SIZE = 4096      # elements per program (16 per thread at 8 warps: four 16-byte loads per operand)
NUM_WARPS = 8
EVICTION = "evict_first"  # streamed data is never reused: do not let it push other lines out of L2


@triton.jit
def vector_add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr, EVICTION: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    a = tl.load(a_ptr + offsets, mask=mask, eviction_policy=EVICTION)
    b = tl.load(b_ptr + offsets, mask=mask, eviction_policy=EVICTION)
    tl.store(out_ptr + offsets, a + b, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        n = a.numel()
        grid = ((n + BLOCK_SIZE - 1) // BLOCK_SIZE,)
        self.launch(grid, [a, b, out, n], {"BLOCK_SIZE": BLOCK_SIZE, "EVICTION": EVICTION})
        return out

    def launch(self, grid, args, constexprs):
        vector_add_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
