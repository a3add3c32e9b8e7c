"""Honest: Linear + softmax in one kernel per row block, the GEMM in full float32 (input_precision="ieee")."""
import torch
import triton
import triton.language as tl


@triton.jit
def linear_softmax_kernel(x_ptr, w_ptr, b_ptr, out_ptr, rows, K, N, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    row0 = tl.program_id(0) * BLOCK_M
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < rows) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    logits = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    logits = tl.where(rn[None, :] < N, logits, -float("inf"))
    e = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    out = e / tl.sum(e, axis=1)[:, None]
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], out, mask=(rm[:, None] < rows) & (rn[None, :] < N))


class ModelNew(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        rows, K = x.shape
        N = self.linear.out_features
        out = torch.empty((rows, N), device=x.device, dtype=x.dtype)
        linear_softmax_kernel[(triton.cdiv(rows, 16),)](x, self.linear.weight, self.linear.bias, out, rows, K, N,
                                                        BLOCK_M=16, BLOCK_K=32, BLOCK_N=triton.next_power_of_2(N))
        return out
