"""What agent/ may use of the evaluator: an evaluator session and the staged evaluation of one candidate.

    session: EvaluatorSession = sandbox.placement.local_session(settings)   # or ray_session(settings)
    with session:
        session.start()
        with session.submit(target, source) as ev:       # a StagedEvaluation
            ev.assemble(), ev.verify(), ev.profile()     # each returns once its stage is done
            print(ev.result.verdict)

`sandbox.evaluate.Session` and `sandbox.ray_backend.RaySession` are EvaluatorSessions, and what their `submit`
returns (`sandbox.pipeline.Submitted`) is a StagedEvaluation (tests/test_loop.py checks both). The loop
(agent/graph.py) and the runs (agent/run.py) are typed against these Protocols, not against the classes, so a fake
evaluator in a test, or another backend, is one more class with these members.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tools.result import EvalResult
    from tools.target import Target


@runtime_checkable
class StagedEvaluation(Protocol):
    """One candidate, a stage at a time: `assemble` (plan and load), `verify`, `profile`, each returning the result
    so far once its stage is done; a failed verdict ends it early (`result.verdict` in tools.result.FAILED).
    Used as a context manager: leaving it frees the candidate's plans and processes."""

    # True: the session runs the stages in threads of its own, one candidate at a time per device, so a caller with
    # several candidates in flight need not keep their measurements apart; False: they run in the caller's thread.
    pipelined: bool

    @property
    def result(self) -> EvalResult: ...

    def assemble(self) -> EvalResult: ...

    def verify(self) -> EvalResult: ...

    def profile(self) -> EvalResult: ...

    def rejudge(self) -> None:
        """Time this verified, timed candidate against the session's standing best again: the best changed since
        it was profiled (attempts in flight, branches)."""

    def adopt_as_best(self, attempt: int | None) -> None:
        """Make this candidate the session's standing best, the one later candidates are paired against."""

    def __enter__(self) -> StagedEvaluation: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class EvaluatorSession(Protocol):
    """The trusted machinery a run evaluates in, kept across candidates (and across runs by a caller that runs
    several, as a suite does): its devices, its planners, its standing best."""

    planners: int               # candidates planned at once
    devices: list               # one per GPU (or the CPU): what times candidates, one at a time each

    @property
    def isolation(self) -> str:
        """The jail mode candidates run under, with its note (stored with the run and every result)."""

    @property
    def weakly_isolated(self) -> bool:
        """True when candidates run without bubblewrap (the host's files are visible to them)."""

    def start(self, timeout_s: float = 600) -> None:
        """Start the devices' trusted processes and the planners' spares now, and wait until they are ready."""

    def submit(self, target: Target, source: str) -> StagedEvaluation:
        """One candidate, planned and evaluated in the background; its stages wait for that."""

    def restore_best(self, target: Target, source: str, attempt: int, median_us: float) -> None:
        """A resumed run's best, planned again, as the standing best later candidates are paired against."""

    def forget_best(self) -> None:
        """No standing best: the next run's candidates are not paired against the last run's."""

    def __enter__(self) -> EvaluatorSession: ...

    def __exit__(self, *exc: object) -> None: ...
