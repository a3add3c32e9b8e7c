"""matmul_bf16 for Hopper: persistent programs (PROGRAMS_PER_SM per SM) walk the output tiles in GROUP_M-swizzled
order; A and B tiles arrive by TMA (device-side tensor descriptors) into a NUM_STAGES-deep shared-memory ring, tl.dot
lowers to wgmma (HGMMA) with fp32 accumulation, and C leaves by TMA stores. Shapes TMA cannot describe (a row that is
not a multiple of 16 bytes, e.g. K = 777 in bf16) take the same loop with masked pointer loads and the FALLBACK
tile (USE_TMA False).

Device-side descriptors live in Triton's global scratch memory: the allocator below serves direct runs; under kloop's
evaluator the trusted executor provides that scratch itself, as an allocation of the plan."""
import torch
import triton
import triton.language as tl

BLOCK_M = 128
BLOCK_N = 256        # 128x256 fp32 accumulator over 8 warps: 128 registers per thread
BLOCK_K = 64
GROUP_M = 8
NUM_WARPS = 8
NUM_STAGES = 3       # shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K * 2 B * stages + the epilogue's tile
PROGRAMS_PER_SM = 1
EPILOGUE_SUBTILE = True   # store C in two BLOCK_N / 2 halves: half the epilogue's registers and shared memory
FLATTEN = True            # one flattened tile x K loop: the next tile's loads are in flight during the epilogue
FALLBACK = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}  # no spills, any shape


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


triton.set_allocator(_scratch)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
                  FLATTEN: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    programs_per_group = GROUP_M * num_pid_n
    if USE_TMA:
        # Out-of-range rows, columns and K are zero-filled on load and clipped on store by the TMA unit.
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
        if EPILOGUE_SUBTILE:
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                               block_shape=[BLOCK_M, BLOCK_N // 2])
        else:
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                               block_shape=[BLOCK_M, BLOCK_N])
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=FLATTEN):
        first_pid_m = (tile // programs_per_group) * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile % programs_per_group) % group_size_m
        pid_n = (tile % programs_per_group) // group_size_m
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        # Pointer path: edge rows/columns wrap around (modulo) so loads need no M/N mask; they are never stored.
        rows = (off_m + tl.arange(0, BLOCK_M)) % M
        cols = (off_n + tl.arange(0, BLOCK_N)) % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            off_k = kk * BLOCK_K
            if USE_TMA:
                a = a_desc.load([off_m, off_k])
                b = b_desc.load([off_k, off_n])
            else:
                ks = off_k + tl.arange(0, BLOCK_K)
                a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak, mask=ks[None, :] < K,
                            other=0.0)
                b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn, mask=ks[:, None] < K,
                            other=0.0)
            acc = tl.dot(a, b, acc)

        if USE_TMA:
            if EPILOGUE_SUBTILE:
                halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
                left, right = tl.split(halves)
                c_desc.store([off_m, off_n], left.to(c_ptr.dtype.element_ty))
                c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_ptr.dtype.element_ty))
            else:
                c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))
        else:
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
        tiles = ((M + config["BLOCK_M"] - 1) // config["BLOCK_M"]) * ((N + config["BLOCK_N"] - 1) // config["BLOCK_N"])
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
        programs = min(tiles, sms * PROGRAMS_PER_SM)
        matmul_kernel[(programs,)](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                                   c.stride(1), GROUP_M=GROUP_M, NUM_PROGRAMS=programs, USE_TMA=use_tma,
                                   EPILOGUE_SUBTILE=EPILOGUE_SUBTILE, FLATTEN=FLATTEN and use_tma, **config)
        return c
