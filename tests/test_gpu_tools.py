"""The GPU-facing tools on a real CUDA GPU: PTX launches, timing, device facts, occupancy, Nsight Compute."""
import math
import os
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from test_assemble import SHARED_PTX, VEC_ADD_PTX, many_live_values_ptx
from tools.assemble import device_limits, theoretical_occupancy
from tools.launch import PtxKernel, _load_function
from tools.profile import find_ncu, gpu_info, nvml_snapshot, run_ncu, throttle_reasons, time_interleaved
from tools.timing import flush_buffer, timed_call

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]

# Each thread stores its value in dynamic shared memory at `offset` bytes, reads it back and writes twice it.
SHARED_DOUBLE_PTX = """\
.version 8.0
.target sm_90
.address_size 64
.extern .shared .align 16 .b8 dyn[];

.visible .entry shared_double(
    .param .u64 x_ptr,
    .param .u64 out_ptr,
    .param .u32 offset
)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [x_ptr];
    ld.param.u64 %rd2, [out_ptr];
    ld.param.u32 %r1, [offset];
    mov.u32 %r2, %tid.x;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mad.lo.s32 %r5, %r3, %r4, %r2;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    mov.u32 %r6, dyn;
    add.u32 %r6, %r6, %r1;
    shl.b32 %r7, %r2, 2;
    add.u32 %r6, %r6, %r7;
    st.shared.f32 [%r6], %f1;
    bar.sync 0;
    ld.shared.f32 %f2, [%r6];
    add.f32 %f2, %f2, %f2;
    st.global.f32 [%rd5], %f2;
    ret;
}
"""


def test_ptx_vector_add_matches_torch():
    n = 100_003  # not a multiple of the block: the bounds check matters
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    kernel = PtxKernel(VEC_ADD_PTX, "vec_add")
    kernel.launch(math.ceil(n / 256), 256, [a, b, out, n])
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + b)


def test_ptx_launch_follows_torchs_current_stream():
    n = 1 << 20
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.zeros_like(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        PtxKernel(VEC_ADD_PTX, "vec_add").launch((n // 256, 1, 1), (256, 1, 1), [a, b, out, np.uint32(n)])
    side.synchronize()
    torch.testing.assert_close(out, a + b)


def test_ptx_launch_with_large_dynamic_shared_memory():
    shared = 150 * 1024  # above the 48 KiB default: the kernel must opt in first
    block, blocks = 256, 8
    x = torch.randn(block * blocks, device="cuda")
    out = torch.empty_like(x)
    PtxKernel(SHARED_DOUBLE_PTX, "shared_double").launch(blocks, block, [x, out, shared - block * 4],
                                                         shared_mem=shared)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 2 * x)


def test_ptx_launch_argument_errors():
    kernel = PtxKernel(VEC_ADD_PTX, "vec_add")
    a = torch.zeros(4, device="cuda")
    with pytest.raises(TypeError, match="CUDA tensors"):
        kernel.launch(1, 32, [a, torch.zeros(4), a, 4])
    with pytest.raises(TypeError, match="takes 4 parameters"):
        kernel.launch(1, 32, [a, a, a])
    with pytest.raises(ValueError, match="threads"):
        kernel.launch(1, (64, 32), [a, a, a, 4])


def test_time_interleaved_gives_sane_medians():
    small = torch.randn(1 << 16, device="cuda")
    large = torch.randn(1 << 26, device="cuda")
    results = time_interleaved({"small": lambda: small * 2, "large": lambda: large * 2}, calls=12, warmup=2)
    for name in ("small", "large"):
        stats = results[name]
        assert stats["n"] == 12
        assert 0 < stats["min"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["max"]
        assert stats["events_total_ms"] <= stats["wall_total_ms"]
    # 256 MiB read and 256 MiB written take over 100 us on any current GPU; 256 KiB is mostly launch overhead.
    assert results["large"]["median"] > 100
    assert results["large"]["median"] > 3 * results["small"]["median"]


def test_timed_call_starts_cold_only_with_a_flush():
    # a quarter of the L2 read again: from the L2 when nothing flushed it, from memory after each flush
    x = torch.ones(torch.cuda.get_device_properties(0).L2_cache_size // 16, device="cuda")
    flush = flush_buffer(0)
    assert flush.numel() == 2 * torch.cuda.get_device_properties(0).L2_cache_size
    out, _, _ = timed_call(x.sum, flush)
    assert out.item() == x.numel()
    cold = sorted(timed_call(x.sum, flush)[1] for _ in range(21))
    warm = sorted(timed_call(x.sum, None)[1] for _ in range(21))
    assert cold[10] > warm[10] > 0


def test_gpu_info_fields():
    info = gpu_info()
    assert info["name"] and info["sms"] > 0 and info["l2_bytes"] > 0
    assert re.fullmatch(r"\d+\.\d+", info["cc"])
    assert info["total_memory_bytes"] > 1 << 30
    assert info["cuda"] and info["driver"]
    assert info["peak_gbps"] > 500
    if "H100" in info["name"] or "H200" in info["name"]:
        assert 1500 < info["peak_gbps"] < 5500  # H100 PCIe 2.0 TB/s .. H200 4.8 TB/s
        assert info["peak_tflops_bf16"] >= 756 and info["peak_tflops_fp32"] >= 51


def test_nvml_snapshot_fields_and_energy_grows():
    before = nvml_snapshot()
    x = torch.randn(1 << 26, device="cuda")
    for _ in range(50):
        x = x * 1.0001
    torch.cuda.synchronize()
    after = nvml_snapshot()
    assert before["sm_clock_mhz"] > 0 and before["max_sm_clock_mhz"] >= before["sm_clock_mhz"]
    assert before["mem_clock_mhz"] > 0 and before["max_mem_clock_mhz"] > 0
    assert before["power_w"] > 0 and 0 < before["temperature_c"] < 110
    assert isinstance(before["clock_event_reasons"], list)
    assert after["energy_mj"] >= before["energy_mj"]
    assert isinstance(throttle_reasons(before, after), list)


@pytest.mark.parametrize("ptx, entry", [(VEC_ADD_PTX, "vec_add"), (many_live_values_ptx(64, maxnreg=255), "live"),
                                        (many_live_values_ptx(96, maxnreg=255), "live"), (SHARED_PTX, "stage")])
def test_theoretical_occupancy_agrees_with_the_driver(ptx, entry):
    import cupy

    kernel = PtxKernel(ptx, entry)
    device = torch.cuda.current_device()
    function = _load_function(kernel.assembly.cubin, entry, device)
    limits = device_limits(device)
    driver = cupy.cuda.driver
    max_dynamic = 200 * 1024
    with cupy.cuda.Device(device):
        driver.funcSetAttribute(function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_dynamic)
        max_threads = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function.ptr)
        assert driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, function.ptr) == kernel.resources["registers"]
        for block in (32, 96, 128, 256, 512, 1024):
            for dynamic in (0, 20_000, 60 * 1024, max_dynamic):
                ours = theoretical_occupancy(kernel.resources["registers"], kernel.resources["shared_bytes"] + dynamic,
                                             block, limits)
                if block > max_threads:  # too many registers for such a block: it cannot launch
                    assert ours == 0.0, (block, dynamic)
                    continue
                blocks = driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, block, dynamic)
                warps = math.ceil(block / limits["warp_size"])
                assert ours == pytest.approx(blocks * warps / limits["max_warps_per_sm"]), (block, dynamic, blocks)


@pytest.mark.slow
def test_run_ncu_profiles_a_tiny_script(tmp_path):
    if find_ncu() is None:
        pytest.skip("no ncu on this machine")
    script = tmp_path / "tiny.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from tools.launch import PtxKernel
        PTX = {VEC_ADD_PTX!r}
        n = 1 << 22
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.empty_like(a)
        kernel = PtxKernel(PTX, "vec_add")
        for _ in range(3):
            kernel.launch(n // 256, 256, [a, b, out, n])
        torch.cuda.synchronize()
        print("done")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    found = run_ncu([sys.executable, str(script)], env=env, kernel_regex="vec_add", timeout_s=240)
    assert list(found) == ["vec_add"]
    vec = found["vec_add"]
    assert vec["launches"] == 3
    assert 0 < vec["gpu_time_us"] < 10_000
    assert vec["dram_pct"] > 10 and vec["sm_pct"] is not None
    assert vec["achieved_occupancy_pct"] > 0 and vec["l2_hit_pct"] is not None
    assert len(vec["stalls"]) == 17, sorted(vec["stalls"])  # every requested stall metric was accepted
    assert len(vec["top_stalls"]) == 3
