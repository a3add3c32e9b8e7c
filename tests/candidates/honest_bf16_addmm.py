"""Honest: a bf16 tl.dot accumulated in fp32, rounded to bf16, then a bf16 add, as Triton's matmul tutorial writes
it (the interpreter computed both on raw bit patterns: triton-lang/triton #5424)."""
import torch
import triton
import triton.language as tl


@triton.jit
def addmm_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    c = tl.load(c_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    out = acc.to(tl.bfloat16) + c
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], out, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b, c):
        M, K = a.shape
        N = b.shape[1]
        out = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        addmm_kernel[grid](a, b, c, out, M, N, K, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
        return out
