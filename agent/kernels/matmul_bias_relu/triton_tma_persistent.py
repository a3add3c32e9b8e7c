"""matmul_bias_relu for Hopper: relu(x @ W^T + b) by persistent programs (PROGRAMS_PER_SM per SM) that walk the
output tiles in GROUP_M-swizzled order. x and W tiles arrive by TMA (host-side tensor descriptors: W is read K-major
as it is stored, and tl.dot takes its transpose as a view) into a NUM_STAGES-deep shared-memory ring; tl.dot lowers to
wgmma (HGMMA) with fp32 accumulation; bias and ReLU are applied in registers and the tile leaves by TMA stores, so
the output is written once.

The same kernel takes tensors instead of descriptors where TMA cannot describe an operand (rows that are not a
multiple of 16 bytes, e.g. K = 777 in bf16): USE_TMA False, masked pointer loads and the FALLBACK tile."""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

BLOCK_M = 128
BLOCK_N = 256        # 128x256 fp32 accumulator over 8 warps: 128 registers per thread
BLOCK_K = 64
GROUP_M = 8
NUM_WARPS = 8
NUM_STAGES = 3       # shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K * 2 B * stages + the epilogue's tile
PROGRAMS_PER_SM = 1
EPILOGUE_SUBTILE = True   # bias, ReLU and store in two BLOCK_N / 2 halves: half the epilogue's registers and smem
FLATTEN = True            # one flattened tile x K loop: the next tile's loads are in flight during the epilogue
FALLBACK = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}  # no spills, any shape


@triton.jit
def linear_relu_kernel(x, w, bias_ptr, out, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
                       FLATTEN: tl.constexpr):
    # x, w, out: tensor descriptors (USE_TMA; out's block is BLOCK_N / 2 wide with EPILOGUE_SUBTILE) or tensors
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    programs_per_group = GROUP_M * num_pid_n
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=FLATTEN):
        first_pid_m = (tile // programs_per_group) * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile % programs_per_group) % group_size_m
        pid_n = (tile % programs_per_group) // group_size_m
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = (off_m + tl.arange(0, BLOCK_M)) % M   # pointer path: wrapped edge rows/columns are never stored
        cols = (off_n + tl.arange(0, BLOCK_N)) % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            off_k = kk * BLOCK_K
            if USE_TMA:  # out-of-range rows, columns and K: zero-filled by the TMA unit
                x_tile = x.load([off_m, off_k])
                w_tile = w.load([off_n, off_k])
            else:
                ks = off_k + tl.arange(0, BLOCK_K)
                x_tile = tl.load(x + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=ks[None, :] < K,
                                 other=0.0)
                w_tile = tl.load(w + cols[:, None] * stride_wn + ks[None, :] * stride_wk, mask=ks[None, :] < K,
                                 other=0.0)
            acc = tl.dot(x_tile, w_tile.T, acc)

        out_cols = off_n + tl.arange(0, BLOCK_N)
        bias = tl.load(bias_ptr + out_cols, mask=out_cols < N, other=0.0).to(tl.float32)
        acc = tl.maximum(acc + bias[None, :], 0.0)
        if USE_TMA:  # stores are clipped to the output's shape by the TMA unit
            if EPILOGUE_SUBTILE:
                left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
                out.store([off_m, off_n], left.to(out.dtype))
                out.store([off_m, off_n + BLOCK_N // 2], right.to(out.dtype))
            else:
                out.store([off_m, off_n], acc.to(out.dtype))
        else:
            out_rows = off_m + tl.arange(0, BLOCK_M)
            tl.store(out + out_rows[:, None] * stride_om + out_cols[None, :] * stride_on,
                     acc.to(out.dtype.element_ty), mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


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
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        programs = min(tiles, sms * PROGRAMS_PER_SM)
        operands = [x, weight, out]
        if use_tma:
            operands = [TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
                        TensorDescriptor.from_tensor(out, [bm, bn // 2 if EPILOGUE_SUBTILE else bn])]
        linear_relu_kernel[(programs,)](operands[0], operands[1], bias, operands[2], M, N, K, x.stride(0), x.stride(1),
                                        weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
                                        GROUP_M=GROUP_M, NUM_PROGRAMS=programs, USE_TMA=use_tma,
                                        EPILOGUE_SUBTILE=EPILOGUE_SUBTILE, FLATTEN=FLATTEN and use_tma, **config)
        return out
