"""ptxas assembly, resource parsing, occupancy and PtxKernel construction: all real, all on CPU."""
import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from tools.assemble import (PtxAssembleError, assemble_ptx, cubin_resources, find_tool, sass_of,
                            theoretical_occupancy, triton_kernel_resources)
from tools.launch import NoGpuError, PtxKernel

VEC_ADD_PTX = """\
.version 8.0
.target sm_90
.address_size 64

.visible .entry vec_add(
    .param .u64 a_ptr,
    .param .u64 b_ptr,
    .param .u64 out_ptr,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [a_ptr];
    ld.param.u64 %rd2, [b_ptr];
    ld.param.u64 %rd3, [out_ptr];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32 %rd7, %r5, 4;
    add.s64 %rd8, %rd4, %rd7;
    add.s64 %rd9, %rd5, %rd7;
    add.s64 %rd10, %rd6, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
"""

# 4 KiB of static shared memory and one barrier.
SHARED_PTX = """\
.version 8.0
.target sm_90
.address_size 64
.visible .entry stage(.param .u64 p)
{
    .reg .b32 %r<4>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<3>;
    .shared .align 4 .b8 buf[4096];
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 2;
    mov.u32 %r3, buf;
    add.u32 %r3, %r3, %r2;
    ld.global.f32 %f1, [%rd2];
    st.shared.f32 [%r3], %f1;
    bar.sync 0;
    ld.shared.f32 %f1, [%r3];
    st.global.f32 [%rd2], %f1;
    ret;
}
"""


def many_live_values_ptx(n: int = 64, maxnreg: int = 24) -> str:
    """n values loaded (volatile, so never reordered) and all alive at once: with maxnreg 24 ptxas must spill."""
    body = [f"    ld.volatile.global.f32 %f{i}, [%rd2+{4 * i}];" for i in range(n)]
    body.append(f"    mov.f32 %f{n}, 0f00000000;")
    body += [f"    fma.rn.f32 %f{n + i + 1}, %f{n - 1 - i}, %f{i}, %f{n + i};" for i in range(n)]
    return "\n".join([
        ".version 8.0", ".target sm_90", ".address_size 64",
        ".visible .entry live(.param .u64 p)", f".maxnreg {maxnreg}", "{",
        f"    .reg .f32 %f<{2 * n + 2}>;", "    .reg .b64 %rd<3>;",
        "    ld.param.u64 %rd1, [p];", "    cvta.to.global.u64 %rd2, %rd1;",
        *body, f"    st.global.f32 [%rd2], %f{2 * n};", "    ret;", "}", ""])


def test_valid_ptx_reports_registers_and_no_spills():
    assembly = assemble_ptx(VEC_ADD_PTX)
    usage = assembly.kernels["vec_add"]
    assert assembly.cubin[:4] == b"\x7fELF"
    assert 4 <= usage["registers"] <= 32
    assert usage["spill_stores_bytes"] == usage["spill_loads_bytes"] == usage["stack_bytes"] == 0
    assert usage["shared_bytes"] == 0
    assert re.fullmatch(r"\d+\.\d+\.\d+", assembly.ptxas_version)
    assert "Used" in assembly.log


def test_static_shared_memory_and_barriers_are_read():
    usage = assemble_ptx(SHARED_PTX).kernels["stage"]
    assert usage["shared_bytes"] == 4096
    assert usage["barriers"] == 1


def test_register_cap_forces_spills_that_are_reported():
    usage = assemble_ptx(many_live_values_ptx()).kernels["live"]
    assert usage["registers"] <= 24
    assert usage["spill_stores_bytes"] > 0 and usage["spill_loads_bytes"] > 0
    assert usage["stack_bytes"] >= usage["spill_stores_bytes"]


def test_syntax_error_names_the_ptx_line_and_quotes_it():
    lines = VEC_ADD_PTX.splitlines()
    bad_line = lines.index("    add.f32 %f3, %f1, %f2;") + 1
    lines[bad_line - 1] = "    add.f32 %f3, %f1, %f2 oops;"
    with pytest.raises(PtxAssembleError) as caught:
        assemble_ptx("\n".join(lines) + "\n")
    message = str(caught.value)
    assert f"line {bad_line}:" in message
    assert "add.f32 %f3, %f1, %f2 oops;" in message
    assert caught.value.errors[0][0] == bad_line


def test_unknown_instruction_error_has_its_line():
    ptx = VEC_ADD_PTX.replace("mov.u32 %r4, %tid.x;", "movx.u32 %r4, %tid.x;")
    line = ptx.splitlines().index("    movx.u32 %r4, %tid.x;") + 1
    with pytest.raises(PtxAssembleError, match=rf"line {line}: .*movx"):
        assemble_ptx(ptx)


def test_error_without_a_line_is_still_reported():
    ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.extern .func f();\n.visible .entry e(){ call f; ret; }\n"
    with pytest.raises(PtxAssembleError, match="Unresolved extern function 'f'"):
        assemble_ptx(ptx)


def test_arch_specific_target_is_assembled_for_that_target():
    assert assemble_ptx(VEC_ADD_PTX.replace(".target sm_90", ".target sm_90a")).arch == "sm_90a"


def test_empty_ptx_is_refused():
    with pytest.raises(ValueError, match="PTX text"):
        assemble_ptx("  ")


def test_sass_and_cubin_resources_from_cuobjdump():
    if find_tool("cuobjdump") is None:
        pytest.skip("no cuobjdump on PATH or in Triton")
    cubin = assemble_ptx(VEC_ADD_PTX).cubin
    assert "vec_add" in sass_of(cubin)
    assert cubin_resources(cubin)["vec_add"]["registers"] == assemble_ptx(VEC_ADD_PTX).kernels["vec_add"]["registers"]


@pytest.mark.parametrize("registers, shared, threads, expected", [
    (32, 0, 256, 1.0),              # nothing limits: 8 blocks x 8 warps
    (128, 0, 256, 0.25),            # 4096 regs/warp: 16 warps fit
    (40, 0, 256, 0.75),             # 1280 regs/warp: 12 warps per sub-partition, 48 per SM, 6 blocks
    (32, 48 * 1024, 256, 0.5),      # (48 + 1 reserved) KiB per block: 4 blocks in 228 KiB
    (32, 227 * 1024, 128, 4 / 64),  # the largest block allowed: one per SM
    (16, 0, 32, 0.5),               # 32-block limit with 1-warp blocks
    (0, 0, 1024, 1.0),
    (255, 0, 1024, 0.0),            # 8192 regs/warp x 32 warps exceeds the 64K registers of a block
    (32, 227 * 1024 + 1, 128, 0.0),  # more shared memory than a block may have
])
def test_theoretical_occupancy_known_configurations(registers, shared, threads, expected):
    assert theoretical_occupancy(registers, shared, threads) == pytest.approx(expected)


def test_occupancy_device_overrides_limits():
    ampere_like = {"shared_per_sm": 164 * 1024, "max_shared_per_block": 163 * 1024, "max_threads_per_sm": 2048}
    # (48 + 1) KiB per block: 3 blocks in 164 KiB instead of 4 in 228 KiB.
    assert theoretical_occupancy(32, 48 * 1024, 256, ampere_like) == pytest.approx(24 / 64)
    with pytest.raises(ValueError, match="unknown device limit"):
        theoretical_occupancy(32, 0, 256, {"shared_memory": 1})


@pytest.mark.parametrize("registers, threads", [(300, 256), (32, 0), (32, 2048)])
def test_occupancy_rejects_impossible_inputs(registers, threads):
    with pytest.raises(ValueError):
        theoretical_occupancy(registers, 0, threads)


def scale(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


def test_triton_kernel_resources_from_an_unlaunched_compile():
    if find_tool("cuobjdump") is None:
        pytest.skip("no cuobjdump on PATH or in Triton")
    # JITFunction directly: @triton.jit gives an interpreter function under TRITON_INTERPRET=1, which cannot compile.
    compiled = triton.compile(ASTSource(JITFunction(scale), {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                        {"BLOCK": 1024}), target=GPUTarget("cuda", 90, 32))
    found = triton_kernel_resources(compiled)
    assert found["kernel"] == "scale" and found["source"] == "cuobjdump"
    assert found["registers"] > 0 and found["spills"] == 0
    assert found["threads"] == found["num_warps"] * 32
    assert 0 < found["occupancy"] <= 1
    assert found["arch"] == "sm_90a"
    assert ".entry scale" in found["ptx"]


def test_ptx_kernel_constructs_without_gpu_and_exposes_resources():
    kernel = PtxKernel(VEC_ADD_PTX, "vec_add")
    assert kernel.name == "vec_add" and kernel.ptx == VEC_ADD_PTX
    assert kernel.resources["registers"] > 0
    assert "vec_add" in kernel.log


def test_ptx_kernel_propagates_assembly_errors_and_checks_the_entry():
    with pytest.raises(PtxAssembleError, match="line"):
        PtxKernel(VEC_ADD_PTX.replace("ret;", "retx;"), "vec_add")
    with pytest.raises(ValueError, match="its .entry functions: vec_add"):
        PtxKernel(VEC_ADD_PTX, "vec_mul")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_launch_without_gpu_raises_no_gpu_error():
    with pytest.raises(NoGpuError, match="assembled but cannot launch"):
        PtxKernel(VEC_ADD_PTX, "vec_add").launch(1, 32, [None, None, None, 0])


def test_argument_conversion_rules():
    kernel = PtxKernel(VEC_ADD_PTX, "vec_add")
    values, _ = kernel._convert([None, np.uint64(16), None, 7], None)
    assert values[0] == np.uint64(0) and values[0].dtype == np.uint64
    assert values[3].dtype == np.int32 and values[3] == 7
    with pytest.raises(ValueError, match="numpy.int64"):
        kernel._convert([None, None, None, 2**40], None)
    with pytest.raises(TypeError, match=r"argument 1 \(b_ptr\) is 4 bytes"):
        kernel._convert([None, 5, None, 1], None)
    with pytest.raises(TypeError, match="has type str"):
        kernel._convert([None, None, None, "8"], None)
    with pytest.raises(TypeError, match="CUDA tensors"):
        kernel._convert([torch.zeros(4), None, None, 4], None)
