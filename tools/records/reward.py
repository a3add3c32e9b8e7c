"""kloop's reward for RL, in one place: the formula, its components, the scalar.

Every reward kloop gives comes from here: `kloop export --format rl|verl` (a logged attempt), agent/reward.py (a
trainer's completion judged now) and `kloop serve` (its answers).

    >>> scalar_reward(reward_components(result))      # result: an EvalResult, or a logged attempt (store row)
"""
from __future__ import annotations

import math

from tools.result import EvalResult

REWARD_FORMULA = ("reward = 0 if no kernel ran to a result (format_error, rejected, compile_error); "
                  "0.1 if it ran but failed (incorrect, runtime_error, timeout); "
                  "1 + 0.5 * clip(log2(speedup_eager), -1, 3) if correct (1.0 when untimed, e.g. CPU interpreter), "
                  "so a verified kernel earns 0.5 to 2.5 and always more than any failure")
RAN = ("correct", "incorrect", "runtime_error", "timeout")   # the verdicts of a kernel that ran to a result


def reward_components(judged: EvalResult | dict) -> dict:
    """What the reward is built from, out of an evaluation's result or a logged attempt (the store's columns of the
    same result: tools.records.store.attempt_columns). A format_error turn (no candidate) compiled nothing and is
    zero-reward."""
    if isinstance(judged, EvalResult):
        judged = {"verdict": judged.verdict, "speedup_eager": judged.speedup_over("eager"),
                  "speedup_compile": judged.speedup_over("compile"), "sol_fraction": judged.sol_fraction}
    verdict = judged.get("verdict")
    return {"verdict": verdict, "compiled": verdict in RAN, "correct": verdict == "correct",
            **{k: None if judged.get(k) is None else float(judged[k])
               for k in ("speedup_eager", "speedup_compile", "sol_fraction")}}


def scalar_reward(components: dict) -> float:
    """REWARD_FORMULA, from reward_components()."""
    if components.get("correct"):
        speedup = components.get("speedup_eager")
        if not speedup or speedup <= 0:
            return 1.0
        return 1.0 + 0.5 * min(max(math.log2(speedup), -1.0), 3.0)
    return 0.1 if components.get("compiled") else 0.0
