"""The optimization loop as a LangGraph graph: write -> [tools] -> assemble -> verify -> profile -> reflect -> log.

Each lineage (branch) walks the loop as a chain of `Send`s carrying only {"branch", "key"}; N branches run in
parallel in the same supersteps. Everything else lives outside graph state: sources, results and logs in the run
database, the evaluator's live session (and the proposal being evaluated) in `Loop.live`, keyed by `key`. After a
crash the checkpoint replays the pending Sends; a node that finds no live session for its key restarts that attempt
at `write`, so the lost attempt is simply redone. Attempt numbers come from the database at commit time (`log`).

Pipelining (`LoopSettings.pipeline` = N > 1): `write` keeps N attempts of its branch in flight. It proposes until
N are proposed (each from the attempts logged so far; the evaluator starts on each at once, in the background), then
the chain follows the oldest through assemble ... log, which wait for its stages; after it is logged, `write` tops
the window up again. So attempts are logged in the order they were proposed, each with the parent it was proposed
from, while later ones compile and wait for the GPU.
"""
from __future__ import annotations

import contextlib
import operator
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from agent.diagnose import diagnose
from agent.output import duration, plural
from agent.policy import AttemptView, Message, Policy, PolicyError, Proposal, ProposeContext
from agent.strategies import cell_of_result, choose
from sandbox.seam import StagedEvaluation
from tools.result import FAILED, EvalResult
from tools.records.store import Attempt, Store, attempt_columns, now, takes_the_lead

# The graph's own verdict for a turn whose answer carried no usable candidate (not one of the evaluator's six).
FORMAT_ERROR = "format_error"
# Failed model calls in a row (each after the SDK's own retries) before the run gives up: an outage must not spin.
MAX_API_FAILURES = 5


class ModelApiError(PolicyError):
    """The model API kept failing: the run stops as 'failed' and can be resumed once the API is back."""


@dataclass
class LoopSettings:
    max_attempts: int = 20
    hours: float | None = None          # active wall-clock budget (sum of the wall time each attempt added)
    branches: int = 1
    target_sol: float = 0.9             # stop once the best reaches this fraction of speed-of-light
    patience: int = 20                  # stop after this many attempts without a new best
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    language: str = "auto"
    max_tool_rounds: int = 8            # inspection rounds allowed before a proposal must carry a candidate
    # Search (agent/strategies): how the next attempt's parent is picked; strategy_seed (stored with the run) seeds
    # the picks, so a resumed run picks the same; islands / migrate_every are evolve's.
    strategy: str = "refine"
    strategy_seed: int = 0
    islands: int = 2
    migrate_every: int = 4
    lessons: tuple = ()                 # memory from earlier runs shown to model policies ({id, text, ...})
    pipeline: int = 1                   # attempts in flight per branch (proposed ahead, logged in order)


@dataclass
class Live:
    """One attempt in flight: never checkpointed, lost (and redone) if the process dies."""
    turn: int
    started: float
    parent_attempt_id: int | None
    parent: Any = None                  # the strategy's agent.strategies.Parent
    proposal: Proposal | None = None
    messages: list[Message] = field(default_factory=list)
    tool_results: list[dict] = field(default_factory=list)
    tool_rounds: int = 0
    evaluation: StagedEvaluation | None = None   # the candidate's evaluation, entered when it is proposed
    result: EvalResult = field(default_factory=EvalResult)
    diagnosis: str = ""
    reflection: str = ""


@dataclass
class Loop:
    """What the nodes need besides the lineage: the run, its policy, an evaluation factory and the budgets."""
    store: Store
    run_id: str
    policy: Policy
    evaluation: Callable[[str], StagedEvaluation]   # source -> its evaluation (EvaluatorSession.submit)
    settings: LoopSettings
    target_name: str
    target_source: str
    gpu: dict | None = None                 # the run's GPU facts (runs.gpu), shown to the policy from turn 1
    live: dict[str, Live] = field(default_factory=dict)
    api_failures: int = 0                   # failed model calls in a row, over all branches
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Branches propose and assemble in parallel, but verify and profile one at a time: both set the target's shape
    # through module globals and seed torch's global RNG, and two kernels timed at once on one GPU disturb each other.
    # (A pipelined evaluator's devices take one candidate at a time themselves.)
    measuring: threading.Lock = field(default_factory=threading.Lock)
    windows: dict[int, list[str]] = field(default_factory=dict)   # branch -> keys in flight, oldest first
    last_commit: float = field(default_factory=time.monotonic)    # when the last attempt was logged (any branch)
    views: dict[int, AttemptView] = field(default_factory=dict)   # attempt id -> its view (attempts never change)

    # -- the loop ----------------------------------------------------------------------------------------------
    def start(self, state: dict) -> Command:
        return Command(goto=[Send("write", {"branch": b, "key": ""}) for b in range(state["branches"])])

    def write(self, lineage: dict) -> Command | dict:
        """Propose until the branch has `pipeline` attempts in flight (one without pipelining), each handed to the
        evaluator at once; then follow the oldest. A proposal that asks for tools goes to the tools node first."""
        branch, key = lineage["branch"], lineage["key"]
        window = self.windows.setdefault(branch, [])
        live = self.live.get(key) if key else None   # a proposal coming back from its tool round, or a new one
        said_done = False
        while live is not None or (len(window) < max(1, self.settings.pipeline) and not said_done):
            if live is None:                # a new attempt (or one lost in a crash, redone)
                with self.lock:
                    reason = self.stop_reason()
                    if reason and not window:
                        emit("stop", branch=branch, reason=reason)
                        return {"stops": [reason]}
                    if reason:              # no more proposals; the ones in flight are still logged
                        break
                    key = uuid.uuid4().hex
                    turn = len(self.store.history(self.run_id, branch)) + len(window) + 1
                    parent = choose(self.store, self.run_id, self.settings, branch, turn)
                    live = self.live[key] = Live(turn=turn, started=time.monotonic(),
                                                 parent_attempt_id=parent.attempt_id, parent=parent)
            emit("stage", branch=branch, stage="write")
            proposal = self.policy.propose(self.context(branch, live))
            if proposal.call_failed:
                return self.api_failure(branch, key, live, proposal)
            with self.lock:
                self.api_failures = 0
            live.proposal, live.messages = proposal, live.messages + proposal.messages
            if proposal.tool_calls and live.tool_rounds < self.settings.max_tool_rounds:
                return Command(goto=Send("tools", {"branch": branch, "key": key}))
            if proposal.wait and window:   # the turn is proposed again, after the oldest in flight is logged
                del self.live[key]
                said_done, live = True, None
                continue
            if proposal.done and not proposal.source:
                del self.live[key]
                with self.store.transaction():  # what the last exchange cost still counts
                    for message in live.messages:
                        self.store.add_message(self.run_id, message, branch=branch, turn=live.turn)
                if not window:
                    why = "the policy has nothing more to try" + (f": {proposal.reasoning}" if proposal.reasoning else "")
                    emit("stop", branch=branch, reason=why)
                    return {"stops": [why]}
                said_done, live = True, None  # asked again once the oldest in flight is logged
                continue
            if proposal.format_error or not proposal.source.strip():
                why = proposal.format_error or (f"still inspecting after {live.tool_rounds} tool rounds" if
                                                proposal.tool_calls else "the proposal carried no candidate source")
                # Logged as an attempt (the model's answer is a negative example for training; the next turn's
                # history shows the model why), but never evaluated.
                live.result = EvalResult(verdict=FORMAT_ERROR, language=proposal.language, reasons=[why])
            else:
                live.evaluation = self.evaluation(proposal.source)
                live.evaluation.__enter__()
            window.append(key)
            live = None
        head = window[0]
        return Command(goto=Send("assemble" if self.live[head].evaluation is not None else "log",
                                 {"branch": branch, "key": head}))

    def api_failure(self, branch: int, key: str, live: Live, proposal: Proposal) -> Command:
        """The model call failed: log the turn's traffic with no attempt (an outage is not the model's answer and
        spends no attempt budget) and start the turn over; give up after MAX_API_FAILURES failures in a row."""
        del self.live[key]
        with self.store.transaction():
            for message in live.messages + proposal.messages:
                self.store.add_message(self.run_id, message, branch=branch, turn=live.turn)
        with self.lock:
            self.api_failures += 1
            failures = self.api_failures
        emit("api_error", branch=branch, error=proposal.format_error, failures=failures)
        if failures >= MAX_API_FAILURES:
            raise ModelApiError(f"the model API failed {failures} times in a row, last: {proposal.format_error}")
        return Command(goto=Send("write", {"branch": branch, "key": ""}))

    def tools(self, lineage: dict) -> Command:
        from agent.inspect_tools import run_tool  # model policies only: the offline path never imports it
        live = self.live.get(lineage["key"])
        if live is None:
            return redo(lineage)
        emit("stage", branch=lineage["branch"], stage="tools")
        live.tool_rounds += 1
        live.tool_results = []
        for call in live.proposal.tool_calls:
            answer = run_tool(self.store, self.run_id, call)
            live.tool_results.append(answer)
            live.messages += [Message(role="tool_call", content=call), Message(role="tool_result", content=answer)]
        return Command(goto=Send("write", lineage))

    def assemble(self, lineage: dict) -> Command:
        return self.stage(lineage, "assemble", "verify", lambda evaluation: evaluation.assemble())

    def verify(self, lineage: dict) -> Command:
        return self.stage(lineage, "verify", "profile", lambda evaluation: evaluation.verify())

    def profile(self, lineage: dict) -> Command:
        return self.stage(lineage, "profile", "reflect", lambda evaluation: evaluation.profile())

    def reflect(self, lineage: dict) -> Command:
        live = self.live.get(lineage["key"])
        if live is None:
            return redo(lineage)
        emit("stage", branch=lineage["branch"], stage="reflect")
        live.diagnosis = diagnose(live.result)[0]
        view = self.view_of(live, lineage["branch"])
        live.reflection, messages = self.policy.reflect(self.context(lineage["branch"], live), view)
        live.messages += messages
        return Command(goto=Send("log", lineage))

    def log(self, lineage: dict) -> Command:
        live = self.live.pop(lineage["key"], None)
        if live is None:
            return redo(lineage)
        window = self.windows.get(lineage["branch"], [])
        if lineage["key"] in window:
            window.remove(lineage["key"])
        try:
            number = self.commit(live, lineage["branch"])
        finally:
            if live.evaluation is not None:
                live.evaluation.__exit__(None, None, None)
        progress = self.store.progress(self.run_id)
        r = live.result
        emit("attempt", branch=lineage["branch"], number=number, verdict=r.verdict,
             language=r.language or (live.proposal.language if live.proposal else ""),
             source=live.proposal.source if live.proposal else "",
             speedup_eager=r.speedup_over("eager"), sol_fraction=r.sol_fraction, reasons=r.reasons,
             vs_best=r.vs_best, progress=progress, left=self.budget_left(progress), pick=pick_of(live.parent))
        return Command(goto=Send("write", {"branch": lineage["branch"], "key": ""}))

    # -- helpers -----------------------------------------------------------------------------------------------
    def stage(self, lineage: dict, name: str, after: str, call: Callable[[StagedEvaluation], Any]) -> Command:
        """Run one evaluator stage (`call`); a failed verdict skips straight to reflect."""
        live = self.live.get(lineage["key"])
        if live is None:
            return redo(lineage)
        emit("stage", branch=lineage["branch"], stage=name)
        if live.evaluation is None:
            live.evaluation = self.evaluation(live.proposal.source)
            live.evaluation.__enter__()
        with contextlib.nullcontext() if name == "assemble" or live.evaluation.pipelined else self.measuring:
            call(live.evaluation)
        live.result = live.evaluation.result
        return Command(goto=Send("reflect" if live.result.verdict in FAILED else after, lineage))

    def stop_reason(self) -> str:
        """The first stop rule that holds now ('' if none); in-flight attempts count against max_attempts."""
        s, p = self.settings, self.store.progress(self.run_id)
        if p["attempts"] + len(self.live) >= s.max_attempts:
            return f"reached {plural(s.max_attempts, 'attempt')}"
        if s.hours is not None and p["seconds"] >= s.hours * 3600:
            return f"used the {duration(s.hours)} time budget"
        if s.max_cost_usd is not None and p["cost_usd"] >= s.max_cost_usd:
            return f"spent the ${s.max_cost_usd:g} budget"
        if s.max_tokens is not None and p["tokens"] >= s.max_tokens:
            return f"used the {s.max_tokens}-token budget"
        if p["best_sol"] is not None and p["best_sol"] >= s.target_sol:
            return f"best attempt reached {p['best_sol']:.0%} of speed-of-light (target {s.target_sol:.0%})"
        if p["last_number"] - (p["best_number"] or 0) >= s.patience:
            return f"no improvement in {plural(s.patience, 'attempt')}"
        return ""

    def budget_left(self, p: dict) -> dict:
        s = self.settings
        left = {"attempts": max(0, s.max_attempts - p["attempts"])}
        if s.hours is not None:
            left["seconds"] = max(0.0, s.hours * 3600 - p["seconds"])
        if s.max_cost_usd is not None:
            left["cost_usd"] = max(0.0, s.max_cost_usd - p["cost_usd"])
        if s.max_tokens is not None:
            left["tokens"] = max(0, s.max_tokens - p["tokens"])
        return left

    def context(self, branch: int, live: Live) -> ProposeContext:
        parent = live.parent
        rows = self.store.history(self.run_id, branch) if parent is None or parent.shown is None else parent.shown
        best = self.store.best_attempt(self.run_id) if parent is None or parent.show_best else None
        shown_parent = parent is not None and parent.show_parent and parent.attempt is not None
        return ProposeContext(
            run_id=self.run_id, branch=branch, turn=live.turn, target_name=self.target_name,
            target_source=self.target_source, language=self.settings.language, gpu=self.gpu,
            history=[self.view(attempt) for attempt in rows], best=AttemptView.of(best) if best else None,
            budget_left=self.budget_left(self.store.progress(self.run_id)), tool_results=live.tool_results,
            strategy=self.settings.strategy, parent=AttemptView.of(parent.attempt) if shown_parent else None,
            parent_reason=parent.reason if parent is not None else "", lessons=list(self.settings.lessons),
            in_flight=len(self.windows.get(branch, [])))

    def view(self, attempt: Attempt) -> AttemptView:
        if attempt.id not in self.views:
            self.views[attempt.id] = AttemptView.of(attempt)
        return self.views[attempt.id]

    def view_of(self, live: Live, branch: int) -> AttemptView:
        """The attempt being reflected on, before it is committed (so it has no id or number yet)."""
        r = live.result
        return AttemptView(
            id=0, number=0, branch=branch, language=live.proposal.language, source=live.proposal.source,
            verdict=r.verdict or "", reasons=r.reasons, time_us=r.median_us, speedup_eager=r.speedup_over("eager"),
            speedup_compile=r.speedup_over("compile"), sol_fraction=r.sol_fraction, diagnosis=live.diagnosis,
            result=r)

    def commit(self, live: Live, branch: int) -> int:
        """One transaction: the attempt, its messages, the run's best and (first time seen) its machine facts."""
        proposal = live.proposal
        best = self.store.best_attempt(self.run_id)
        if needs_rejudging(live.result, best):
            live.evaluation.rejudge()  # paired against the best as it stands now, not the one it was timed beside
        r = live.result
        new_best = takes_the_lead(r, best)
        if new_best and best is not None and r.vs_best is None and r.median_us is not None:
            r.flags.append("new_best_unpaired")  # the standing best could not be re-timed beside it (a resumed run)
        columns = attempt_columns(r)
        columns["language"] = columns["language"] or proposal.language
        with self.lock:  # wall: the time this attempt added to the run, however many were in flight
            done = time.monotonic()
            wall, self.last_commit = done - self.last_commit, done
        columns["durations"] = {**(columns["durations"] or {}), "attempt": done - live.started, "wall": wall}
        run = self.store.get_run(self.run_id)
        with self.store.transaction():
            attempt_id = self.store.add_attempt(
                self.run_id, live.messages, branch=branch, turn=live.turn, parent_attempt_id=live.parent_attempt_id,
                source=proposal.source, reasoning=proposal.reasoning, diagnosis=live.diagnosis,
                reflection=live.reflection, **columns, **search_columns(live.parent, r, proposal))
            facts = machine_facts(r, run)
            if new_best:
                facts["best_attempt_id"] = attempt_id
            if facts:
                self.store.update_run(self.run_id, **facts)
        number = self.store.get_attempt(attempt_id).number
        if new_best and live.evaluation is not None:
            live.evaluation.adopt_as_best(number)
        return number


class RunState(TypedDict):
    branches: int
    stops: Annotated[list[str], operator.add]   # why each lineage ended


# Where each node's Command may send a lineage, with why: the graph's edges (nodes route with Send, so LangGraph
# learns them only from here). `graph.get_graph().draw_mermaid()` draws them: propose (write) -> evaluate (assemble,
# verify, profile) -> reflect -> commit (log) -> write, a stop rule ending the lineage at write; "redo": the attempt
# was lost with its process (a resumed checkpoint), and is proposed again.
ROUTES: dict[str, dict[str, str]] = {
    "start": {"write": "each branch"},
    "write": {"assemble": "proposed", "tools": "tool calls", "log": "format error", "write": "model API failed",
              END: "stop rule"},
    "tools": {"write": "answers"},
    "assemble": {"verify": "assembled", "reflect": "failed", "write": "redo"},
    "verify": {"profile": "correct", "reflect": "failed", "write": "redo"},
    "profile": {"reflect": "timed", "write": "redo"},
    "reflect": {"log": "reflected", "write": "redo"},
    "log": {"write": "next attempt"},
}


def build_graph(loop: Loop) -> StateGraph:
    graph = StateGraph(RunState)
    for name, destinations in ROUTES.items():
        graph.add_node(name, getattr(loop, name), destinations=destinations)
    graph.add_edge(START, "start")
    return graph


def _interrupted(error: BaseException | None) -> bool:
    """Ctrl-C, or an error raised while Ctrl-C unwound the graph: LangGraph's runner, shut down by the interrupt,
    raises "cannot schedule new futures after shutdown" for a task that finished meanwhile (seen on a GPU suite)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__context__
    return False


def run_loop(loop: Loop, checkpoints: Path, on_event: Callable[[dict], None] = lambda event: None,
             restart: bool = False) -> str:
    """Run (or resume: same run id, same checkpoint thread) the loop to a stop rule; returns the run's status.

    restart: a graph that already ended starts again (a finished run given new budgets); its attempts so far stay.
    Ctrl-C marks the run 'stopped' (resumable) and re-raises; any other error marks it 'failed' and re-raises.
    """
    config = {"configurable": {"thread_id": loop.run_id}, "recursion_limit": 10**9}
    store = loop.store
    store.update_run(loop.run_id, status="running", finished_at=None)
    try:
        with SqliteSaver.from_conn_string(str(checkpoints)) as saver:
            graph = build_graph(loop).compile(checkpointer=saver)
            state = graph.get_state(config)
            # Pending tasks (finished ones whose writes are saved included) mean a run to continue; none after a
            # checkpoint means the graph already ended.
            ended = state.created_at is not None and not state.tasks
            if ended and not restart:
                stops = state.values.get("stops", [])
            else:
                before = len(state.values.get("stops", [])) if ended else 0
                start = None if state.tasks else {"branches": loop.settings.branches, "stops": []}
                for event in graph.stream(start, config, stream_mode="custom", durability="sync"):
                    on_event(event)
                stops = graph.get_state(config).values.get("stops", [])[before:]
    except BaseException as e:
        if _interrupted(e):
            store.update_run(loop.run_id, status="stopped", notes="interrupted (Ctrl-C); resume with kloop resume")
            if isinstance(e, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from e
        store.update_run(loop.run_id, status="failed", notes=f"{type(e).__name__}: {e}")
        raise
    finally:
        for live in loop.live.values():
            if live.evaluation is not None:
                live.evaluation.__exit__(None, None, None)
        loop.live.clear()
        loop.windows.clear()
    store.update_run(loop.run_id, status="finished", finished_at=now(), notes="; ".join(dict.fromkeys(stops)))
    return "finished"


def search_columns(parent, result: EvalResult, proposal: Proposal) -> dict:
    """What the strategy logs with each attempt: why its parent, the attempt's own archive cell, its island."""
    if parent is None:
        return {}
    return {"parent_reason": parent.reason, "island": parent.island,
            "archive_cell": cell_of_result(result.language or proposal.language, result, proposal.source)}


def pick_of(parent) -> dict | None:
    """The strategy's pick for an attempt, for progress lines: the parent's number, why, its island and cell."""
    if parent is None:
        return None
    return {"parent": parent.attempt.number if parent.attempt else None, "reason": parent.reason,
            "island": parent.island, "cell": parent.cell}


def emit(kind: str, **fields: Any) -> None:
    get_stream_writer()({"kind": kind, **fields})


def redo(lineage: dict) -> Command:
    """The live session for this attempt is gone (the process died mid-attempt): start the attempt again."""
    return Command(goto=Send("write", {"branch": lineage["branch"], "key": ""}))


def needs_rejudging(result: EvalResult, best: Attempt | None) -> bool:
    """A correct, timed result that would challenge the standing best but was paired against another one, or none
    (it was profiled before that best was logged: attempts in flight, branches)."""
    if best is None or not result.correct or result.median_us is None:
        return False
    if best.median_us is None or result.median_us >= best.median_us:
        return False
    return result.vs_best is None or result.vs_best.best_attempt != best.number


def machine_facts(result: EvalResult, run: dict) -> dict:
    """Run columns filled from the first result that has them (versions, numeric flags, baselines). The GPU
    columns are not among them: agent.run writes those, once, when the run starts (gpu_facts)."""
    baselines = {k: v.__dict__ for k, v in result.baselines.items()} if result.baselines else None
    facts = {"versions": result.versions, "numeric_flags": result.numeric_flags, "baselines": baselines}
    return {k: v for k, v in facts.items() if v and not run.get(k)}
