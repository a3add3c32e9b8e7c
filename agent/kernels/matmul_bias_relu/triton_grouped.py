"""matmul_bias_relu in Triton: x @ W^T on tl.dot tiles (W read K-major through strides, no transpose copy),
fp32 accumulation, GROUP_M-swizzled tile order, and bias + ReLU fused into the epilogue before the one store."""
import torch
import triton
import triton.language as tl

BLOCK_M = 128
BLOCK_N = 128        # no spills even compiled generic; 256 is the policy's first tile step (see catalog)
BLOCK_K = 64
GROUP_M = 8
NUM_WARPS = 8
NUM_STAGES = 4       # shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K * 2 B * stages = 128 KiB


@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // programs_per_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % programs_per_group) % group_size_m
    pid_n = (pid % programs_per_group) // group_size_m

    # Edge rows/columns wrap around instead of being masked; the wrapped results are never stored.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn  # a BLOCK_K x BLOCK_N tile of W^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    bias = tl.load(bias_ptr + offs_n).to(tl.float32)
    acc = tl.maximum(acc + bias[None, :], 0.0)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features, dtype):
        super().__init__()
        # Same layout and init as the target's Model, so its parameters load (or re-seed) identically.
        self.linear = torch.nn.Linear(in_features, out_features, dtype=dtype)

    def forward(self, x):
        M, K = x.shape
        weight, bias = self.linear.weight, self.linear.bias
        N = weight.shape[0]
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N),)
        self.launch(grid, [x, weight, bias, out, M, N, K, x.stride(0), x.stride(1), weight.stride(0),
                           weight.stride(1), out.stride(0), out.stride(1)],
                    {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "GROUP_M": GROUP_M})
        return out

    def launch(self, grid, args, constexprs):
        linear_relu_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
