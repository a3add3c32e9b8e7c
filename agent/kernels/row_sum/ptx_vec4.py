"""row_sum in hand-written PTX: one CTA per row; each thread keeps UNROLL independent 16-byte loads in flight per
loop trip, then warp shuffles and one shared-memory step reduce the CTA. Rows that are not 16-byte aligned (row
length not a multiple of 4) take a scalar loop. The PTX text is generated from the tunables below."""
import torch

from tools.launch import PtxKernel

THREADS = 512               # multiple of 32, at most 1024
UNROLL = 4                  # float4 loads in flight per thread per loop trip
LOAD_QUALIFIER = ".nc"      # "", ".nc" or ".L1::no_allocate"

if THREADS % 32 or not 32 <= THREADS <= 1024 or UNROLL < 1:
    raise ValueError(f"THREADS must be a multiple of 32 in 32..1024 and UNROLL at least 1, got {THREADS} and {UNROLL}")
WARPS = THREADS // 32


def _loop(label, width, count):
    """A loop over `count` items of `width` floats (4: v4 loads, 1: scalar loads) strided by THREADS."""
    step = THREADS * UNROLL
    lines = ["    mov.u32 %i, %thr;", f"{label}_LOOP:", f"    setp.ge.u32 %done, %i, {count};",
             f"    @%done bra {label}_END;"]
    for u in range(UNROLL):
        lines += [f"    add.u32 %j, %i, {u * THREADS};", f"    setp.lt.u32 %p{u}, %j, {count};",
                  f"    mul.wide.u32 %off, %j, {4 * width};", f"    add.s64 %addr{u}, %row, %off;"]
    for u in range(UNROLL):
        if width == 4:
            v = [f"%v{4 * u + k}" for k in range(4)]
            lines += [f"    mov.f32 {r}, 0f00000000;" for r in v]
            lines.append(f"    @%p{u} ld.global{LOAD_QUALIFIER}.v4.f32 {{{', '.join(v)}}}, [%addr{u}];")
        else:
            lines += [f"    mov.f32 %v{4 * u}, 0f00000000;",
                      f"    @%p{u} ld.global{LOAD_QUALIFIER}.f32 %v{4 * u}, [%addr{u}];"]
    for u in range(UNROLL):
        lines += [f"    add.f32 %acc{u}, %acc{u}, %v{4 * u + k};" for k in range(width)]
    lines += [f"    add.u32 %i, %i, {step};", f"    bra.uni {label}_LOOP;", f"{label}_END:"]
    return lines


def _build_ptx():
    acc_init = [f"    mov.f32 %acc{u}, 0f00000000;" for u in range(UNROLL)]
    acc_sum = [f"    add.f32 %acc0, %acc0, %acc{u};" for u in range(1, UNROLL)]
    shuffle = []
    for lane_mask in (16, 8, 4, 2, 1):
        shuffle += [f"    shfl.sync.bfly.b32 %other, %acc0, {lane_mask}, 31, -1;", "    add.f32 %acc0, %acc0, %other;"]
    body = "\n".join(
        acc_init
        + ["    @%scalar bra SCALAR;"] + _loop("VEC", 4, "%n4") + ["    bra.uni REDUCE;", "SCALAR:"]
        + _loop("SCL", 1, "%ncols")
        + ["REDUCE:"] + acc_sum + shuffle
    )
    return f""".version 8.0
.target sm_90
.address_size 64

.visible .entry row_sum(
    .param .u64 x_param,
    .param .u64 out_param,
    .param .u32 ncols_param
)
.maxntid {THREADS}, 1, 1
{{
    .reg .pred %p<{UNROLL}>;
    .reg .pred %done, %scalar, %unaligned, %lane0, %warp0, %has;
    .reg .b32 %ncols, %n4, %cta, %thr, %i, %j, %lane, %warp, %low;
    .reg .b64 %x, %out, %row, %off, %addr<{UNROLL}>, %align, %sh;
    .reg .f32 %acc<{UNROLL}>, %v<{4 * UNROLL}>, %other;
    .shared .align 4 .f32 partial[{WARPS}];

    ld.param.u64 %x, [x_param];
    ld.param.u64 %out, [out_param];
    ld.param.u32 %ncols, [ncols_param];
    cvta.to.global.u64 %x, %x;
    cvta.to.global.u64 %out, %out;
    mov.u32 %cta, %ctaid.x;
    mov.u32 %thr, %tid.x;
    mul.wide.u32 %off, %cta, %ncols;
    shl.b64 %off, %off, 2;
    add.s64 %row, %x, %off;
    shr.u32 %n4, %ncols, 2;
    // Vector loads need a 16-byte aligned row and no ragged end: row length a multiple of 4, aligned start.
    and.b32 %low, %ncols, 3;
    setp.ne.u32 %scalar, %low, 0;
    and.b64 %align, %row, 15;
    setp.ne.u64 %unaligned, %align, 0;
    or.pred %scalar, %scalar, %unaligned;
{body}
    and.b32 %lane, %thr, 31;
    shr.u32 %warp, %thr, 5;
    setp.eq.u32 %lane0, %lane, 0;
    mov.u64 %sh, partial;
    mul.wide.u32 %off, %warp, 4;
    add.s64 %off, %sh, %off;
    @%lane0 st.shared.f32 [%off], %acc0;
    bar.sync 0;
    setp.eq.u32 %warp0, %warp, 0;
    @!%warp0 bra DONE;
    setp.lt.u32 %has, %lane, {WARPS};
    mov.f32 %acc0, 0f00000000;
    mul.wide.u32 %off, %lane, 4;
    add.s64 %off, %sh, %off;
    @%has ld.shared.f32 %acc0, [%off];
{chr(10).join(f"    shfl.sync.bfly.b32 %other, %acc0, {m}, 31, -1;{chr(10)}    add.f32 %acc0, %acc0, %other;" for m in (16, 8, 4, 2, 1))}
    @!%lane0 bra DONE;
    mul.wide.u32 %off, %cta, 4;
    add.s64 %out, %out, %off;
    st.global.f32 [%out], %acc0;
DONE:
    ret;
}}
"""


PTX = _build_ptx()


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.kernel = PtxKernel(PTX, "row_sum")

    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty(n_rows, dtype=x.dtype, device=x.device)
        self.kernel.launch((n_rows, 1, 1), (THREADS, 1, 1), [x, out, n_cols])
        return out
