"""The profile stage: the reference's roofline counts, the timing (re-measured when too good to believe), the pairing
against the standing best, Nsight Compute's counters.
"""
from __future__ import annotations

import json
import os
import sys

from sandbox.stages.base import NO_GPU_NOTE
from sandbox.stages.timing import TimingStage
from tools import profile
from tools.result import Counters, EvalResult, Roofline, Timing


class Profiling(TimingStage):
    def profile(self) -> EvalResult:
        if self.result.verdict != "correct":
            return self.result
        with self._stage("profile"):
            self._profile()
        return self.result

    def _profile(self) -> None:
        counts = self._ref(600, "roofline_counts", shape=self.shape_keys[0],
                           seed=self._seed("roofline"))
        if counts.get("status") != "ok":
            return self._finish("runtime_error", f"the reference failed: {counts.get('message')}")
        if not self.session.cuda:
            self.result.timing_note = NO_GPU_NOTE
            self.result.roofline = Roofline(bytes=counts["bytes"], flops=counts["flops"])
            return
        timings = self._time(self._seed("time"))
        if timings is None:
            return
        gpu = self.result.gpu
        roof = Roofline(**profile.roofline(counts["bytes"], counts["flops"], gpu, timings["candidate"].median,
                                           _dtype_key(counts["dtype"])))
        speedup = _speedups(timings)
        suspicious = (speedup and max(speedup.values()) > self.settings.max_speedup) or \
            (roof.sol_us and timings["candidate"].median < roof.sol_us)
        if suspicious:  # measure again before believing it, and say so either way
            again = self._time(self._seed("time", "again"))
            if again is None:
                return
            timings, speedup = again, _speedups(again)
            roof = Roofline(**profile.roofline(counts["bytes"], counts["flops"], gpu, timings["candidate"].median,
                                               _dtype_key(counts["dtype"])))
            if speedup and max(speedup.values()) > self.settings.max_speedup:
                self.result.flags.append(f"speedup_over_{self.settings.max_speedup:g}x_remeasured")
            if roof.sol_us and timings["candidate"].median < roof.sol_us:
                self.result.flags.append("below_speed_of_light_remeasured")
        self.result.time_us = timings.pop("candidate")
        self.result.baselines = timings or None
        self.result.speedup = None if self.result.degenerate else speedup   # nothing to be faster at
        self.result.roofline = roof
        with self.session.hold_best() as best:
            if best is not None and best.target_sha256 == self.target.sha256 and \
                    self.result.time_us.median < best.median_us:
                self._versus_best(best)
        if self.settings.ncu:
            self.result.ncu = self._ncu()

    def _ncu(self) -> dict[str, Counters] | None:
        spec = {"plan_dir": str(self.plans_dir / "0"), "target_source": self.target.source,
                "overrides": self.shapes[0], "seed": self._seed("ncu"), "calls": 3}
        spec_path = self.plans_dir / "ncu-spec.json"
        spec_path.write_text(json.dumps(spec))
        names = [r.kernel for r in self.result.resources]
        env = None if self.device.visible is None else {**os.environ, "CUDA_VISIBLE_DEVICES": self.device.visible}
        try:
            with self.device.quiet():
                found = profile.run_ncu([sys.executable, "-m", "sandbox.executor", "--profile", str(spec_path)],
                                        env=env, kernel_regex="|".join(names) or None, timeout_s=300)
        except Exception as e:  # counters are optional: their absence is reported, never fatal
            self.result.flags.append(f"ncu_failed: {str(e)[:200]}")
            return None
        return {name: Counters(**{k: v for k, v in c.items() if k in Counters.__dataclass_fields__})
                for name, c in found.items()}


def _speedups(timings: dict[str, Timing]) -> dict[str, float] | None:
    cand = timings["candidate"].median
    out = {name: timings[name].median / cand for name in ("eager", "compile") if name in timings and cand}
    return out or None


def _dtype_key(name: str) -> str | None:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(name)
