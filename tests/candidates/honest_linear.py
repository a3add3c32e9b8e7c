"""Honest: a linear layer whose weights are the candidate's own nn.Linear parameters (made in __init__ from the
same seeded generator as the reference's), multiplied in a Triton kernel."""
import torch
import triton
import triton.language as tl


@triton.jit
def linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, k_dim, n_dim, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * k_dim + ks, mask=ks < k_dim, other=0.0)
        w = tl.load(w_ptr + cols[:, None] * k_dim + ks[None, :], mask=(cols[:, None] < n_dim) & (ks[None, :] < k_dim),
                    other=0.0)
        acc += tl.sum(w * x[None, :], axis=1)
    bias = tl.load(b_ptr + cols, mask=cols < n_dim, other=0.0)
    tl.store(out_ptr + row * n_dim + cols, acc + bias, mask=cols < n_dim)


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        n = self.linear.out_features
        out = torch.empty(x.shape[0], n, device=x.device, dtype=x.dtype)
        linear_kernel[(x.shape[0], triton.cdiv(n, 32))](x, self.linear.weight, self.linear.bias, out,
                                                         x.shape[1], n, BLOCK_N=32, BLOCK_K=32)
        return out
