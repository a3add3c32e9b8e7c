"""kloop's reward for RL: a model's completion turned back into a kloop verdict by the evaluator, then a scalar.

The scalar is tools.export.scalar_reward (formula in tools.export.REWARD_FORMULA, the same one `kloop export --format
rl|verl` writes): 0 without a kernel that ran (format_error, rejected, compile_error), 0.1 for one that ran and failed
(incorrect, runtime_error, timeout), 1 + 0.5 * clip(log2(speedup over eager), -1, 3) for a verified one (1.0 untimed).
Without a GPU the evaluator runs the candidate in the Triton CPU interpreter at CPU sizes (seconds per completion,
untimed), so the reward is correctness-only there.

    >>> from agent.reward import score
    >>> score(completion_text, reference_source).reward                       # one completion
    >>> trainer = GRPOTrainer(..., reward_funcs=[trl_reward])                   # TRL: dataset column reference_source
    >>> # verl: custom_reward_function.path=agent/reward.py, name=compute_score (ground_truth = reference source)
"""
from __future__ import annotations

import atexit
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.prompting import candidate_from_submission, candidate_from_text
from tools.export import scalar_reward
from tools.result import EvalResult


@dataclass
class Reward:
    reward: float
    verdict: str                    # one of kloop's verdicts, or format_error (no candidate in the completion)
    reasons: list[str] = field(default_factory=list)
    components: dict = field(default_factory=dict)
    result: EvalResult | None = None


def candidate_of(completion: Any):
    """(Candidate, "") from a completion as trainers hand it over: plain text (a fenced ```python block), an
    assistant message, or a list of messages (TRL conversational; the last assistant turn counts), where a
    submit_candidate tool call wins over text. (None, reason) when it holds no candidate."""
    if isinstance(completion, list):
        assistants = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        if not assistants:
            return None, "the completion has no assistant message"
        completion = assistants[-1]
    if isinstance(completion, dict):
        for call in completion.get("tool_calls") or []:
            function = call.get("function") or {}
            if function.get("name") == "submit_candidate":
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError:
                        return None, "submit_candidate arguments are not JSON"
                return candidate_from_submission(arguments)
        completion = completion.get("content") or ""
    return candidate_from_text(completion if isinstance(completion, str) else "")


def score(completion: Any, reference_source: str, *, language: str | None = None, session=None,
          settings=None) -> Reward:
    """Judge one completion against a KernelBench-style reference with kloop's evaluator; never raises for a bad
    completion (that is a zero reward with its verdict and reason)."""
    from sandbox.evaluate import EvalSettings, evaluate

    candidate, reason = candidate_of(completion)
    if candidate is None:
        return Reward(0.0, "format_error", [reason], {"verdict": "format_error", "compiled": False, "correct": False})
    if language and candidate.language != language:
        return Reward(0.0, "format_error", [f"this prompt asks for {language}, got {candidate.language}"],
                      {"verdict": "format_error", "compiled": False, "correct": False})
    result = evaluate(_target(reference_source), candidate.source, settings or EvalSettings(baselines=("eager",)),
                      session or _session())
    components = reward_components(result)
    return Reward(scalar_reward(components), result.verdict or "runtime_error", list(result.reasons), components, result)


def reward_components(result: EvalResult) -> dict:
    """The reward's inputs from one evaluation (scalar_reward turns them into the reward); `kloop serve` answers
    with the same ones."""
    return {"verdict": result.verdict,
            "compiled": result.verdict in ("correct", "incorrect", "runtime_error", "timeout"),
            "correct": result.verdict == "correct", "speedup_eager": (result.speedup or {}).get("eager"),
            "speedup_compile": (result.speedup or {}).get("compile"),
            "sol_fraction": result.roofline.sol_fraction if result.roofline else None}


def trl_reward(prompts=None, completions=None, reference_source=None, **kwargs) -> list[float]:
    """TRL reward function (GRPOTrainer reward_funcs): the dataset's `reference_source` column comes in as a list."""
    sources = reference_source if isinstance(reference_source, list) else [reference_source] * len(completions)
    return [score(c, s).reward for c, s in zip(completions, sources)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl custom reward function: ground_truth is the reference source (as `kloop export --format verl` writes)."""
    language = (extra_info or {}).get("language") if isinstance(extra_info, dict) else None
    return score(solution_str, ground_truth, language=None if language in (None, "", "auto") else language).reward


_targets: dict[str, Any] = {}
_lock = threading.Lock()
_shared = None


def _target(source: str):
    from tools.target import Target, TargetError, module_from_source

    key = hashlib.sha256(source.encode()).hexdigest()
    if key not in _targets:
        try:
            module = module_from_source(source, {}, f"kloop_reward_{key[:12]}")
        except Exception as e:
            raise TargetError(f"reference failed to import: {type(e).__name__}: {e}") from None
        _targets[key] = Target(name=f"reward_{key[:8]}", path=Path("<reward>"), source=source, module=module,
                               builtin=False)
    return _targets[key]


def _session():
    """One evaluator session for every reward call of this process (warm workers), closed at exit."""
    global _shared
    with _lock:
        if _shared is None:
            from sandbox.evaluate import Session
            _shared = Session(spares=1)
            atexit.register(_shared.close)
        return _shared
