"""The interface every policy implements: given what happened so far, propose the next candidate.

A policy is small on purpose (mini-swe-agent's Model): the graph owns the loop, the database and the budgets;
the policy only turns context into a proposal and reports the model traffic it caused, so that traffic is logged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tools.records.messages import Message  # noqa: F401  (re-exported: policies build Messages)
from tools.records.store import Attempt
from tools.result import EvalResult


@dataclass
class AttemptView:
    """What a policy may see of one earlier attempt (a stored Attempt, trimmed: AttemptView.of)."""
    id: int
    number: int
    branch: int
    language: str
    source: str
    verdict: str
    reasons: list[str]
    time_us: float | None          # median kernel time
    speedup_eager: float | None
    speedup_compile: float | None
    sol_fraction: float | None
    diagnosis: str                 # the reflect node's reading of the counters
    result: EvalResult             # the evaluator's whole result

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptView:
        """A stored attempt as a policy sees it: the one place a view is made from the store."""
        return cls(
            id=attempt.id, number=attempt.number, branch=attempt.branch, language=attempt.language or "",
            source=attempt.source or "", verdict=attempt.verdict or "", reasons=attempt.reasons or [],
            time_us=attempt.median_us, speedup_eager=attempt.speedup_eager, speedup_compile=attempt.speedup_compile,
            sol_fraction=attempt.sol_fraction, diagnosis=attempt.diagnosis or "", result=attempt.result)


@dataclass
class ProposeContext:
    run_id: str
    branch: int
    turn: int
    target_name: str
    target_source: str             # the main shape only; hidden variants are never shown
    language: str                  # triton, ptx or auto
    gpu: dict | None               # evaluator's gpu dict, None without a GPU
    history: list[AttemptView]     # this branch's attempts, oldest first
    best: AttemptView | None       # the run's best verified attempt (shared across branches)
    budget_left: dict = field(default_factory=dict)  # attempts / seconds / cost left
    tool_results: list[dict] = field(default_factory=list)  # answers to the proposal's inspection tool calls
    # The search strategy's choice (agent/strategies): the attempt to build on and why; None under refine, whose
    # parent is simply the best. lessons: memory items from earlier runs ({id, text, support, contradict}).
    strategy: str = "refine"
    parent: AttemptView | None = None
    parent_reason: str = ""
    lessons: list[dict] = field(default_factory=list)
    in_flight: int = 0             # this branch's attempts proposed and not yet logged


@dataclass
class Proposal:
    language: str                  # triton or ptx
    source: str                    # a module defining ModelNew
    reasoning: str                 # why this candidate, in words
    messages: list[Message] = field(default_factory=list)
    done: bool = False             # the policy has nothing more to try
    # Nothing yet, but soon (the offline policy compiling a PTX twin): asked again once an attempt in flight is
    # logged. Only while ctx.in_flight > 0; a policy with nothing in flight waits itself.
    wait: bool = False
    # Inspection tool calls ({id, name, input}) the graph's tool node must answer before the policy proposes;
    # when present, source may be empty.
    tool_calls: list[dict] = field(default_factory=list)
    format_error: str = ""         # why there is no candidate: the model's answer had none, or the call failed

    @property
    def call_failed(self) -> bool:
        """The model call itself failed (retries spent, stream broken off): the policy logged an error as its last
        message and has neither a candidate nor tool calls. The graph logs it but makes no attempt of it."""
        return bool(self.messages) and self.messages[-1].role == "error" and not self.source and not self.tool_calls


@dataclass
class RunDigest:
    """A finished run, as a model policy's optional `distill(digest) -> (lessons, judgements, messages)` reads it
    (agent/learn.py): lessons [{text, evidence: [attempt numbers]}], judgements of the lessons it was shown
    [{id, verdict: supported|contradicted|unrelated, why}]. The offline and replay policies have no distill."""
    target_name: str
    features: dict                 # op, description, dtypes, bucket, gpu
    attempts: list[AttemptView]
    best: AttemptView | None
    shown_lessons: list[dict] = field(default_factory=list)


class PolicyError(Exception):
    """A policy cannot go on (missing key, no seed kernel for a user target, ...): one line for the user."""


class Policy(Protocol):
    name: str
    model: str

    def propose(self, ctx: ProposeContext) -> Proposal: ...

    def reflect(self, ctx: ProposeContext, attempt: AttemptView) -> tuple[str, list[Message]]:
        """The policy's own reflection on an attempt it just saw evaluated (may be empty)."""
        ...
