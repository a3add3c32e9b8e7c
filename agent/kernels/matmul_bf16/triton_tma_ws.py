"""matmul_bf16 for Hopper, one output tile per program in GROUP_M-swizzled order, with Triton's automatic warp
specialization: a producer warp group issues the TMA loads of A and B (device-side tensor descriptors) into a
NUM_STAGES-deep ring while two consumer warp groups run wgmma (HGMMA) on it, registers rebalanced by setmaxnreg.
Triton 3.6 specializes this loop on sm_90 with NUM_WARPS = 4 (its consumer groups then hold 12 warps in all) and
device-side descriptors only; a persistent loop around it does not compile there, hence one tile per program.

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
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_TMA:  # out-of-range rows, columns and K: zero-filled on load, clipped on store by the TMA unit
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
        for kk in tl.range(tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
            acc = tl.dot(a_desc.load([off_m, kk * BLOCK_K]), b_desc.load([kk * BLOCK_K, off_n]), acc)
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))
    else:
        rows = (off_m + tl.arange(0, BLOCK_M)) % M   # wrapped edge rows/columns are never stored
        cols = (off_n + tl.arange(0, BLOCK_N)) % N
        for kk in range(tl.cdiv(K, BLOCK_K)):
            ks = kk * BLOCK_K + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak, mask=ks[None, :] < K, other=0.0)
            b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn, mask=ks[:, None] < K, other=0.0)
            acc = tl.dot(a, b, acc)
        out_rows = off_m + tl.arange(0, BLOCK_M)
        out_cols = off_n + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def _tma_ok(t):
    """TMA needs a contiguous last dimension and 16-byte aligned rows and base."""
    size = t.element_size()
    return t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and (t.storage_offset() * size) % 16 == 0


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), dtype=a.dtype, device=a.device)
        use_tma = _tma_ok(a) and _tma_ok(b) and _tma_ok(c)
        config = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "num_warps": NUM_WARPS,
                  "num_stages": NUM_STAGES} if use_tma else FALLBACK
        grid = (((M + config["BLOCK_M"] - 1) // config["BLOCK_M"]) * ((N + config["BLOCK_N"] - 1) // config["BLOCK_N"]),)
        matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                            c.stride(1), GROUP_M=GROUP_M, USE_TMA=use_tma, WARP_SPECIALIZE=WARP_SPECIALIZE and use_tma,
                            **config)
        return c
