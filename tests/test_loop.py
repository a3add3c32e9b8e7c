"""The LangGraph loop with an injected fast evaluator and a scripted policy; crash/resume in real subprocesses."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.graph import Loop, LoopSettings, build_graph, run_loop
from agent.policy import Message, Proposal
from tools.result import EvalResult, Roofline, Timing, VsBest
from tools.records.store import best_after, fastest_key, open_db

REPO = Path(__file__).resolve().parents[1]


class FakeEvaluation:
    """Same staged interface as sandbox.evaluate.Evaluation: 'broken' sources fail to compile, 'wrong' ones are
    incorrect; otherwise the speedup is the number at the end of the source, and a 'tie' only ties with the best in
    the paired re-measurement."""

    pipelined = False   # stages in the loop's own thread (sandbox.seam.StagedEvaluation)

    def __init__(self, source: str, delay: float = 0.0):
        self.source, self.delay = source, delay
        self.result = EvalResult(language="triton")
        self.closed = False
        self.adopted = None

    def adopt_as_best(self, number):
        self.adopted = number

    def rejudge(self):  # its pairing with the best is fixed by its source
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True

    def assemble(self):
        time.sleep(self.delay)
        if "broken" in self.source:
            self.result.verdict, self.result.reasons = "compile_error", ["line 3: expected ':'"]
            self.result.compile_log = "ptxas fatal"

    def verify(self):
        time.sleep(self.delay)
        wrong = "wrong" in self.source
        self.result.verdict = "incorrect" if wrong else "correct"
        self.result.reasons = ["max abs error 3.2 at [0, 7]"] if wrong else []

    def profile(self):
        time.sleep(self.delay)
        speedup = float(self.source.split()[-1])
        self.result.speedup = {"eager": speedup, "compile": speedup / 2}
        self.result.time_us = Timing(median=10 / speedup)
        self.result.roofline = Roofline(bytes=1, flops=0, bound="memory", sol_fraction=speedup / 10)
        if "tie" in self.source:
            self.result.vs_best = VsBest(best_attempt=None, ratio=1.01, ci_low=0.97, ci_high=1.05, n=30, outcome="tie")


class ScriptedPolicy:
    """Proposes script[turn - 1] (per branch), or 'kernel B T <turn>' past the script; records every context."""
    name, model = "scripted", "none"

    def __init__(self, script=(), cost_per_turn=0.0, tool_calls_on_turn=None):
        self.script, self.cost, self.tool_turn = list(script), cost_per_turn, tool_calls_on_turn
        self.contexts = []

    def propose(self, ctx):
        self.contexts.append(ctx)
        if self.tool_turn == ctx.turn and not ctx.tool_results:
            return Proposal("triton", "", "look first", tool_calls=[{"id": "t1", "name": "peek", "input": {}}])
        source = self.script[ctx.turn - 1] if ctx.turn <= len(self.script) else f"kernel {ctx.branch} 1"
        if source == "DONE":
            return Proposal("triton", "", "nothing left", done=True)
        return Proposal("triton", source, f"turn {ctx.turn}",
                        [Message(role="response", content={"turn": ctx.turn}, output_tokens=10, cost_usd=self.cost)])

    def reflect(self, ctx, attempt):
        return f"saw {attempt.verdict}", []


def make_loop(store, run_id, policy, delay=0.0, gpu=None, **settings):
    return Loop(store=store, run_id=run_id, policy=policy,
                evaluation=lambda source: FakeEvaluation(source, delay),
                settings=LoopSettings(**settings), target_name="fake", target_source="class Model: ...", gpu=gpu)


def run_fake_loop(db_path: str, run_id: str, delay: float, max_attempts: int) -> None:
    """Entry point for the subprocess tests: one scripted run, resumable by calling it again."""
    store = open_db(db_path)
    script = [f"kernel {n}" for n in range(1, max_attempts + 1)]
    run_loop(make_loop(store, run_id, ScriptedPolicy(script), delay=delay, max_attempts=max_attempts),
             Path(db_path + ".checkpoints"))


@pytest.fixture
def store(tmp_path):
    db = open_db(tmp_path / "kloop.db")
    yield db
    db.close()


def go(store, policy, **settings):
    run_id = store.create_run(target_name="fake", policy=policy.name)
    events = []
    status = run_loop(make_loop(store, run_id, policy, **settings), Path(f"{store.path}.checkpoints"), events.append)
    return run_id, status, events


def test_the_graph_draws_the_loop_with_its_stop_rule():
    """propose (write) -> evaluate (assemble, verify, profile) -> reflect -> commit (log) -> write; a failed stage
    goes to reflect, a stop rule ends the lineage at write, a lost attempt is proposed again."""
    import re

    loop = Loop(store=None, run_id="r", policy=None, evaluation=FakeEvaluation, settings=LoopSettings(),
                target_name="fake", target_source="")
    drawn = build_graph(loop).compile().get_graph().draw_mermaid()
    edges = set(re.findall(r"(\w+) -\. &nbsp;(.+?)&nbsp; \.-> (\w+);", drawn))
    assert "__start__ --> start;" in drawn
    assert edges == {
        ("start", "each branch", "write"),
        ("write", "proposed", "assemble"), ("write", "tool calls", "tools"), ("write", "format error", "log"),
        ("write", "model API failed", "write"), ("write", "stop rule", "__end__"),
        ("tools", "answers", "write"),
        ("assemble", "assembled", "verify"), ("verify", "correct", "profile"), ("profile", "timed", "reflect"),
        ("assemble", "failed", "reflect"), ("verify", "failed", "reflect"),
        ("reflect", "reflected", "log"), ("log", "next attempt", "write"),
        *{(stage, "redo", "write") for stage in ("assemble", "verify", "profile", "reflect")},
    }


def test_the_evaluators_are_what_the_seam_declares():
    """agent/ is typed against sandbox.seam: the local session, what its submit returns and this file's fake
    evaluation have every member the loop and the runs use; the Ray session every method (its other members are
    set when it joins a cluster)."""
    from types import SimpleNamespace

    from sandbox.evaluate import Session
    from sandbox.pipeline import Submitted
    from sandbox.seam import EvaluatorSession, StagedEvaluation

    with Session(spares=0) as session:
        assert isinstance(session, EvaluatorSession)
    assert isinstance(Submitted(None, SimpleNamespace(result=EvalResult()), 1), StagedEvaluation)
    assert isinstance(FakeEvaluation("kernel 1"), StagedEvaluation)
    assert not isinstance(SimpleNamespace(result=EvalResult(), assemble=print), StagedEvaluation)
    pytest.importorskip("ray")
    from sandbox.ray_backend import RaySession

    methods = [name for name, value in vars(EvaluatorSession).items() if callable(value) and not name.startswith("_")]
    assert methods and all(callable(getattr(RaySession, name, None)) for name in methods)


def test_attempts_are_logged_in_order_with_their_messages(store):
    run_id, status, events = go(store, ScriptedPolicy(["kernel 1", "kernel 3", "kernel 2"]), max_attempts=3)
    assert status == "finished"
    attempts = store.attempts(run_id)
    assert [(a.number, a.turn, a.verdict, a.speedup_eager) for a in attempts] == [
        (1, 1, "correct", 1.0), (2, 2, "correct", 3.0), (3, 3, "correct", 2.0)]
    assert attempts[1].reflection == "saw correct" and "memory-bound" in attempts[1].diagnosis
    assert attempts[1].parent_attempt_id == attempts[0].id  # built while attempt 1 was the best
    assert [m["attempt_id"] for m in store.messages(run_id)] == [a.id for a in attempts]
    run = store.get_run(run_id)
    assert run["best_attempt_id"] == attempts[1].id and run["notes"] == "reached 3 attempts"
    assert [e["number"] for e in events if e["kind"] == "attempt"] == [1, 2, 3]
    assert {"write", "assemble", "verify", "profile", "reflect"} <= {e["stage"] for e in events if e["kind"] == "stage"}


def test_best_after_names_the_best_the_loop_chose(store):
    """The loop's rule replayed on the logged attempts (tools.records.store.best_after) agrees with runs.best_attempt_id at
    every step: a faster median that only tied in the paired re-measurement does not take the lead. The fastest
    attempt (fastest_key) is another idea, and here another attempt."""
    run_id, _, _ = go(store, ScriptedPolicy(["wrong kernel 1", "kernel 2", "kernel tie 5", "kernel 3", "kernel 1"]),
                      max_attempts=5)
    attempts = store.attempts(run_id)
    assert store.best_attempt(run_id).number == 4
    assert [getattr(best_after(attempts[:n]), "number", None) for n in range(1, 6)] == [None, 2, 2, 4, 4]
    verified = [a for a in attempts if a.verdict == "correct"]
    assert min(verified, key=fastest_key).number == 3


def test_a_compile_error_and_a_wrong_answer_reach_the_next_context(store):
    policy = ScriptedPolicy(["broken kernel 1", "wrong kernel 1", "kernel 2"])
    run_id, _, events = go(store, policy, max_attempts=3)
    second, third = policy.contexts[1], policy.contexts[2]
    assert second.history[0].verdict == "compile_error"
    assert second.history[0].reasons == ["line 3: expected ':'"]
    assert second.history[0].result.compile_log == "ptxas fatal"
    assert third.history[1].verdict == "incorrect" and "max abs error" in third.history[1].reasons[0]
    assert second.best is None and third.best is None
    stages = [e["stage"] for e in events if e["kind"] == "stage"]
    assert stages[:3] == ["write", "assemble", "reflect"]  # a compile error skips verify and profile


@pytest.mark.parametrize("settings, script, reason, attempts", [
    ({"max_attempts": 10, "target_sol": 0.5}, ["kernel 2", "kernel 6", "kernel 9"], "speed-of-light", 2),
    ({"max_attempts": 10, "patience": 2}, ["kernel 3", "kernel 1", "kernel 2", "kernel 9"], "no improvement in 2", 3),
    ({"max_attempts": 10}, ["kernel 1", "kernel 2", "DONE"], "nothing more to try", 2),
    ({"max_attempts": 10, "max_tokens": 25}, [], "token budget", 3),
    ({"max_attempts": 10, "hours": 1e-9}, [], "time budget", 1),
])
def test_stop_rules(store, settings, script, reason, attempts):
    run_id, status, _ = go(store, ScriptedPolicy(script), **settings)
    assert status == "finished"
    assert reason in store.get_run(run_id)["notes"]
    assert len(store.attempts(run_id)) == attempts


def test_cost_budget_counts_logged_messages(store):
    run_id, _, _ = go(store, ScriptedPolicy(cost_per_turn=0.4), max_attempts=10, max_cost_usd=1.0)
    assert len(store.attempts(run_id)) == 3 and "$1 budget" in store.get_run(run_id)["notes"]


def test_branches_run_their_own_lineages_and_share_the_best(store):
    policy = ScriptedPolicy(["kernel 1", "kernel 2", "kernel 3"])
    run_id, status, _ = go(store, policy, max_attempts=6, branches=2)
    attempts = store.attempts(run_id)
    assert [a.number for a in attempts] == [1, 2, 3, 4, 5, 6]
    assert sorted((a.branch, a.turn) for a in attempts) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    for ctx in policy.contexts:  # each lineage sees its own history, and the run-wide best
        assert all(h.branch == ctx.branch for h in ctx.history)
    last = [c for c in policy.contexts if c.turn == 3]
    assert all(c.best is not None and c.best.speedup_eager == 2.0 for c in last)


def test_tool_calls_are_answered_before_the_candidate(store, monkeypatch):
    import agent.inspect_tools

    calls = []
    monkeypatch.setattr(agent.inspect_tools, "run_tool", lambda db, run_id, call: calls.append(call) or
                        {"tool_use_id": call["id"], "name": call["name"], "content": "42", "is_error": False})
    policy = ScriptedPolicy(["kernel 1", "kernel 2"], tool_calls_on_turn=2)
    run_id, _, _ = go(store, policy, max_attempts=2)
    assert calls == [{"id": "t1", "name": "peek", "input": {}}]
    assert policy.contexts[2].tool_results[0]["content"] == "42"
    second = store.attempts(run_id)[1]
    roles = [m["role"] for m in store.messages(run_id) if m["attempt_id"] == second.id]
    assert roles == ["tool_call", "tool_result", "response"]


class FlakyApiPolicy(ScriptedPolicy):
    """Fails the model call (as the model policies report it: an error message last, no candidate) on the turns
    listed in `failures`, as many times as listed; answers with no code on `no_code_turn`."""

    def __init__(self, script=(), failures=(), no_code_turn=None):
        super().__init__(script)
        self.failures, self.no_code_turn = list(failures), no_code_turn

    def propose(self, ctx):
        self.contexts.append(ctx)
        if ctx.turn in self.failures:
            self.failures.remove(ctx.turn)
            return Proposal("", "", "", messages=[Message("request", {"turn": ctx.turn}),
                                                  Message("error", {"error": "model call failed: 529"})],
                            format_error="model call failed: OverloadedError 529")
        if ctx.turn == self.no_code_turn:
            return Proposal("", "", "Looks done to me.", messages=[Message("response", {"text": "done"})],
                            format_error="no submit_candidate call and no fenced block")
        self.contexts.pop()
        return super().propose(ctx)


def test_api_failures_make_no_attempt_and_format_errors_do(store):
    policy = FlakyApiPolicy(["kernel 1", "kernel 2", "kernel 3"], failures=[2, 2], no_code_turn=3)
    run_id, status, events = go(store, policy, max_attempts=3)
    assert status == "finished"
    attempts = store.attempts(run_id)
    # Two failed calls on turn 2 cost no attempt: the budget of 3 still holds turns 1-3.
    assert [(a.turn, a.verdict) for a in attempts] == [(1, "correct"), (2, "correct"), (3, "format_error")]
    assert attempts[2].source == "" and attempts[2].reasoning == "Looks done to me."
    assert attempts[2].reasons == ["no submit_candidate call and no fenced block"]
    errors = [m for m in store.messages(run_id) if m["role"] == "error"]
    assert len(errors) == 2 and all(m["attempt_id"] is None and m["turn"] == 2 for m in errors)
    assert [m["role"] for m in store.messages(run_id) if m["attempt_id"] == attempts[2].id] == ["response"]
    assert [e["failures"] for e in events if e["kind"] == "api_error"] == [1, 2]
    assert policy.contexts[-1].history[-1].verdict == "correct"


def test_an_api_outage_fails_the_run_after_five_failures_in_a_row(store):
    from agent.graph import MAX_API_FAILURES, ModelApiError

    policy = FlakyApiPolicy(["kernel 1"], failures=[2] * MAX_API_FAILURES)
    run_id = store.create_run(target_name="fake", policy="flaky")
    with pytest.raises(ModelApiError, match=f"failed {MAX_API_FAILURES} times in a row.*529"):
        run_loop(make_loop(store, run_id, policy, max_attempts=5), Path(f"{store.path}.checkpoints"))
    run = store.get_run(run_id)
    assert run["status"] == "failed" and f"failed {MAX_API_FAILURES} times in a row" in run["notes"]
    assert len(store.attempts(run_id)) == 1
    assert sum(m["role"] == "error" for m in store.messages(run_id)) == MAX_API_FAILURES
    # Once the API is back, resume carries on from turn 2 (the failures are not attempts).
    assert run_loop(make_loop(store, run_id, policy, max_attempts=3), Path(f"{store.path}.checkpoints")) == "finished"
    assert [a.turn for a in store.attempts(run_id)] == [1, 2, 3]


def test_the_runs_gpu_facts_reach_the_policy_from_turn_1(store):
    gpu = {"name": "NVIDIA H100 80GB HBM3", "sms": 132}
    policy = ScriptedPolicy(["kernel 1", "kernel 2"])
    run_id = store.create_run(target_name="fake", policy="scripted")
    run_loop(make_loop(store, run_id, policy, max_attempts=2, gpu=gpu), Path(f"{store.path}.checkpoints"))
    assert [c.gpu for c in policy.contexts] == [gpu, gpu]


def test_ctrl_c_stops_the_run_and_resume_finishes_it(store):
    class Interrupting(ScriptedPolicy):
        def propose(self, ctx):
            if ctx.turn == 3 and not getattr(self, "interrupted", False):
                self.interrupted = True
                raise KeyboardInterrupt
            return super().propose(ctx)

    policy = Interrupting([f"kernel {n}" for n in range(1, 6)])
    run_id = store.create_run(target_name="fake", policy="scripted")
    checkpoints = Path(f"{store.path}.checkpoints")
    with pytest.raises(KeyboardInterrupt):
        run_loop(make_loop(store, run_id, policy, max_attempts=5), checkpoints)
    assert store.get_run(run_id)["status"] == "stopped" and len(store.attempts(run_id)) == 2
    assert run_loop(make_loop(store, run_id, policy, max_attempts=5), checkpoints) == "finished"
    assert [a.number for a in store.attempts(run_id)] == [1, 2, 3, 4, 5]


def test_an_error_raised_while_ctrl_c_unwinds_the_graph_stops_the_run_as_ctrl_c_does(store):
    """LangGraph's runner, shut down by the interrupt, may raise its own error for a task that finished meanwhile:
    that is still Ctrl-C (the run is resumable), not a failure."""
    class Interrupting(ScriptedPolicy):
        def propose(self, ctx):
            if ctx.turn == 2:
                try:
                    raise KeyboardInterrupt
                except KeyboardInterrupt:
                    raise RuntimeError("cannot schedule new futures after shutdown")
            return super().propose(ctx)

    run_id = store.create_run(target_name="fake", policy="scripted")
    with pytest.raises(KeyboardInterrupt):
        run_loop(make_loop(store, run_id, Interrupting(["kernel 1"]), max_attempts=3),
                 Path(f"{store.path}.checkpoints"))
    assert store.get_run(run_id)["status"] == "stopped"


def test_an_error_of_its_own_still_fails_the_run(store):
    class Broken(ScriptedPolicy):
        def propose(self, ctx):
            raise RuntimeError("the policy broke")

    run_id = store.create_run(target_name="fake", policy="scripted")
    with pytest.raises(RuntimeError, match="the policy broke"):
        run_loop(make_loop(store, run_id, Broken([]), max_attempts=3), Path(f"{store.path}.checkpoints"))
    assert store.get_run(run_id)["status"] == "failed"


def _spawn(db_path, run_id, delay, max_attempts):
    code = f"import test_loop; test_loop.run_fake_loop({str(db_path)!r}, {run_id!r}, {delay}, {max_attempts})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)


def _wait_for_attempts(store, run_id, count, process, timeout=60):
    deadline = time.monotonic() + timeout
    while len(store.attempts(run_id)) < count:
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the loop logged too few attempts in time"
        time.sleep(0.02)


@pytest.mark.parametrize("sig, status", [(signal.SIGKILL, "running"), (signal.SIGINT, "stopped")])
def test_killed_mid_run_then_resumed_has_no_gaps_or_duplicates(store, sig, status):
    run_id = store.create_run(target_name="fake", policy="scripted")
    process = _spawn(store.path, run_id, delay=0.05, max_attempts=8)
    _wait_for_attempts(store, run_id, 2, process)
    time.sleep(0.07)  # land inside the next attempt's stages
    process.send_signal(sig)
    process.wait(timeout=30)
    assert store.get_run(run_id)["status"] == status  # kill -9 leaves no chance to record anything
    done_before = len(store.attempts(run_id))
    assert 2 <= done_before < 8

    resumed = _spawn(store.path, run_id, delay=0.0, max_attempts=8)
    assert resumed.wait(timeout=60) == 0, resumed.stderr.read().decode()[-2000:]
    attempts = store.attempts(run_id)
    assert [a.number for a in attempts] == list(range(1, 9))
    assert [a.source for a in attempts[:done_before]] == [f"kernel {n}" for n in range(1, done_before + 1)]
    assert store.get_run(run_id)["status"] == "finished"


# -- the command line ----------------------------------------------------------------------------------------------
@pytest.fixture
def cli():
    from typer.testing import CliRunner

    from agent.cli import app

    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.slow
def test_optimize_vector_add_end_to_end_on_cpu(cli, tmp_path):
    db = tmp_path / "kloop.db"
    done = cli("optimize", "vector_add", "--policy", "offline", "--max-attempts", 4, "--db", db)
    assert done.exit_code == 0, done.output
    assert "no timing is real" in done.output and "best verified kernel" in done.output
    store = open_db(db, create=False)
    (run,) = store.list_runs()
    attempts = store.attempts(run["id"])
    assert [a.number for a in attempts] == [1, 2, 3, 4]
    assert all(a.verdict in ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected")
               for a in attempts)
    assert attempts[0].verdict == "correct" and attempts[0].result.executed_on == "cpu-interpreter"
    assert run["status"] == "finished" and run["settings"]["max_attempts"] == 4
    assert "seed" not in {k for k, v in run["settings"].items() if v is not None and k != "seed_kernel"}
    assert list(tmp_path.glob(f"{run['id']}_best_*.py"))

    shown = cli("show", run["id"], "--json", "--db", db)
    assert [a["number"] for a in json.loads(shown.output)["attempts"]] == [1, 2, 3, 4]
    listed = cli("runs", "--db", db).output
    assert run["id"] in listed and "leaderboard" in listed and "vector_add" in listed.split("leaderboard")[1]
    again = cli("resume", run["id"], "--db", db)
    assert again.exit_code == 0 and "already finished" in again.output


def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("tools.records.store.LOCK_TIMEOUT_S", 0.1)
    db = tmp_path / "kloop.db"
    unknown = cli("optimize", "no_such_op", "--db", db)
    assert unknown.exit_code == 2 and "unknown target 'no_such_op'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and not db.exists()

    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x @ x\n"
                      "def get_inputs():\n    return [torch.randn(3, 4)]\ndef get_init_inputs():\n    return []\n")
    failing = cli("optimize", broken, "--policy", "offline", "--db", db)
    assert failing.exit_code == 2 and "the reference fails" in failing.stderr and not db.exists()

    identity = tmp_path / "identity.py"   # Inductor makes no kernel of it: the offline policy has no starter
    identity.write_text(broken.read_text().replace("x @ x", "x"))
    no_starter = cli("optimize", identity, "--policy", "offline", "--db", db)
    assert no_starter.exit_code == 2 and "no offline starter for identity" in no_starter.stderr
    assert "--seed-kernel FILE" in no_starter.stderr and len(no_starter.stderr.strip().splitlines()) == 1

    store = open_db(db)
    assert store.list_runs() == []  # nothing half-made by the refusals above
    for command in (("show", "nope"), ("resume", "nope")):
        missing = cli(*command, "--db", db)
        assert missing.exit_code == 2 and f"no run nope in {db}" in missing.stderr
    assert cli("optimize", "vector_add", "--policy", "psychic", "--db", db).exit_code == 2
    for misplaced in (("--thinking", "off"), ("--effort", "high"), ("--max-retries", 1), ("--no-tools",)):
        refused = cli("optimize", "vector_add", "--policy", "offline", *misplaced, "--db", db)
        assert refused.exit_code == 2 and "setting" in refused.stderr and "--policy" in refused.stderr

    run_id = store.create_run(target_name="vector_add", policy="offline", settings={"target": "vector_add"})
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write
    try:
        locked = cli("resume", run_id, "--db", db)
        listed = cli("runs", "--db", db)  # readers open read-only and never wait for the writer
        shown = cli("show", run_id, "--json", "--db", db)
    finally:
        holder.execute("ROLLBACK")
    assert locked.exit_code == 2 and "locked by another process" in locked.stderr
    assert listed.exit_code == 0 and run_id in listed.output
    assert shown.exit_code == 0 and json.loads(shown.output)["run"]["id"] == run_id


@pytest.mark.gpu
def test_optimize_on_a_gpu_records_timings_and_speedups(cli, tmp_path):
    db = tmp_path / "kloop.db"
    done = cli("optimize", "vector_add", "--policy", "offline", "--language", "triton", "--max-attempts", 3,
               "--db", db)
    assert done.exit_code == 0, done.output
    assert "over torch.compile" in done.output and "no timing is real" not in done.output
    store = open_db(db, create=False)
    (run,) = store.list_runs()
    best = store.best_attempt(run["id"])
    assert best.result.executed_on == "cuda" and best.speedup_eager > 0 and best.sol_fraction > 0
    assert run["gpu_name"] and run["baselines"]["eager"]["median"] > 0
    assert best.result.ptx and "registers" in best.diagnosis
