"""gelu (exact erf form) in hand-written PTX: 16-byte loads and streaming stores like vector_add, with a branch-free
fp32 erf: for |z| < 1 an odd polynomial, above it erfc(|z|) = exp(-r(|z|)) with a polynomial r, so the lower tail
1 + erf(z) = erfc(|z|) keeps its relative accuracy instead of cancelling. The coefficients are least-squares fits on
Chebyshev nodes (max error of 1 + erf about 1.5e-7 absolute, erfc about 4e-6 relative); tests re-run this exact
sequence of fp32 operations in NumPy. The PTX text is generated from the tunables below."""
import math

import numpy as np
import torch

from tools.launch import PtxKernel

THREADS = 256
ELEMS_PER_THREAD = 8                    # multiple of 4: one ld.global.v4.f32 per 4 elements
LOAD_QUALIFIER = ".L1::no_allocate"     # "", ".nc" or ".L1::no_allocate"
STORE_QUALIFIER = ".cs"                 # "" or ".cs"

if THREADS % 32 or not 32 <= THREADS <= 1024 or ELEMS_PER_THREAD % 4 or ELEMS_PER_THREAD < 4:
    raise ValueError(f"THREADS must be a multiple of 32 in 32..1024 and ELEMS_PER_THREAD a positive multiple of 4, "
                     f"got {THREADS} and {ELEMS_PER_THREAD}")
VECS = ELEMS_PER_THREAD // 4

INV_SQRT2 = 0.7071067811865476
SPLIT = 1.0                  # |z| below: polynomial erf; above: exp(-r)
TAIL_CLAMP = 4.5             # erfc(4.5) = 2e-10: beyond it the tail is below fp32 tolerance, keep r in its fit range
# erf(z) = z * P(z^2) on [0, 1]; Horner order, highest power first.
ERF_SMALL_COEFFS = (-0.0005696655716747046, 0.004934506956487894, -0.0267269816249609, 0.11280788481235504,
                    -0.37612414360046387, 1.1283791065216064)
# r(t) = -log(erfc(t)) on [1, 4.5]; Horner order, highest power first.
ERFC_LOG_COEFFS = (-1.3766926940661506e-06, 4.079083009855822e-05, -0.0005514519289135933, 0.004542896058410406,
                   -0.02579410746693611, 0.10895730555057526, 0.6330389380455017, 1.1295117139816284,
                   -0.0001391423138557002)
NEG_LOG2E = -1.4426950408889634


def _f32(value):
    """A PTX fp32 immediate (0f + IEEE bits) of value rounded to fp32: exact, unlike a decimal literal."""
    exact = float(np.float32(value))
    if exact == 0.0:
        return "0f00000000"
    mantissa, exponent = math.frexp(abs(exact))  # abs(exact) = mantissa * 2**exponent, 0.5 <= mantissa < 1
    if exponent + 126 <= 0:
        raise ValueError(f"{value} is subnormal in fp32; this kernel's constants are all normal")
    bits = (exact < 0) << 31 | (exponent + 126) << 23 | (int(mantissa * 2**24) - 2**23)
    return f"0f{bits:08X}"


def _horner(acc, var, coeffs):
    lines = [f"    mov.f32 {acc}, {_f32(coeffs[0])};"]
    lines += [f"    fma.rn.f32 {acc}, {acc}, {var}, {_f32(c)};" for c in coeffs[1:]]
    return lines


def _gelu(x):
    """Instructions that replace register x by gelu(x); temporaries are reused (ptxas renames them)."""
    return [
        f"    mul.f32 %z, {x}, {_f32(INV_SQRT2)};",
        "    abs.f32 %t, %z;",
        "    mul.f32 %s, %z, %z;",
        *_horner("%ps", "%s", ERF_SMALL_COEFFS),
        f"    fma.rn.f32 %cs, %ps, %z, {_f32(1.0)};",          # 1 + erf(z) for |z| < SPLIT
        f"    min.f32 %tc, %t, {_f32(TAIL_CLAMP)};",
        *_horner("%pl", "%tc", ERFC_LOG_COEFFS),
        f"    mul.f32 %pl, %pl, {_f32(NEG_LOG2E)};",
        "    ex2.approx.ftz.f32 %e, %pl;",                       # erfc(|z|)
        f"    sub.f32 %cl, {_f32(2.0)}, %e;",
        f"    setp.lt.f32 %neg, %z, {_f32(0.0)};",
        "    selp.f32 %cl, %e, %cl, %neg;",                      # 1 + erf(z) = erfc(|z|) or 2 - erfc(|z|)
        f"    setp.lt.f32 %small, %t, {_f32(SPLIT)};",
        "    selp.f32 %cdf, %cs, %cl, %small;",
        f"    mul.f32 %h, {x}, {_f32(0.5)};",
        f"    mul.f32 {x}, %h, %cdf;",
    ]


def _build_ptx():
    loads, math, stores = [], [], []
    for i in range(VECS):
        regs = [f"%f{4 * i + j}" for j in range(4)]
        loads += [
            f"    add.u32 %idx{i}, %first, {i * THREADS};",
            f"    setp.lt.u32 %p{i}, %idx{i}, %n4;",
            f"    mul.wide.u32 %off{i}, %idx{i}, 16;",
            f"    add.s64 %px{i}, %x, %off{i};",
            f"    add.s64 %po{i}, %out, %off{i};",
            f"    @%p{i} ld.global{LOAD_QUALIFIER}.v4.f32 {{{', '.join(regs)}}}, [%px{i}];",
        ]
        for reg in regs:
            math += _gelu(reg)
        stores.append(f"    @%p{i} st.global{STORE_QUALIFIER}.v4.f32 [%po{i}], {{{', '.join(regs)}}};")
    body = "\n".join(loads + math + stores)
    tail = "\n".join(_gelu("%sx"))
    return f""".version 8.0
.target sm_90
.address_size 64

.visible .entry gelu(
    .param .u64 x_param,
    .param .u64 out_param,
    .param .u32 n_param
)
.maxntid {THREADS}, 1, 1
{{
    .reg .pred %p<{VECS}>;
    .reg .pred %tail, %neg, %small;
    .reg .b32 %idx<{VECS}>;
    .reg .b32 %n, %n4, %first, %cta, %thr, %rem, %t32;
    .reg .b64 %x, %out, %off<{VECS}>, %px<{VECS}>, %po<{VECS}>, %toff;
    .reg .f32 %f<{4 * VECS}>, %sx, %z, %t, %s, %ps, %cs, %tc, %pl, %e, %cl, %cdf, %h;

    ld.param.u64 %x, [x_param];
    ld.param.u64 %out, [out_param];
    ld.param.u32 %n, [n_param];
    cvta.to.global.u64 %x, %x;
    cvta.to.global.u64 %out, %out;
    shr.u32 %n4, %n, 2;
    mov.u32 %cta, %ctaid.x;
    mov.u32 %thr, %tid.x;
    // float4 index of this thread's first vector; its others follow at a stride of THREADS (coalesced).
    mad.lo.u32 %first, %cta, {VECS * THREADS}, %thr;
{body}

    // The last n % 4 elements: CTA 0, one thread each.
    and.b32 %rem, %n, 3;
    setp.lt.u32 %tail, %thr, %rem;
    setp.eq.and.u32 %tail, %cta, 0, %tail;
    @!%tail bra DONE;
    shl.b32 %t32, %n4, 2;
    add.u32 %t32, %t32, %thr;
    mul.wide.u32 %toff, %t32, 4;
    add.s64 %x, %x, %toff;
    add.s64 %out, %out, %toff;
    ld.global.f32 %sx, [%x];
{tail}
    st.global.f32 [%out], %sx;
DONE:
    ret;
}}
"""


PTX = _build_ptx()


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kernel = PtxKernel(PTX, "gelu")

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        vecs_per_cta = THREADS * VECS
        grid = (max(1, (n // 4 + vecs_per_cta - 1) // vecs_per_cta), 1, 1)
        self.kernel.launch(grid, (THREADS, 1, 1), [x, out, n])
        return out
