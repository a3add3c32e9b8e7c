"""kloop's Triton GEMM: what an Inductor starter computes a matmul with where Inductor's wrapper calls a library.

Inductor's GEMM templates are the starter's matmuls (max-autotune, TRITON backend: agent/kernels/inductor.py), but
where no template applies its wrapper still calls cuBLAS (`extern_kernels.mm`, `addmm`, `bmm`, `baddbmm`). The
generator translates each such call into a call of the launcher of the same name here (`_mm`, `_addmm`, `_bmm`,
`_baddbmm`: inductor.OWN_LAUNCHERS), whose source the candidate holds verbatim (`candidate_source`), tuned by
`GEMM_*` constants. The recurrent layers' input projections (agent/kernels/inductor_rnn.py) use it too.

One kernel serves all four: out[b] = alpha * A[b] @ B[b] + beta * C[b], any strides (a transposed operand is a view),
the addend broadcast through zero strides, sizes at run time (one compiled kernel serves every shape). fp32 operands
multiply as 3xTF32 on the tensor cores (about fp32's accuracy; plain TF32 would miss fp32's tolerance), as kloop's
convolution does; half-precision ones as a plain dot with an fp32 accumulator.
"""
from __future__ import annotations

import inspect
import re

import torch
import triton
import triton.language as tl

GEMM_BLOCK_M = 64
GEMM_BLOCK_N = 64
GEMM_BLOCK_K = 32
GEMM_NUM_WARPS = 4
GEMM_NUM_STAGES = 3

TUNABLES = {"GEMM_BLOCK_M": [16, 32, 64, 128], "GEMM_BLOCK_N": [16, 32, 64, 128], "GEMM_BLOCK_K": [16, 32, 64],
            "GEMM_NUM_WARPS": [2, 4, 8], "GEMM_NUM_STAGES": [1, 2, 3, 4]}
DEFAULTS = {"GEMM_BLOCK_M": GEMM_BLOCK_M, "GEMM_BLOCK_N": GEMM_BLOCK_N, "GEMM_BLOCK_K": GEMM_BLOCK_K,
            "GEMM_NUM_WARPS": GEMM_NUM_WARPS, "GEMM_NUM_STAGES": GEMM_NUM_STAGES}
# Settings timed beside the defaults when a starter is generated on a GPU (agent/kernels/starter_tune.py): tiles of
# Inductor's own mm template configurations that fit TUNABLES.
CONFIGS = [{"GEMM_BLOCK_M": m, "GEMM_BLOCK_N": n, "GEMM_BLOCK_K": k, "GEMM_NUM_WARPS": w, "GEMM_NUM_STAGES": s}
           for m, n, k, w, s in [(128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (64, 32, 32, 4, 4),
                                 (32, 32, 16, 2, 2), (128, 128, 64, 8, 2)]]
# Under the CPU interpreter every program is Python over numpy tiles: few, large programs.
INTERPRETER_DEFAULTS = {**DEFAULTS, "GEMM_BLOCK_M": 128, "GEMM_BLOCK_N": 128, "GEMM_BLOCK_K": 64}
NOTE = ("kloop's Triton GEMM (_gemm_kernel, sizes at run time) runs the matmuls Inductor would leave to cuBLAS, "
        "tuned by the GEMM_* constants")


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, y_ptr, M, N, K, alpha, beta,
                 sab, sam, sak, sbb, sbk, sbn, scb, scm, scn, syb, sym, syn,
                 HAS_ADDEND: tl.constexpr, IEEE: tl.constexpr, LARGE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program: a BLOCK_M x BLOCK_N tile of batch entry program_id(2).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    batch = tl.program_id(2)
    if LARGE:
        pid_m, pid_n, batch = pid_m.to(tl.int64), pid_n.to(tl.int64), batch.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    a_rows = a_ptr + batch * sab + rows[:, None] * sam
    b_cols = b_ptr + batch * sbb + cols[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_ok = k < K
        a = tl.load(a_rows + k[None, :] * sak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_cols + k[:, None] * sbk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if IEEE:
            acc += tl.dot(a, b, input_precision="tf32x3")
        else:
            acc += tl.dot(a, b)
    acc = acc * alpha
    ok = row_ok[:, None] & col_ok[None, :]
    if HAS_ADDEND:
        c = tl.load(c_ptr + batch * scb + rows[:, None] * scm + cols[None, :] * scn, mask=ok, other=0.0)
        acc += beta * c.to(tl.float32)
    tl.store(y_ptr + batch * syb + rows[:, None] * sym + cols[None, :] * syn, acc.to(y_ptr.dtype.element_ty),
             mask=ok)


def _gemm(a, b, addend, out, alpha, beta):
    """out[i] = alpha * a[i] @ b[i] (+ beta * addend[i], broadcast to out's shape): 3-D operands, any strides."""
    batches, m, n = out.shape
    k = a.shape[2]
    if batches == 0 or m == 0 or n == 0:
        return out
    c = addend.expand(out.shape) if addend is not None else out
    # the furthest element of an operand from its start: int32 index math below 2**31 - 1
    reach = max(sum((size - 1) * abs(step) for size, step in zip(t.shape, t.stride())) for t in (a, b, c, out))
    grid = ((m + GEMM_BLOCK_M - 1) // GEMM_BLOCK_M, (n + GEMM_BLOCK_N - 1) // GEMM_BLOCK_N, batches)
    _gemm_kernel[grid](a, b, c, out, m, n, k, float(alpha), float(beta), *a.stride(), *b.stride(), *c.stride(),
                       *out.stride(), HAS_ADDEND=addend is not None and beta != 0,
                       IEEE=a.dtype == torch.float32 and b.dtype == torch.float32, LARGE=reach >= 2**31 - 1,
                       BLOCK_M=GEMM_BLOCK_M, BLOCK_N=GEMM_BLOCK_N, BLOCK_K=GEMM_BLOCK_K, num_warps=GEMM_NUM_WARPS,
                       num_stages=GEMM_NUM_STAGES)
    return out


def _mm(a, b, out):
    _gemm(a.unsqueeze(0), b.unsqueeze(0), None, out.unsqueeze(0), 1.0, 0.0)
    return out


def _addmm(addend, a, b, alpha=1, beta=1, out=None):
    _gemm(a.unsqueeze(0), b.unsqueeze(0), addend.expand(out.shape).unsqueeze(0), out.unsqueeze(0), alpha, beta)
    return out


def _bmm(a, b, out):
    _gemm(a, b, None, out, 1.0, 0.0)
    return out


def _baddbmm(addend, a, b, alpha=1, beta=1, out=None):
    _gemm(a, b, addend.expand(out.shape), out, alpha, beta)
    return out


def candidate_source(call: str) -> str:
    """The kernel and the launchers that `call` (a translated wrapper) uses, as a candidate holds them (the tunables
    are written by the generator)."""
    launchers = [f for f in (_mm, _addmm, _bmm, _baddbmm) if re.search(rf"\b{f.__name__}\(", call)]
    return "\n\n".join(inspect.getsource(f) for f in (_gemm_kernel.fn, _gemm, *launchers))
