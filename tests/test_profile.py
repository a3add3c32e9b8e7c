"""Measuring without a GPU: statistics, roofline, NVML decoding, ncu CSV and command, byte/FLOP counts, the timed
call's steps."""
import dataclasses
import os
import re
import time
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from tools import profile, timing
from tools.profile import (NcuError, count_bytes_and_flops, decode_clock_event_reasons, gpu_info, ncu_command,
                           nvml_snapshot, parse_ncu_csv, peak_tflops_for, roofline, run_ncu, summarize,
                           throttle_reasons)
from tools.result import Counters

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TORCH_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
             "std::array<char *, 3>>(int, T2, T3)")

# What `ncu --csv --page raw --print-units base --log-file F` writes: banner lines, a header row, a units row,
# then one row per profiled launch (columns sorted by metric name).
NCU_CSV = "\n".join([
    '==PROF== Connected to process 4242 (/usr/bin/python3.12)',
    '==PROF== Profiling "vec_add" - 0: 0%....50%....100% - 9 passes',
    '==PROF== Profiling "vec_add" - 1: 0%....50%....100% - 9 passes',
    '==PROF== Profiling "vectorized_elementwise_kernel" - 2: 0%....50%....100% - 9 passes',
    ",".join(f'"{c}"' for c in [
        "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
        "Grid Size", "Device", "CC", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum",
        "lts__t_sector_hit_rate.pct", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active", STALL.format("barrier"),
        STALL.format("long_scoreboard"), STALL.format("mio_throttle"), STALL.format("not_selected"),
        STALL.format("wait")]),
    '"","","","","","","","","","","","%","nsecond","%","%","%","","","","",""',
    '"0","4242","python3.12","127.0.0.1","vec_add","1","7","(256, 1, 1)","(16384, 1, 1)","0","9.0",'
    '"88.40","12,400","0.50","21.30","83.00","0","14.20","0.30","0.05","1.10"',
    '"1","4242","python3.12","127.0.0.1","vec_add","1","7","(256, 1, 1)","(16384, 1, 1)","0","9.0",'
    '"87.60","12,600","0.70","21.10","84.00","0","13.80","0.50","0.07","0.90"',
    f'"2","4242","python3.12","127.0.0.1","{TORCH_ADD}","1","7","(128, 1, 1)","(8192, 1, 1)","0","9.0",'
    '"79.00","15,000","n/a","18.00","70.00","0","9.00","2.00","0.10","3.00"',
    "==PROF== Disconnected from process 4242",
])


def test_summarize_known_samples():
    stats = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats["median"] == pytest.approx(3000.0)
    assert (stats["q1"], stats["q3"], stats["iqr"]) == pytest.approx((2000.0, 4000.0, 2000.0))
    assert (stats["min"], stats["max"], stats["n"], stats["mean"]) == pytest.approx((1000.0, 5000.0, 5, 3000.0))
    assert stats["cv"] == pytest.approx(1581.1388 / 3000.0, rel=1e-6)


def test_summarize_single_sample_and_empty():
    stats = summarize([0.01])
    assert stats["median"] == stats["q1"] == stats["q3"] == pytest.approx(10.0)
    assert stats["iqr"] == 0 and stats["cv"] == 0
    with pytest.raises(ValueError):
        summarize([])


H200 = {"peak_gbps": 4800.0, "peak_tflops_bf16": 989.0, "peak_tflops_fp32": 67.0}


def test_roofline_memory_bound():
    # 1 GB at 4.8 TB/s = 208.33 us; 1e9 flop at 67 TFLOP/s = 14.9 us
    result = roofline(10**9, 10**9, H200, time_us=416.67, dtype=torch.float32)
    assert result["bound"] == "memory"
    assert result["sol_us"] == pytest.approx(208.333, rel=1e-4)
    assert result["sol_fraction"] == pytest.approx(0.5, rel=1e-3)
    assert result["peak_tflops"] == 67.0 and result["peak_gbps"] == 4800.0


def test_roofline_compute_bound_and_without_time():
    m = n = k = 8192
    result = roofline(3 * m * n * 2, 2 * m * n * k, H200, time_us=None, dtype=torch.bfloat16)
    assert result["bound"] == "compute"
    assert result["sol_us"] == pytest.approx(2 * m * n * k / 989e6)
    assert result["sol_fraction"] is None


def test_roofline_without_gpu_peaks_and_bad_dtype():
    result = roofline(1000, 0, None, 5.0, "fp32")
    assert result["sol_us"] is None and result["bound"] is None and result["sol_fraction"] is None
    assert result["bytes"] == 1000
    integer = roofline(4_800_000, 10**12, H200, 2.0, torch.int64)  # no FLOP peak for integers: memory alone
    assert integer["peak_tflops"] is None and integer["bound"] == "memory"
    assert integer["sol_us"] == pytest.approx(1.0) and integer["sol_fraction"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown dtype key"):
        roofline(1, 1, H200, 1.0, "fp8")


def test_fp32_speed_of_light_counts_3xtf32_on_tensor_cores():
    # KernelBench level 2's 53 on an H200: a 2048 x 8192 x 8192 fp32 GEMM in 3xTF32 took 3539 us, 116% of the FMA
    # peak's 4103 us; a third of the TF32 peak (164.7 TFLOP/s) bounds it at 1669 us
    gpu = {**H200, "peak_tflops_tf32": 494.0}
    flops = 2 * 2048 * 8192 * 8192
    result = roofline(4 * (2048 * 8192 * 2 + 8192 * 8192), flops, gpu, time_us=3539.0, dtype=torch.float32)
    assert result["bound"] == "compute" and result["peak_tflops"] == pytest.approx(494.0 / 3)
    assert result["sol_us"] == pytest.approx(flops / (494e6 / 3))
    assert result["sol_fraction"] == pytest.approx(0.4716, rel=1e-3)
    assert roofline(0, flops, gpu, 1.0, torch.bfloat16)["peak_tflops"] == 989.0   # other dtypes: their own peak


def test_peak_table_prefers_the_specific_name():
    assert peak_tflops_for("NVIDIA H100 80GB HBM3")["bf16"] == 989.0
    assert peak_tflops_for("NVIDIA H100 PCIe")["bf16"] == 756.0
    assert peak_tflops_for("NVIDIA H200")["tf32"] == 494.0
    assert peak_tflops_for("NVIDIA GeForce RTX 4090") == {"bf16": None, "fp16": None, "tf32": None, "fp32": None}


def test_clock_event_reasons_decode_and_throttle_filter():
    assert decode_clock_event_reasons(0x1 | 0x4 | 0x40) == ["GpuIdle", "SwPowerCap", "HwThermal"]
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x800) == ["0x800"]
    before = {"clock_event_reasons": ["GpuIdle"]}
    after = {"clock_event_reasons": ["SwThermal", "SwPowerCap", "SyncBoost"]}
    assert throttle_reasons(before, after) == ["SwPowerCap", "SwThermal"]
    assert throttle_reasons(None, {"clock_event_reasons": None}) == []


def test_parse_ncu_csv_averages_launches_per_kernel():
    parsed = parse_ncu_csv(NCU_CSV)
    assert set(parsed) == {"vec_add", TORCH_ADD}
    vec = parsed["vec_add"]
    assert vec["launches"] == 2
    assert vec["gpu_time_us"] == pytest.approx(12.5)          # 12,400 and 12,600 ns
    assert vec["dram_pct"] == pytest.approx(88.0)
    assert vec["sm_pct"] == pytest.approx(21.2)
    assert vec["achieved_occupancy_pct"] == pytest.approx(83.5)
    assert vec["l2_hit_pct"] == pytest.approx(0.6)
    assert [reason for reason, _ in vec["top_stalls"]] == ["long_scoreboard", "wait", "mio_throttle"]
    assert vec["top_stalls"][0][1] == pytest.approx(14.0)
    assert vec["stalls"]["barrier"] == 0
    torch_add = parsed[TORCH_ADD]
    assert torch_add["l2_hit_pct"] is None                    # "n/a" in its only launch
    assert torch_add["gpu_time_us"] == pytest.approx(15.0)


def test_parsed_counters_are_exactly_the_counters_record():
    """The evaluator keeps of parse_ncu_csv's keys those that are Counters fields, and the prompts and the diagnosis
    read Counters: a key renamed on one side only would vanish on the way (as `achieved_occupancy` once did)."""
    assert set(parse_ncu_csv(NCU_CSV)["vec_add"]) == {f.name for f in dataclasses.fields(Counters)}


def test_parse_ncu_csv_converts_time_units_and_handles_no_kernels():
    scaled = NCU_CSV.replace('"%","nsecond"', '"%","usecond"').replace('"12,400"', '"12.4"').replace(
        '"12,600"', '"12.6"')
    assert parse_ncu_csv(scaled)["vec_add"]["gpu_time_us"] == pytest.approx(12.5)
    assert parse_ncu_csv("==PROF== Disconnected\n==WARNING== No kernels were profiled.\n") == {}


def test_ncu_command_never_touches_clocks():
    command = ncu_command(["python", "bench.py"], "/tmp/out.csv", kernel_regex="vec_add", launch_count=3)
    assert command[:3] == ["ncu", "--clock-control", "none"]
    assert command[-2:] == ["python", "bench.py"]
    metrics = command[command.index("--metrics") + 1].split(",")
    assert "gpu__time_duration.sum" in metrics and STALL.format("long_scoreboard") in metrics
    assert command[command.index("--kernel-name") + 1] == "regex:vec_add"
    assert command[command.index("--log-file") + 1] == "/tmp/out.csv"
    assert command[command.index("--launch-count") + 1] == "3"
    assert "--kernel-name" not in ncu_command(["x"], "/tmp/o.csv", None)


# Stands in for Nsight Compute on machines without it: writes $FAKE_NCU_CSV to the --log-file path, or fails, or hangs.
FAKE_NCU = """#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = "--log-file" ]; then log="$2"; fi
  shift
done
case "$FAKE_NCU_MODE" in
  ok) cp "$FAKE_NCU_CSV" "$log" ;;
  denied) echo "==ERROR== ERR_NVGPUCTRPERM - no permission to access NVIDIA GPU Performance Counters" > "$log"
          exit 1 ;;
  hang) sleep 60 ;;
esac
"""


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    (tmp_path / "ncu").write_text(FAKE_NCU)
    (tmp_path / "ncu").chmod(0o755)
    (tmp_path / "report.csv").write_text(NCU_CSV)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return lambda mode: dict(os.environ, FAKE_NCU_MODE=mode, FAKE_NCU_CSV=str(tmp_path / "report.csv"))


def test_run_ncu_parses_what_ncu_logged(fake_ncu):
    found = run_ncu(["python", "bench.py"], env=fake_ncu("ok"), kernel_regex="vec_add")
    assert found["vec_add"]["launches"] == 2


def test_run_ncu_reports_ncu_errors(fake_ncu):
    with pytest.raises(NcuError, match="ERR_NVGPUCTRPERM"):
        run_ncu(["python", "bench.py"], env=fake_ncu("denied"))


def test_run_ncu_kills_a_hung_profile(fake_ncu):
    started = time.monotonic()
    with pytest.raises(NcuError, match="timed out after 1 s"):
        run_ncu(["python", "bench.py"], env=fake_ncu("hang"), timeout_s=1)
    assert time.monotonic() - started < 10


def test_run_ncu_without_ncu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    with pytest.raises(NcuError, match="ncu .* not found"):
        run_ncu(["python", "-c", "pass"])


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class AddSelf(torch.nn.Module):
    def forward(self, x):
        return x + x


class Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def test_count_bytes_and_flops_matmul():
    m, k, n = 64, 32, 48
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = MatMul()(a, b)
    moved, flops = count_bytes_and_flops(MatMul(), [a, b], out)
    assert flops == 2 * m * n * k
    assert moved == (m * k + k * n + m * n) * 4


def test_count_bytes_counts_a_repeated_input_once_and_weights():
    x = torch.randn(1000)
    assert count_bytes_and_flops(AddSelf(), [x], AddSelf()(x)) == (2 * 1000 * 4, 0)
    assert count_bytes_and_flops(Add(), [x, x], Add()(x, x)) == (2 * 1000 * 4, 0)
    twice, _ = count_bytes_and_flops(MatMul(), [x.view(10, 100), x.view(100, 10)], torch.empty(10, 10))
    assert twice == (1000 + 100) * 4                          # two views of one storage read once
    linear = torch.nn.Linear(16, 8)
    moved, flops = count_bytes_and_flops(linear, [torch.randn(4, 16)], torch.empty(4, 8))
    assert moved == (4 * 16 + 16 * 8 + 8 + 4 * 8) * 4
    assert flops == 2 * 4 * 16 * 8


class MatMulOfPositives(torch.nn.Module):
    """A matmul after a boolean mask: its shape depends on the data, which fake tensors cannot know."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def forward(self, a, b):
        self.seen.append(isinstance(a, FakeTensor))
        return a[a[:, 0] > 0] @ b


def test_count_flops_runs_the_forward_on_fake_tensors_where_shapes_allow():
    """At full size a real extra forward costs an output's worth of GPU memory; fake tensors cost none."""
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    linear = torch.nn.Linear(32, 8)
    weight = linear.weight.detach().clone()
    seen = []
    linear.register_forward_pre_hook(lambda module, args: seen.append(isinstance(args[0], FakeTensor)))
    assert count_bytes_and_flops(linear, [a], linear(a))[1] == 2 * 64 * 32 * 8
    assert seen == [False, True] and torch.equal(linear.weight, weight)   # our call real, the count's fake
    masked = MatMulOfPositives()
    rows = int((a[:, 0] > 0).sum())
    assert count_bytes_and_flops(masked, [a, b], torch.empty(rows, 48))[1] == 2 * rows * 32 * 48
    assert masked.seen == [True, False]                                    # fake first, then for real


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answers")
def test_no_gpu_answers_none():
    assert gpu_info() is None
    assert nvml_snapshot() is None


class _FakeCuda:
    """Stands in for torch.cuda's calls that timed_call makes, writing down each step."""

    def __init__(self, monkeypatch, elapsed_ms: float) -> None:
        self.steps = []
        fake = self

        class Event:
            def __init__(self, enable_timing: bool) -> None:
                assert enable_timing

            def record(self) -> None:
                fake.steps.append("record")

            def elapsed_time(self, end) -> float:
                return elapsed_ms

        class Flush:
            def numel(self) -> int:
                return 1

            def zero_(self) -> None:
                fake.steps.append("flush")

        self.flush = Flush()
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: self.steps.append("synchronize"))
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: self.steps.append(f"spin {cycles}"))
        monkeypatch.setattr(timing, "reset_persisting_l2", lambda: self.steps.append("reset persisting L2"))


def test_timed_call_resets_flushes_spins_then_times_between_events(monkeypatch):
    cuda = _FakeCuda(monkeypatch, elapsed_ms=0.25)
    out, ms, wall_ms = timing.timed_call(lambda: cuda.steps.append("call") or "output", cuda.flush)
    assert (out, ms) == ("output", 0.25) and wall_ms >= 0
    assert cuda.steps == ["reset persisting L2", "flush", "synchronize", "spin 1000000", "record", "call", "record",
                          "synchronize"]


def test_timed_call_without_a_flush_keeps_the_l2_as_it_is(monkeypatch):
    # the executor's untimed replays: timed for the pruning rule, behind whatever the L2 holds
    cuda = _FakeCuda(monkeypatch, elapsed_ms=1.5)
    assert timing.timed_call(lambda: cuda.steps.append("call"), None)[1] == 1.5
    assert cuda.steps == ["synchronize", "spin 1000000", "record", "call", "record", "synchronize"]


def test_only_tools_timing_times_a_gpu_call():
    # the candidate and its baselines are timed by the same code: nothing else in the product spins, makes timing
    # events, or resets the persisting L2
    repo = Path(__file__).resolve().parents[1]
    timing_steps = re.compile(r"_sleep\(|Event\(enable_timing|ResetPersistingL2|LAUNCH_COVER_CYCLES =")
    found = [f"{path.relative_to(repo)}:{number}" for package in ("agent", "sandbox", "tools")
             for path in sorted((repo / package).rglob("*.py")) if path != repo / "tools" / "timing.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if timing_steps.search(line)]
    assert not found, "timed outside tools/timing.py: " + ", ".join(found)
