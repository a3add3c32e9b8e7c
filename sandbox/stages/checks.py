"""The verify stage: each plan replayed on fresh inputs (the target's own, then every input family, the weights trial,
the hidden variants), compared in the referee; a candidate far slower than the standing best pruned.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

from sandbox.stages.base import Stage
from tools.inputs import FAMILIES, OWN
from tools.result import Correctness, EvalResult

# Bytes every plan allocation is filled with before a trial, by trial: NaN bits in every float format, then zeros. A
# kernel that leaves unwritten the elements whose answer is the fill (True in a bool output, 0.0 after a ReLU) fails
# one of the two.
TRIAL_POISONS = (0xFF, 0x00)
PRUNE_TRIALS = 2   # main-shape trials timed before pruning (the faster counts: a first call may load lazily)
# A family's trial passed only as a chaotic op's peer (tools/verify.py: the reference itself left the truth's
# trajectory, so the counts were waived) is drawn again, this many times at most, until one judges the counts: a
# kernel wrong in a few places cannot pass a family on the draws where nothing could judge it.
CHAOTIC_REDRAWS = 3


class Checks(Stage):
    _last_check: dict   # the referee's reply to the last comparison (or why its family was skipped)
    _last_run: dict     # the executor's reply to the last trial's replay (its time, for pruning)

    def verify(self) -> EvalResult:
        if self.result.verdict is not None:
            return self.result
        with self._stage("verify"):
            self._verify()
        return self.result

    def _verify(self) -> None:
        """Trials on fresh inputs: at the main shape `trials` in the target's own distribution (alternating
        poisons), then one per input family (tools/inputs.py) in an order drawn from the seed; `variant_trials` per
        hidden variant. A family whose reference fails or is nowhere finite is skipped; one whose trial passed only as
        a chaotic op's peer is drawn again (CHAOTIC_REDRAWS). The reference's outputs must
        differ between the main shape's trials, else the target is degenerate: a kernel writing them without reading
        its inputs would pass (flagged, no speedup)."""
        stats = Correctness(shapes=len(self.shapes))
        trial_us: list[float] = []   # the main shape's first trials, for pruning
        fingerprints = []
        for i in range(len(self.shapes)):
            own = self.settings.trials if i == 0 else self.settings.variant_trials
            families = [OWN] * own + (self._families() if i == 0 else [])
            redrawn: dict[str, int] = {}
            trial = -1
            while trial + 1 < len(families):
                trial += 1
                family = families[trial]
                seed = self._seed("trial", i, trial)
                reasons = self._replay_and_check(i, seed, stats if i == 0 else None, timed=False, family=family,
                                                 poison=TRIAL_POISONS[trial % len(TRIAL_POISONS)])
                if reasons is None:
                    return
                if self._last_check.get("skipped"):
                    stats.skipped.append(f"{family}: {self._last_check['skipped'][:200]}")
                    continue
                stats.trials += 1
                if reasons:
                    if i == 0:
                        self.result.correctness = stats
                    where = f"trial {trial + 1}" + ("" if family == OWN else f" ({family} inputs)")
                    return self._finish("incorrect", *self._hidden(
                        self._variant(i), "incorrect", *[f"{self._shape_name(i)}, {where}: {r}" for r in reasons]))
                if (self._last_check.get("stats") or {}).get("chaotic") and redrawn.get(family, 0) < CHAOTIC_REDRAWS:
                    redrawn[family] = redrawn.get(family, 0) + 1
                    families.insert(trial + 1, family)
                    if i == 0:   # nothing about a hidden variant's inputs reaches a policy
                        self.result.flags.append(f"chaotic: the main shape's {family} inputs drawn again "
                                                 f"({redrawn[family]})")
                if i == 0:
                    if family != OWN and family not in stats.families:
                        stats.families.append(family)
                    fingerprints.append(self._last_check.get("fingerprint"))
                    if trial < PRUNE_TRIALS:
                        trial_us.append((self._last_run.get("ms") or 0.0) * 1e3)
                        if len(trial_us) == PRUNE_TRIALS and self._pruned(min(trial_us), stats):
                            return
        self.result.correctness = stats
        self.result.verdict = "correct"
        if len(fingerprints) > 1 and all(f == fingerprints[0] for f in fingerprints):
            self.result.degenerate = ("the reference's output is the same on every input family tried: a kernel "
                                      "writing it without reading its inputs would pass")
            self.result.flags.append("degenerate_target")

    def _families(self) -> list[str]:
        """The input families the main shape is tried on, in an order drawn from this candidate's seed."""
        families = list(FAMILIES)
        random.Random(self._seed("families")).shuffle(families)
        return families

    def _pruned(self, trial_us: float, stats: Correctness) -> bool:
        """Stop here (verdict timeout) when the candidate's faster of its first main-shape trials took more than
        prune_slower_than times the standing best's median: it cannot become the best, and its hidden variants and
        timing would cost the search most of an evaluation. The trials' times are taken by the trusted executor, with
        a warm L2 (faster, if anything, than the best's timed calls)."""
        factor = self.settings.prune_slower_than
        if not (self.session.cuda and factor and trial_us):
            return False
        with self.session.hold_best() as best:
            if best is None or best.target_sha256 != self.target.sha256 or trial_us <= factor * best.median_us:
                return False
            self.result.correctness = stats
            self._finish("timeout", f"pruned: its first {PRUNE_TRIALS} main-shape calls took {trial_us:.4g} us or "
                         f"more, over {factor:g}x the standing best's {best.median_us:.4g} us; not verified further")
        return True

    def _replay_and_check(self, i: int, seed: int, stats: Correctness | None, timed: bool,
                          key: str | None = None, family: str = OWN,
                          poison: int = TRIAL_POISONS[0]) -> list[str] | None:
        """Fresh inputs in `family` (tools/inputs.py, the same on both sides), one replay, one comparison. None when
        the replay itself failed (the verdict is set). poison: the byte the plan's allocations are filled with
        first."""
        key = key or self.keys[i]
        timeout = self._round_timeout(i, seed, family)
        if timeout is None:
            return None
        directory = self._output_dir()
        reply = self._call(self.executor, timeout, "round", key=key, seed=seed, family=family, timed=timed,
                           dir=str(directory) if directory else None, poison=poison)
        if not self._ok(reply, hidden=self._variant(i), stage="profile" if timed else "") or self._overran(reply, i):
            return None
        self._last_run = reply
        return self._check(i, seed, key, stats, family, shared=reply)

    def _output_dir(self) -> Path | None:
        """Without a GPU, where the jailed executor writes its outputs (emptied first); None on a GPU (CUDA IPC)."""
        if self.session.cuda:
            return None
        directory = self.executor.workdir / "out"
        shutil.rmtree(directory, ignore_errors=True)
        return directory

    def _check(self, i: int, seed: int, key: str, stats: Correctness | None, family: str = OWN,
               shared: dict | None = None) -> list[str] | None:
        """Compare what the executor holds for `key` (described in `shared`, else asked for) with the reference.
        stats: where the main shape's error statistics go (None for a hidden variant: nothing numeric about one may
        reach a policy)."""
        directory = None if self.session.cuda else self.executor.workdir / "out"
        if shared is None:
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
            shared = self._call(self.executor, 600, "share", key=key, dir=str(directory) if directory else None)
            if not self._ok(shared, hidden=self._variant(i)):
                return None
        if directory is not None and (directory.is_symlink() or not directory.is_dir()):
            self._finish("runtime_error", "the executor's output directory is not a directory")
            return None
        outputs = shared.get("outputs") or []
        if directory is not None:  # files: their sizes come from the plan the executor ran, checked on read
            metas = self.output_meta[i]
            if len(outputs) != len(metas):
                return [f"the executor returned {len(outputs)} outputs, the plan has {len(metas)}"]
            outputs = [dict(m, file=name) for m, name in zip(metas, outputs)]
        inputs = [None if name is None else ({"file": name} if directory is not None else name)
                  for name in shared.get("inputs") or []]
        reply = self._ref(600, "check", shape=self.shape_keys[i], seed=seed, outputs=outputs, inputs=inputs,
                          directory=str(directory) if directory else None, family=family)
        self._last_check = reply
        if reply.get("status") != "ok" and family != OWN and reply.get("fatal"):
            # the reference took its process down on inputs outside its domain: no answer there, as when it raises
            self._last_check = {"skipped": f"the reference ended its process on {family} inputs: "
                                           f"{reply.get('message')}"}
            return []
        if reply.get("status") != "ok":
            self._finish("runtime_error", f"the reference failed: {reply.get('message')}")
            return None
        found = reply.get("stats") or {}
        if stats is not None:
            stats.norm_err = max(stats.norm_err, found.get("norm_err") or 0.0)
        if stats is not None and family == OWN:   # other families' element errors follow their own scales
            stats.max_abs_err = max(stats.max_abs_err, found.get("max_abs_err") or 0.0)
            stats.max_rel_err = max(stats.max_rel_err, found.get("max_rel_err") or 0.0)
            if found.get("worst"):
                stats.worst = found["worst"]
        return list(reply.get("reasons") or [])
