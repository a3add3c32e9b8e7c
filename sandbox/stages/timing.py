"""The time stage: the candidate (executor) and its baselines (referee) in interleaved rounds, every timed output
checked; a would-be new best timed again against the standing best, paired round by round.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from typing import TYPE_CHECKING

from sandbox.stages.base import derive_seed
from sandbox.stages.checks import Checks
from tools import profile
from tools.inputs import OWN
from tools.result import Timing, VsBest

if TYPE_CHECKING:
    from sandbox.evaluate import BestKernel, Device


class TimingStage(Checks):
    """Timing checks every output it times: it builds on the verify stage's comparison."""

    def _time(self, seed: int) -> dict[str, Timing] | None:
        """Interleaved rounds: fresh inputs each round, the candidate (executor) and each baseline (referee) in a
        rotating order, every candidate output checked against the round's reference. None if it misbehaved."""
        with self.device.quiet():
            return self._rounds(seed)

    def _rounds(self, seed: int) -> dict[str, Timing] | None:
        names = ["candidate"] + list(self.settings.baselines)
        ratio_key = (self.shape_keys[0], self.settings.compile_mode)
        derive = self.settings.compile_baseline == "reuse" and "compile" in names and "eager" in names and \
            ratio_key in self.device.compile_to_eager
        if derive:
            names.remove("compile")
        samples: dict[str, list[float]] = {name: [] for name in names}
        wall: dict[str, float] = dict.fromkeys(names, 0.0)
        before = self.device.nvml_snapshot()
        rounds = self.settings.warmup_calls + self.settings.timed_calls
        for r in range(rounds):
            round_seed = derive_seed(seed, r)
            family = self._round_family(round_seed)
            shift = r % len(names)
            shared = None
            for name in names[shift:] + names[:shift]:
                if name == "candidate":
                    reasons_or_none = self._replay(round_seed, family)
                    if reasons_or_none is None:
                        return None
                    reply = shared = reasons_or_none
                else:
                    reply = self._ref(self.settings.baseline_timeout_s, "time", name=name,
                                      shape=self.shape_keys[0], seed=round_seed, mode=self.settings.compile_mode,
                                      family=family)
                    if reply.get("status") != "ok":
                        self.result.flags.append(f"baseline_{name}_failed: {str(reply.get('message'))[:200]}")
                        names.remove(name)
                        samples.pop(name)
                        continue
                if r >= self.settings.warmup_calls:
                    samples[name].append(reply["ms"])
                    wall[name] += reply["wall_ms"]
            reasons = self._check(0, round_seed, self.keys[0], None, family, shared=shared)
            if reasons is None:
                return None
            if reasons:  # a kernel must be right every time it is timed, not only when it was verified
                self._finish("incorrect", *[f"timed call {r + 1}: {reason}" for reason in reasons])
                return None
        after = self.device.nvml_snapshot()
        timings = {name: Timing(**profile.summarize(s), events_total_ms=sum(s), wall_total_ms=wall[name])
                   for name, s in samples.items() if s}
        if derive:
            ratio = self.device.compile_to_eager[ratio_key]
            timings["compile"] = Timing(median=timings["eager"].median * ratio, derived_from_eager=True,
                                        compile_to_eager=ratio)
        elif "compile" in timings and "eager" in timings:
            self.device.compile_to_eager[ratio_key] = timings["compile"].median / timings["eager"].median
        if "compile" in timings:
            timings["compile"].mode = self.settings.compile_mode
        throttled = profile.throttle_reasons(before, after) if before and after else []
        self.result.nvml = {"before": before, "after": after, "throttled": bool(throttled), "reasons": throttled}
        if throttled and "throttled" not in self.result.flags:
            self.result.flags.append("throttled")
        cand = timings["candidate"]
        if cand.events_total_ms > cand.wall_total_ms * 1.05:
            self.result.flags.append("events_exceed_wall_clock")
        return timings

    def _round_family(self, seed: int) -> str:
        """A timed round's input family: drawn from the target's own and those the main shape was judged on, so a
        kernel cannot tell a timed call from a checked one by its inputs (every timed output is checked too)."""
        judged = self.result.correctness.families if self.result.correctness else []
        return random.Random(seed).choice([OWN, *judged])

    def _replay(self, seed: int, family: str = OWN) -> dict | None:
        """One timed call of the candidate on fresh inputs (its outputs described for the check); None if it
        failed (the verdict is set)."""
        timeout = self._round_timeout(0, seed, family)
        if timeout is None:
            return None
        reply = self._call(self.executor, timeout, "round", key=self.keys[0], seed=seed, family=family, timed=True)
        if not self._ok(reply, hidden=None, stage="profile") or self._overran(reply, 0):
            return None
        return reply

    def _versus_best(self, best: BestKernel, key: str | None = None) -> None:
        """A would-be new best is timed again against the standing best, interleaved round by round, and counts
        as faster only when the 95% confidence interval of the time ratio lies above 1."""
        mine = key or self.keys[0]
        other = f"best{self.index}"
        reply = self._call(self.executor, self.settings.load_timeout_s, "load", key=other,
                           plan_dir=str(best.directory / "0"), shape=self.shape_keys[0])
        if reply.get("status") != "ok":
            self.result.flags.append(f"versus_best_failed: {str(reply.get('message'))[:200]}")
            return
        ratios = []
        began = time.perf_counter()
        try:
            with self.device.quiet():
                for r in range(self.settings.paired_calls):
                    seed = self._seed("paired", r)
                    family = self._round_family(seed)
                    reply = self._call(self.executor, 600, "inputs", shape=self.shape_keys[0], seed=seed,
                                       family=family)
                    if not self._ok(reply, hidden=None, stage="profile"):
                        return
                    times = {}
                    for which in ((mine, other) if r % 2 == 0 else (other, mine)):
                        reply = self._call(self.executor, self._run_timeout(), "run", key=which, timed=True)
                        if not self._ok(reply, hidden=None, stage="profile") or \
                                (which == mine and self._overran(reply, 0)):
                            return
                        times[which] = reply["ms"]
                    reasons = self._check(0, seed, mine, None, family)
                    if reasons is None:
                        return
                    if reasons:
                        return self._finish("incorrect", *[f"paired timing {r + 1}: {x}" for x in reasons])
                    ratios.append(times[other] / times[mine])
        finally:
            if self.executor.alive():
                self._call(self.executor, 60, "unload", key=other)
            self._waited("paired", began)
        self.result.vs_best = paired_ratio(ratios, best.attempt)

    def versus_standing_best(self, device: Device) -> None:
        """The paired re-measurement again, against the session's best as it stands now (it changed since this
        candidate was profiled), on `device`: the challenger's main plan is loaded there once more."""
        with self.session.hold_best() as best:
            if best is None or best.target_sha256 != self.target.sha256 or self.plans_dir is None or \
                    not self.result.correct or not self.session.cuda:
                return
            self.bind(device)
            try:
                device.use_target(self.target)
                self.executor = device.executor()
                key = f"e{self.index}:again"
                self._referee_shape(0)
                reply = self._call(self.executor, 120, "shape", shape=self.shape_keys[0],
                                   target_source=self.target.source, overrides=self.shapes[0])
                if self._ok(reply, hidden=None):
                    reply = self._call(self.executor, self.settings.load_timeout_s, "load", key=key,
                                       plan_dir=str(self.plans_dir / "0"), shape=self.shape_keys[0])
                    if self._ok(reply, hidden=None, stage="profile"):
                        self.keys = [key]
                        self._versus_best(best, key)
            finally:
                self.release_device()


def paired_ratio(ratios: list[float], best_attempt: int | None) -> VsBest:
    """best time / candidate time per round; a 95% t-interval of the mean log-ratio, back on the ratio scale."""
    logs = [math.log(r) for r in ratios if r > 0]
    n = len(logs)
    mean = statistics.fmean(logs) if logs else 0.0
    half = _t975(n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    low, high = math.exp(mean - half), math.exp(mean + half)
    outcome = "faster" if low > 1.0 else "slower" if high < 1.0 else "tie"
    return VsBest(best_attempt=best_attempt, ratio=math.exp(mean), ci_low=low, ci_high=high, n=n, outcome=outcome)


def _t975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
             12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
    if df <= 0:
        return math.inf
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.960
