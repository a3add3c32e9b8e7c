"""matmul_bias_relu for Hopper, one output tile per program in GROUP_M-swizzled order, with Triton's automatic warp
specialization: a producer warp group issues the TMA loads of x and W (device-side tensor descriptors; W K-major as it
is stored) into a NUM_STAGES-deep ring while two consumer warp groups run wgmma (HGMMA) on it, then add the bias,
apply ReLU in registers and store the tile once by TMA. Triton 3.6 specializes this loop on sm_90 with NUM_WARPS = 4
and device-side descriptors only; a persistent loop around it does not compile there, hence one tile per program.

Shapes TMA cannot describe (rows that are not a multiple of 16 bytes, e.g. K = 777 in bf16) take masked pointer
loads with the FALLBACK tile (USE_TMA False, no warp specialization). Device-side descriptors live in Triton's global
scratch memory: the allocator below serves direct runs; kloop's trusted executor provides it as a plan allocation."""
import torch
import triton
import triton.language as tl

BLOCK_M = 128
BLOCK_N = 256
BLOCK_K = 64
GROUP_M = 8
NUM_WARPS = 4        # warp specialization on sm_90 wants 4 here (one producer + two consumer warp groups result)
NUM_STAGES = 3       # shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K * 2 B * stages + the epilogue's tile
WARP_SPECIALIZE = True
FALLBACK = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}  # no spills, any shape


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


triton.set_allocator(_scratch)


@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                       stride_om, stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // programs_per_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % programs_per_group) % group_size_m
    pid_n = (pid % programs_per_group) // group_size_m
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    out_cols = off_n + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_TMA:  # out-of-range rows, columns and K: zero-filled on load, clipped on store by the TMA unit
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1],
                                             block_shape=[BLOCK_M, BLOCK_N])
        for kk in tl.range(tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
            acc = tl.dot(x_desc.load([off_m, kk * BLOCK_K]), w_desc.load([off_n, kk * BLOCK_K]).T, acc)
        bias = tl.load(bias_ptr + out_cols, mask=out_cols < N, other=0.0).to(tl.float32)
        out_desc.store([off_m, off_n], tl.maximum(acc + bias[None, :], 0.0).to(out_ptr.dtype.element_ty))
    else:
        rows = (off_m + tl.arange(0, BLOCK_M)) % M   # wrapped edge rows/columns are never stored
        cols = out_cols % N
        for kk in range(tl.cdiv(K, BLOCK_K)):
            ks = kk * BLOCK_K + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=ks[None, :] < K, other=0.0)
            w = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :] * stride_wk, mask=ks[None, :] < K, other=0.0)
            acc = tl.dot(x, w.T, acc)
        bias = tl.load(bias_ptr + out_cols, mask=out_cols < N, other=0.0).to(tl.float32)
        out_rows = off_m + tl.arange(0, BLOCK_M)
        tl.store(out_ptr + out_rows[:, None] * stride_om + out_cols[None, :] * stride_on,
                 tl.maximum(acc + bias[None, :], 0.0).to(out_ptr.dtype.element_ty),
                 mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def _tma_ok(t):
    """TMA needs a contiguous last dimension and 16-byte aligned rows and base."""
    size = t.element_size()
    return t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and (t.storage_offset() * size) % 16 == 0


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
        use_tma = _tma_ok(x) and _tma_ok(weight) and _tma_ok(out)
        config = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "num_warps": NUM_WARPS,
                  "num_stages": NUM_STAGES} if use_tma else FALLBACK
        grid = (((M + config["BLOCK_M"] - 1) // config["BLOCK_M"]) * ((N + config["BLOCK_N"] - 1) // config["BLOCK_N"]),)
        linear_relu_kernel[grid](x, weight, bias, out, M, N, K, x.stride(0), x.stride(1), weight.stride(0),
                                 weight.stride(1), out.stride(0), out.stride(1), GROUP_M=GROUP_M, USE_TMA=use_tma,
                                 WARP_SPECIALIZE=WARP_SPECIALIZE and use_tma, **config)
        return out
