"""kloop's reward for RL: a model's completion turned back into a kloop verdict by the evaluator, then a scalar.

The reward is tools/records/reward.py's (REWARD_FORMULA, the same one `kloop export --format rl|verl` writes and
`kloop serve` answers with): 0 without a kernel that ran (format_error, rejected, compile_error), 0.1 for one that
ran and failed (incorrect, runtime_error, timeout), 1 + 0.5 * clip(log2(speedup over eager), -1, 3) for a verified
one (1.0 untimed). The completion may hold its submit_candidate call as structured tool_calls or as any chat
template's text for one (tool_calls_in_text), or a fenced ```python block. Every Reward says which device judged it
(`device`, and the "kloop.reward" log). Without a GPU the Triton CPU interpreter judges at CPU sizes, untimed: a
correctness check for tests and debugging, not a training reward (3-5 s for a 1,000-element add on 2 cores, minutes
for a softmax or a convolution, and not bit-faithful to a GPU's verdict).

    >>> from agent.reward import score
    >>> score(completion_text, reference_source).reward                       # one completion
    >>> trainer = GRPOTrainer(..., reward_funcs=[trl_reward])                   # TRL: dataset column reference_source
    >>> # verl: custom_reward_function.path=agent/reward.py, name=compute_score (ground_truth = reference source)
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.prompting import candidate_from_submission, candidate_from_text
from tools.records.reward import reward_components, scalar_reward
from tools.result import EvalResult
from tools.records.wire import SUBMIT, openai

log = logging.getLogger("kloop.reward")


@dataclass
class Reward:
    reward: float
    verdict: str                    # one of kloop's verdicts, or format_error (no candidate in the completion)
    reasons: list[str] = field(default_factory=list)
    components: dict = field(default_factory=dict)
    result: EvalResult | None = None
    device: str | None = None       # what judged it: "cuda: <GPU>" (timed), "cpu-interpreter" (correctness only),
                                    # None where nothing ran


def candidate_of(completion: Any):
    """(Candidate, "") from a completion as trainers hand it over: plain text, an assistant message, or a list of
    messages (TRL conversational; the last assistant turn counts). A submit_candidate call wins: a structured
    `tool_calls` entry, else one written in the text by a chat template (tool_calls_in_text); then the last fenced
    ```python block. (None, reason) when it holds no candidate."""
    if isinstance(completion, list):
        assistants = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        if not assistants:
            return None, "the completion has no assistant message"
        completion = assistants[-1]
    submissions = []   # (arguments, whether they are JSON text still to read)
    if isinstance(completion, dict):   # the conversation shape, which tools.records.wire reads as a chat message
        reply = openai.read_message(completion)
        submissions = [(c.input, not c.parsed and isinstance(c.input, str)) for c in reply.submissions]
        completion = reply.text
    text = completion if isinstance(completion, str) else ""
    submissions = submissions or [(c["arguments"], isinstance(c["arguments"], str))
                                  for c in tool_calls_in_text(text) if c["name"] == SUBMIT]
    if submissions:
        arguments, is_text = submissions[-1]
        if is_text:   # arguments as JSON text, read leniently (models write raw newlines in strings)
            try:
                arguments = _JSON.decode(arguments)
            except json.JSONDecodeError:
                return None, "submit_candidate arguments are not JSON"
        return candidate_from_submission(arguments)
    return candidate_from_text(text)


# Tool calls as chat templates write them into text: Qwen/Hermes `<tool_call>{"name", "arguments"}</tool_call>`,
# Llama 3 `<|python_tag|>{"name", "parameters"}`, Mistral `[TOOL_CALLS][{"name", "arguments"}]` (and v11+
# `[TOOL_CALLS]name[ARGS]{...}`), or plain JSON: a call, a list of calls, an OpenAI-style {"function": {...}}, or
# submit_candidate's arguments alone ({"language", "source", ...}). strict=False: models write raw newlines in strings.
_JSON = json.JSONDecoder(strict=False)
_MISTRAL_V11 = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z_][\w.-]*)\s*\[ARGS\]\s*$")


def tool_calls_in_text(text: str) -> list[dict]:
    """Every tool call written in `text`, in order, as {"name", "arguments"} (arguments: an object or a JSON string)."""
    calls, i = [], 0
    while True:
        start = min((j for j in (text.find("{", i), text.find("[", i)) if j >= 0), default=-1)
        if start < 0:
            return calls
        try:
            value, end = _JSON.raw_decode(text, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        named = _MISTRAL_V11.search(text, max(0, start - 200), start)   # `[TOOL_CALLS]name[ARGS]` right before
        if named and isinstance(value, dict):
            calls.append({"name": named.group(1), "arguments": value})
        else:
            calls += _calls_in(value)
        i = end


def _calls_in(value: Any) -> list[dict]:
    if isinstance(value, list):
        return [call for item in value for call in _calls_in(item)]
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("function"), dict):
        return _calls_in(value["function"])
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(value.get("name"), str) and isinstance(arguments, (dict, str)):
        return [{"name": value["name"], "arguments": arguments}]
    if isinstance(value.get("source"), str):
        return [{"name": SUBMIT, "arguments": value}]
    return []


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
    device = result.executed_on
    if device == "cuda":
        device = f"cuda: {(result.gpu or {}).get('name') or 'GPU'}"
    reward = Reward(scalar_reward(components), result.verdict or "runtime_error", list(result.reasons), components,
                    result, device)
    log.info("kloop reward %.3f (%s) judged on %s", reward.reward, reward.verdict, device or "nothing (did not run)")
    if device == "cpu-interpreter" and not _warned_cpu:
        _warn_cpu()
    return reward


_warned_cpu = False


def _warn_cpu() -> None:
    """Once per process: a CPU reward is the interpreter's correctness check, slow and untimed (see the README)."""
    global _warned_cpu
    _warned_cpu = True
    log.warning("kloop reward: judged by the Triton CPU interpreter (no GPU): correctness only, untimed, seconds to "
                "minutes per completion and not bit-faithful to a GPU's verdict; not a training reward")


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
