"""The evaluation pipeline (sandbox/pipeline.py) and the pipelined loop.

Planning overlaps a (fake, slow) device stage while each device takes one candidate at a time; a lost device costs
only its candidate; attempts in flight are logged in the order they were proposed, with the parent they were
proposed from, and survive kill -9 and resume; a would-be best timed beside an older best is paired again. Then the
real evaluator on CPU (jailed planners beside the interpreter device), and Ray on a local multi-node cluster with a
node killed mid-evaluation.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.graph import Loop, LoopSettings, run_loop
from agent.policy import Message, Proposal
from sandbox.pipeline import DeviceLost, Pipeline
from tools.result import EvalResult, Roofline, Timing, VsBest
from tools.records.store import open_db

REPO = Path(__file__).resolve().parents[1]


class FakeDevice:
    def __init__(self, name: str, lose_first: bool = False):
        self.name, self.lose_first = name, lose_first


class FakeSession:
    """What Pipeline needs of a session: planner count, devices, and (optionally) a replacement for a lost one."""

    def __init__(self, planners=2, devices=1, lose_first=False):
        self.planners = planners
        self.devices = [FakeDevice(f"d{i}", lose_first and i == 0) for i in range(devices)]
        self.lost = []

    def device_lost(self, device):
        self.lost.append(device.name)
        return None

    def planning_memory(self):
        return None


class SlowEvaluation:
    """The evaluation interface the pipeline drives, with sleeps for its plan and device stages. 'broken' sources fail
    to compile; the number at the end of a source is its speedup. `log` gets (what, source, device, time)."""

    def __init__(self, source: str, log: list, plan_s: float = 0.2, device_s: float = 0.1):
        self.source, self.log, self.plan_s, self.device_s = source, log, plan_s, device_s
        self.result = EvalResult(language="triton")
        self.planner = None
        self.device = None
        self.closed = 0
        self.rejudged = []
        self.best_number = lambda: None   # the fake device's standing best, for versus_standing_best

    def note(self, what, device=None):
        self.log.append((what, self.source, device, time.perf_counter()))

    def plan(self):
        self.note("plan_start")
        time.sleep(self.plan_s)
        if "broken" in self.source:
            self.result.verdict, self.result.reasons = "compile_error", ["line 3: expected ':'"]
        self.note("plan_end")

    def bind(self, device):
        self.device = device

    def load(self):
        if self.device.lose_first:
            self.device.lose_first = False
            raise DeviceLost(f"{self.device.name} went away")
        self.note("device_start", self.device.name)
        time.sleep(self.device_s)

    def verify(self):
        self.result.verdict = "correct"

    def profile(self):
        speedup = float(self.source.split()[-1])
        self.result.speedup = {"eager": speedup, "compile": speedup / 2}
        self.result.time_us = Timing(median=10 / speedup)
        self.result.roofline = Roofline(bytes=1, flops=0, bound="memory", sol_fraction=speedup / 100)
        self.note("device_end", self.device.name)

    def release_device(self):
        pass

    def versus_standing_best(self, device):
        self.note("rejudge", device.name)
        self.rejudged.append(self.best_number())
        self.result.vs_best = VsBest(best_attempt=self.best_number(), ratio=1.5, ci_low=1.4, ci_high=1.6, n=30,
                                     outcome="faster")

    def adopt_as_best(self, number):
        pass

    def close(self):
        self.closed += 1
        return self.result


def intervals(log, start, end):
    """{source: (start time, end time, device)} of one kind of stage."""
    begun = {s: (t, d) for what, s, d, t in log if what == start}
    return {s: (begun[s][0], t, begun[s][1]) for what, s, d, t in log if what == end and s in begun}


def submit_all(pipeline, sources, log, **kwargs):
    jobs = [pipeline.submit(SlowEvaluation(s, log, **kwargs)) for s in sources]
    for job in jobs:
        job.assemble(), job.verify(), job.profile()
    return jobs


# -- the pipeline alone ---------------------------------------------------------------------------------------------
def test_planning_overlaps_the_device_stage_which_takes_one_candidate_at_a_time():
    log = []
    pipeline = Pipeline(FakeSession(planners=3, devices=1))
    sources = [f"kernel {n}" for n in range(1, 7)]
    jobs = submit_all(pipeline, sources, log)
    pipeline.close()
    plans, device = intervals(log, "plan_start", "plan_end"), intervals(log, "device_start", "device_end")
    assert all(j.result.verdict == "correct" for j in jobs)
    # One at a time on the device; the lowest submission number among the planned ones goes next (under load, kernel
    # 1's plan may end after kernel 2's). A plan counts as ready 20 ms after its end is noted: it is queued just after.
    order = sorted(device, key=lambda s: device[s][0])
    assert sorted(order) == sorted(sources)
    for a, b in zip(order, order[1:]):
        assert device[a][1] <= device[b][0]
    for i, source in enumerate(order):
        ready = [s for s in sources if s not in order[:i] and plans[s][1] + 0.02 <= device[source][0]] or [source]
        assert source == min(ready, key=sources.index), (source, ready)
    # Candidates were planned while another was on the device: kernel 4 plans while kernel 1 is timed.
    assert plans["kernel 4"][0] < device["kernel 1"][1] and device["kernel 1"][0] < plans["kernel 4"][1]
    overlapping = [(p, d) for p in plans for d in device if p != d and
                   plans[p][0] < device[d][1] and device[d][0] < plans[p][1]]
    assert len(overlapping) >= 3
    # Three planners: the first three planned at once.
    assert max(plans[s][0] for s in sources[:3]) < min(plans[s][1] for s in sources[:3])


def test_two_devices_share_one_queue_in_submission_order():
    log = []
    pipeline = Pipeline(FakeSession(planners=4, devices=2))
    sources = [f"kernel {n}" for n in range(1, 9)]
    submit_all(pipeline, sources, log, plan_s=0.05, device_s=0.15)
    pipeline.close()
    device = intervals(log, "device_start", "device_end")
    assert {d for _, _, d in device.values()} == {"d0", "d1"}
    for name in ("d0", "d1"):  # each device: one candidate at a time
        mine = sorted((t0, t1) for t0, t1, d in device.values() if d == name)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))
    # A free device takes the lowest submission number among the planned ones (not a later-planned earlier number:
    # under load, kernel 2's plan may end after kernel 3's). A plan counts as ready 20 ms after its end is noted: it
    # is queued just after that.
    plans = intervals(log, "plan_start", "plan_end")
    started = set()
    for source in sorted(device, key=lambda s: device[s][0]):
        ready = [s for s in sources if s not in started and plans[s][1] + 0.02 <= device[source][0]] or [source]
        assert source == min(ready, key=sources.index), (source, ready)
        started.add(source)
    assert len(started) == len(sources)


def test_the_device_takes_the_next_candidate_while_the_last_ones_sass_is_collected():
    # Joining a candidate's SASS disassembly (CPU work, a fifth of its overhead on an H100) held the device thread;
    # the result is still complete (SASS in it) when the job is done.
    class WithSass(SlowEvaluation):
        def collect_sass(self):
            self.note("sass_start")
            time.sleep(0.3)
            self.result.sass = {"k": "listing"}
            self.note("sass_end")

    log = []
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    jobs = [pipeline.submit(WithSass(f"kernel {n}", log, plan_s=0.05, device_s=0.05)) for n in (1, 2)]
    for job in jobs:
        job.profile()
        assert job.done() and job.result.sass == {"k": "listing"}
    pipeline.close()
    sass, device = intervals(log, "sass_start", "sass_end"), intervals(log, "device_start", "device_end")
    assert device["kernel 2"][0] < sass["kernel 1"][1]


def test_a_failed_plan_finishes_without_waiting_for_a_device():
    log = []
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    slow = pipeline.submit(SlowEvaluation("kernel 1", log, plan_s=0.0, device_s=1.0))
    broken = pipeline.submit(SlowEvaluation("broken kernel 1", log, plan_s=0.0))
    assert broken.assemble().verdict == "compile_error" and broken.profile().verdict == "compile_error"
    assert not slow.done()  # still on the device
    slow.profile()
    pipeline.close()
    assert "device" not in broken.result.durations_s
    assert not [entry for entry in log if entry[1] == "broken kernel 1" and entry[0] == "device_start"]


def test_a_lost_device_costs_only_the_candidate_it_held():
    log = []
    session = FakeSession(planners=2, devices=2, lose_first=True)
    pipeline = Pipeline(session)
    jobs = submit_all(pipeline, ["kernel 1", "kernel 2", "kernel 3"], log, plan_s=0.0, device_s=0.05)
    pipeline.close()
    assert session.lost == ["d0"] and pipeline.lost == 1
    assert all(j.result.verdict == "correct" for j in jobs)
    device = intervals(log, "device_start", "device_end")
    assert {d for _, _, d in device.values()} == {"d1"}  # the lost device's thread ended
    assert sum(any(f.startswith("device_lost") for f in j.result.flags) for j in jobs) == 1


def test_a_rejudgement_goes_before_waiting_candidates():
    log = []
    pipeline = Pipeline(FakeSession(planners=4, devices=1))
    first = pipeline.submit(SlowEvaluation("kernel 1", log, plan_s=0.0, device_s=0.2))
    first.profile()
    later = [pipeline.submit(SlowEvaluation(f"kernel {n}", log, plan_s=0.0, device_s=0.5)) for n in (2, 3, 4)]
    deadline = time.monotonic() + 30
    while sum(e[0] == "device_start" for e in log) < 2:  # one of them is on the device (the first planned), two wait
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first.evaluation.best_number = lambda: 7
    first.rejudge()
    for job in later:
        job.profile()
    pipeline.close()
    assert first.result.vs_best.best_attempt == 7
    events = [what for what, _, _, _ in log if what in ("rejudge", "device_start")]
    assert events == ["device_start", "device_start", "rejudge", "device_start", "device_start"]


def test_close_drops_what_waits_and_closes_each_evaluation_once():
    log = []
    pipeline = Pipeline(FakeSession(planners=1, devices=1))
    jobs = [pipeline.submit(SlowEvaluation(f"kernel {n}", log, plan_s=0.05, device_s=0.05)) for n in range(1, 6)]
    jobs[0].profile()
    for job in jobs:
        job.close()
    pipeline.close()
    for job in jobs:
        job.profile()  # nothing waits forever
        assert job.evaluation.closed == 1
    assert len([e for e in log if e[0] == "device_start"]) < 5


def test_interrupt_stops_every_wait_in_other_threads_at_once():
    # Ctrl-C for a suite's lanes: a lane waits on its candidate's stage, not in the main thread
    log, raised = [], []
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    slow = pipeline.submit(SlowEvaluation("kernel 1", log, plan_s=0.0, device_s=30))
    queued = pipeline.submit(SlowEvaluation("kernel 2", log, plan_s=0.0, device_s=30))

    def wait(job):
        try:
            job.profile()
        except KeyboardInterrupt:
            raised.append((job.evaluation.source, time.monotonic()))

    waiters = [threading.Thread(target=wait, args=(job,)) for job in (slow, queued)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.3)
    asked = time.monotonic()
    pipeline.interrupt()
    for waiter in waiters:
        waiter.join(5)
    assert sorted(source for source, _ in raised) == ["kernel 1", "kernel 2"]
    assert max(t for _, t in raised) - asked < 1.0      # not after the 30 s device stage
    with pytest.raises(KeyboardInterrupt):
        pipeline.submit(SlowEvaluation("kernel 3", log))
    with pytest.raises(KeyboardInterrupt):
        slow.verify()                                    # later waits too: no partial result is handed back


# -- the pipelined loop ---------------------------------------------------------------------------------------------
class ScriptedPolicy:
    """Proposes script[turn - 1] and records each context (with when it was asked)."""
    name, model = "scripted", "none"

    def __init__(self, script):
        self.script, self.contexts = list(script), []

    def propose(self, ctx):
        self.contexts.append((ctx, time.perf_counter()))
        source = self.script[ctx.turn - 1] if ctx.turn <= len(self.script) else "kernel 1"
        return Proposal("triton", source, f"turn {ctx.turn}", [Message(role="response", content={"turn": ctx.turn})])

    def reflect(self, ctx, attempt):
        return "", []


def pipelined_loop(store, run_id, policy, log, pipeline, depth=3, **settings):
    return Loop(store=store, run_id=run_id, policy=policy,
                evaluation=lambda source: pipeline.submit(SlowEvaluation(source, log, plan_s=0.1, device_s=0.05)),
                settings=LoopSettings(pipeline=depth, **settings), target_name="fake",
                target_source="class Model: ...")


@pytest.fixture
def store(tmp_path):
    db = open_db(tmp_path / "kloop.db")
    yield db
    db.close()


def test_pipelined_attempts_are_logged_in_proposal_order_with_their_lineage(store):
    log, events = [], []
    policy = ScriptedPolicy([f"kernel {n}" for n in (2, 1, 5, 3, 4, 6)])
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    run_id = store.create_run(target_name="fake", policy="scripted")
    on_event = lambda e: events.append((e, time.perf_counter()))  # noqa: E731
    status = run_loop(pipelined_loop(store, run_id, policy, log, pipeline, max_attempts=6),
                      Path(f"{store.path}.checkpoints"), on_event)
    pipeline.close()
    assert status == "finished"
    attempts = store.attempts(run_id)
    assert [(a.number, a.turn, a.source) for a in attempts] == [
        (n, n, f"kernel {s}") for n, s in enumerate((2, 1, 5, 3, 4, 6), start=1)]
    # Three proposals before anything was logged, each from the same (empty) state: no parent.
    first_three = [ctx for ctx, _ in policy.contexts[:3]]
    assert [c.turn for c in first_three] == [1, 2, 3] and all(not c.history for c in first_three)
    assert [a.parent_attempt_id for a in attempts[:3]] == [None, None, None]
    # Turn 4 was proposed once attempt 1 (the best then) was logged, and says so; turn 5 after attempt 2.
    by_number = {a.number: a.id for a in attempts}
    assert attempts[3].parent_attempt_id == by_number[1] and attempts[4].parent_attempt_id == by_number[1]
    assert attempts[5].parent_attempt_id == by_number[3]  # kernel 5 became the best at attempt 3
    # The next candidates were being evaluated before attempt 1 was logged.
    logged_first = next(t for e, t in events if e["kind"] == "attempt" and e["number"] == 1)
    assert next(t for what, s, _, t in log if what == "plan_start" and s == "kernel 1") < logged_first
    assert next(t for what, s, _, t in log if what == "device_start" and s == "kernel 5") < logged_first + 10
    assert sum(1 for what, *_ in log if what == "plan_start") == 6
    # Active time counts each stretch of wall clock once, however many attempts overlapped it.
    walls = [a.durations["wall"] for a in attempts]
    spans = [a.durations["attempt"] for a in attempts]
    assert sum(walls) < sum(spans) and store.progress(run_id)["seconds"] == pytest.approx(sum(walls))


def test_a_policy_that_waits_lets_the_attempts_in_flight_be_logged(store):
    # The offline policy waits (Proposal.wait) while the PTX twin of its anchor compiles: the loop logs what is in
    # flight meanwhile and asks again after each log; the turn is proposed again, so numbers have no gaps.
    class Waits(ScriptedPolicy):
        def propose(self, ctx):
            if ctx.turn == 3 and ctx.in_flight and len(self.contexts) < 6:
                self.contexts.append((ctx, time.perf_counter()))
                return Proposal("ptx", "", "compiling", wait=True)
            return super().propose(ctx)

    log = []
    policy = Waits([f"kernel {n}" for n in (1, 2, 3, 4)])
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    run_id = store.create_run(target_name="fake", policy="scripted")
    status = run_loop(pipelined_loop(store, run_id, policy, log, pipeline, depth=3, max_attempts=4),
                      Path(f"{store.path}.checkpoints"))
    pipeline.close()
    assert status == "finished"
    assert [(a.number, a.turn, a.source) for a in store.attempts(run_id)] == [
        (n, n, f"kernel {n}") for n in (1, 2, 3, 4)]
    waited = [ctx for ctx, _ in policy.contexts if ctx.turn == 3]
    assert len(waited) >= 2 and waited[0].in_flight == 2   # asked with two in flight, then again after a log
    assert len(waited[1].history) > len(waited[0].history)


def test_an_interrupted_pipeline_stops_its_loop_with_nothing_half_done_logged(store):
    log = []
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    run_id = store.create_run(target_name="fake", policy="scripted")
    def slow_second(source):
        return pipeline.submit(SlowEvaluation(source, log, plan_s=0.0, device_s=0.05 if source == "kernel 1" else 30))

    loop = Loop(store=store, run_id=run_id, policy=ScriptedPolicy(["kernel 1", "kernel 2"]), evaluation=slow_second,
                settings=LoopSettings(pipeline=1, max_attempts=2), target_name="fake", target_source="class Model: ...")
    outcome = []

    def run():
        try:
            outcome.append(run_loop(loop, Path(f"{store.path}.checkpoints")))
        except KeyboardInterrupt:
            outcome.append("interrupted")

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(what == "device_start" and source == "kernel 2" for what, source, *_ in log):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pipeline.interrupt()
    thread.join(10)
    pipeline.close()
    assert outcome == ["interrupted"] and store.get_run(run_id)["status"] == "stopped"
    assert [a.source for a in store.attempts(run_id)] == ["kernel 1"]   # the one in flight is not logged


def test_a_would_be_best_timed_beside_an_older_best_is_paired_again(store):
    log, made = [], {}
    policy = ScriptedPolicy(["kernel 2", "kernel 3", "kernel 1"])
    pipeline = Pipeline(FakeSession(planners=3, devices=1))
    run_id = store.create_run(target_name="fake", policy="scripted")
    loop = pipelined_loop(store, run_id, policy, log, pipeline, max_attempts=3)
    submit = loop.evaluation

    def evaluation(source):
        job = submit(source)
        job.evaluation.best_number = lambda: store.progress(run_id)["best_number"]  # the fake device's best
        made[source] = job.evaluation
        return job

    loop.evaluation = evaluation
    run_loop(loop, Path(f"{store.path}.checkpoints"))
    pipeline.close()
    attempts = store.attempts(run_id)
    # All three were profiled before any was logged, so none was timed beside a standing best.
    assert made["kernel 3"].rejudged == [1]     # paired again, against attempt 1, when it was logged
    assert made["kernel 1"].rejudged == []       # slower than the best: nothing to pair
    assert store.get_run(run_id)["best_attempt_id"] == attempts[1].id
    assert attempts[1].result.vs_best.best_attempt == 1
    assert "new_best_unpaired" not in attempts[1].result.flags


def run_pipelined(db_path: str, run_id: str, max_attempts: int, plan_s: float) -> None:
    """Entry point for the kill -9 test: a pipelined scripted run, resumable by calling it again."""
    store = open_db(db_path)
    pipeline = Pipeline(FakeSession(planners=2, devices=1))
    log = []
    loop = Loop(store=store, run_id=run_id, policy=ScriptedPolicy([f"kernel {n}" for n in range(1, 20)]),
                evaluation=lambda s: pipeline.submit(SlowEvaluation(s, log, plan_s=plan_s, device_s=plan_s / 2)),
                settings=LoopSettings(pipeline=3, max_attempts=max_attempts), target_name="fake",
                target_source="class Model: ...")
    try:
        run_loop(loop, Path(db_path + ".checkpoints"))
    finally:
        pipeline.close()


def _spawn(db_path, run_id, max_attempts, plan_s):
    code = f"import test_pipeline; test_pipeline.run_pipelined({str(db_path)!r}, {run_id!r}, {max_attempts}, {plan_s})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"),
                                                                     os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)


def test_a_pipelined_run_killed_mid_flight_resumes_without_gaps_or_duplicates(store):
    run_id = store.create_run(target_name="fake", policy="scripted")
    process = _spawn(store.path, run_id, 9, 0.15)
    deadline = time.monotonic() + 60
    while len(store.attempts(run_id)) < 3:
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # with attempts in flight behind the logged ones
    process.wait(timeout=30)
    done_before = len(store.attempts(run_id))
    assert 3 <= done_before < 9
    resumed = _spawn(store.path, run_id, 9, 0.0)
    assert resumed.wait(timeout=120) == 0, resumed.stderr.read().decode()[-2000:]
    attempts = store.attempts(run_id)
    assert [a.number for a in attempts] == list(range(1, 10))
    assert [a.turn for a in attempts] == list(range(1, 10))
    assert [a.source for a in attempts] == [f"kernel {n}" for n in range(1, 10)]
    assert store.get_run(run_id)["status"] == "finished"


# -- the real evaluator, on CPU --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_real_session_plans_while_its_device_evaluates():
    from sandbox.evaluate import Session
    from tools.target import load_target

    target = load_target("vector_add")
    source = (REPO / "agent/kernels/vector_add/triton_block.py").read_text()
    sources = [source, source.replace("tl.load", "tl.lod", 1), source.replace("BLOCK_SIZE", "BLOCK_ELEMS")]
    with Session(spares=3, planners=2) as session:
        session.start()
        jobs = [session.submit(target, s) for s in sources]
        for job in jobs:
            job.assemble(), job.verify(), job.profile()
        results = [job.result for job in jobs]
        times = [job.times for job in jobs]
        for job in jobs:
            job.close()
    assert [r.verdict for r in results] == ["correct", "rejected", "correct"]
    assert results[0].executed_on == "cpu-interpreter" and results[0].durations_s["device"] == "cpu"
    assert "device" not in results[1].durations_s   # refused by the rules: never on the device
    # The third candidate was planned (two planners) before the first was done on the device ...
    assert times[2]["plan_start"] < times[0]["device_end"]
    # ... and the device took one at a time (whichever was planned first).
    first, second = sorted((times[0], times[2]), key=lambda t: t["device_start"])
    assert first["device_end"] <= second["device_start"]
    assert {"plan", "load", "verify", "profile", "busy", "queued"} <= set(results[2].durations_s)
    # Each wait is counted: every trial is one replay by the executor and one check by the referee.
    durations = results[0].durations_s
    assert set(durations["calls"]) == set(durations["waited"])
    assert durations["calls"]["executor:round"] == durations["calls"]["referee:check"] == results[0].correctness.trials


# -- Ray, a local cluster of several nodes ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_run_loses_only_the_evaluation_of_a_node_killed_mid_run(tmp_path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from agent import run as runs
    from sandbox.ray_backend import RaySession

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1, resources={"kloop_device": 1}) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    killed = {}
    try:
        session = RaySession(init=False)
        assert len(session.devices) == 2
        store = open_db(tmp_path / "kloop.db")
        run = runs.start(store, "offline", runs.settings_for("vector_add", max_attempts=6, pipeline=3,
                                                             ray=cluster.address))

        where = {d.name: ray.get(d.actor.where.remote())["node"] for d in session.devices}
        original = session._pipeline._run

        def run_and_maybe_kill(device, job):
            # Once one attempt is logged, this device's node dies 0.3 s into its next candidate (or, were that one
            # done sooner, the next one it takes fails at once): either way a candidate in flight is lost.
            if not killed and store.attempts(run.id):
                node = next(n for n in nodes if n.node_id == where[device.name])
                killed["device"] = device.name
                threading.Timer(0.3, cluster.remove_node, args=(node,)).start()
            return original(device, job)

        session._pipeline._run = run_and_maybe_kill
        best = runs.run(run, session=session)
        attempts = store.attempts(run.id)
        lost = session._pipeline.lost
        survivors = [d.name for d in session.devices]
        session.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert killed and lost >= 1
    assert [a.number for a in attempts] == [1, 2, 3, 4, 5, 6]
    assert all(a.verdict in ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected")
               for a in attempts)
    assert sum(any(f.startswith("device_lost") for f in (a.result.flags or [])) for a in attempts) >= 1
    assert killed["device"] not in survivors and len(survivors) == 1
    assert best is not None and best.verdict == "correct"


# -- quiet GPUs: jailed processes stopped while a kernel is timed ------------------------------------------------------
def test_quiet_stops_every_listed_process_and_its_children_and_then_continues_them(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sandbox import pool
    from sandbox.process import descendants

    monkeypatch.setenv("KLOOP_SCRATCH", str(tmp_path))
    state = lambda pid: pool._state(pid)  # noqa: E731
    spawn = lambda: SimpleNamespace(proc=subprocess.Popen(["sh", "-c", "sleep 60 & wait"]))  # noqa: E731
    planner, other_gpu = spawn(), spawn()
    try:
        time.sleep(0.2)
        pool.register(planner, "GPU-aaaa")
        pool.register(other_gpu, "GPU-bbbb")
        inner = descendants(planner.proc.pid)
        assert inner and state(planner.proc.pid) != "T"
        with pool.quiet("GPU-aaaa"):
            time.sleep(0.1)
            assert state(planner.proc.pid) == "T" and all(state(p) == "T" for p in inner)
            assert state(other_gpu.proc.pid) != "T"          # another GPU's processes run on
            late = spawn()                                   # started while the GPU is timed on: stops itself
            time.sleep(0.2)
            pool.register(late, "GPU-aaaa")
            time.sleep(0.1)
            assert state(late.proc.pid) == "T"
        time.sleep(0.1)
        assert all(state(p) != "T" for p in [planner.proc.pid, *inner, late.proc.pid])
        # A pauser killed mid-pause leaves its marker: the next acquire's heal() continues the processes.
        dead = subprocess.Popen(["true"])
        dead.wait()
        (pool._directory("GPU-aaaa") / f"paused-{dead.pid}-1").write_text("0")
        pool._signal([planner.proc.pid], signal.SIGSTOP)
        time.sleep(0.1)
        pool.heal("GPU-aaaa")
        time.sleep(0.1)
        assert state(planner.proc.pid) != "T" and not list(pool._directory("GPU-aaaa").glob("paused-*"))
    finally:
        for p in (planner, other_gpu, locals().get("late")):
            if p is not None:
                pool._signal([p.proc.pid], signal.SIGKILL)  # the process and the sleep it started
                p.proc.wait()


def _interleave(monkeypatch, pool, when, then):
    """Patch pool._signal: just before the signal `when(pids, signum)` selects goes out, run `then` in a thread and
    give it 0.3 s (a transition not serialized with this one completes in that time)."""
    real_signal = pool._signal
    threads = []

    def signal_later(pids, signum):
        if when(pids, signum) and not threads:
            threads.append(threading.Thread(target=then))
            threads[0].start()
            threads[0].join(0.3)
        real_signal(pids, signum)

    monkeypatch.setattr(pool, "_signal", signal_later)
    return threads


def test_a_process_listed_as_a_pause_ends_is_not_left_stopped(tmp_path, monkeypatch):
    """register() sees the pause marker and the pause ends before register's SIGSTOP lands: the SIGCONT must come
    after it, or nothing ever continues the process."""
    from types import SimpleNamespace

    from sandbox import pool

    monkeypatch.setenv("KLOOP_SCRATCH", str(tmp_path))
    planner = SimpleNamespace(proc=subprocess.Popen(["sleep", "60"]))
    pauser = pool.quiet("GPU-aaaa")
    pauser.__enter__()
    threads = _interleave(monkeypatch, pool, lambda pids, signum: signum == signal.SIGSTOP,
                          lambda: pauser.__exit__(None, None, None))
    try:
        time.sleep(0.1)
        pool.register(planner, "GPU-aaaa")
        threads[0].join(5)
        time.sleep(0.1)
        assert pool._state(planner.proc.pid) != "T"
    finally:
        planner.proc.kill()
        planner.proc.wait()


def test_a_pause_that_ends_does_not_continue_a_pause_that_began_meanwhile(tmp_path, monkeypatch):
    """Two timings on one GPU (two sessions): the first one's end must not continue what the second one stopped, or
    candidate code runs during the second one's timing."""
    from types import SimpleNamespace

    from sandbox import pool

    monkeypatch.setenv("KLOOP_SCRATCH", str(tmp_path))
    planner = SimpleNamespace(proc=subprocess.Popen(["sleep", "60"]))
    first, second = pool.quiet("GPU-aaaa"), pool.quiet("GPU-aaaa")
    try:
        time.sleep(0.1)
        pool.register(planner, "GPU-aaaa")
        first.__enter__()
        threads = _interleave(monkeypatch, pool, lambda pids, signum: signum == signal.SIGCONT, second.__enter__)
        first.__exit__(None, None, None)
        threads[0].join(5)
        time.sleep(0.1)
        assert pool._state(planner.proc.pid) == "T"   # the second timing is on: stopped
        second.__exit__(None, None, None)
        time.sleep(0.1)
        assert pool._state(planner.proc.pid) != "T"
    finally:
        planner.proc.kill()
        planner.proc.wait()


def test_the_memory_gate_lets_plans_hold_no_more_than_the_budget():
    """Planners at KernelBench's full sizes: each plan takes its inputs' and weights' share of the GPU budget before
    it starts."""
    import threading
    import time

    from sandbox.pipeline import PLANNER_GPU_BYTES, MemoryGate

    class Big:  # a target with 4 GiB of inputs, 4 of outputs and 4 of weights: one plan needs 1 + 12 GiB
        class target:
            def io_bytes(small):
                return 8 << 30

            def state_bytes(small):
                return 4 << 30

    gate = MemoryGate(30 << 30)
    need = gate.need(Big())
    assert need == PLANNER_GPU_BYTES + (12 << 30)
    held, peak, lock = [0], [0], threading.Lock()

    def plan():
        gate.take(need)
        with lock:
            held[0] += need
            peak[0] = max(peak[0], held[0])
        time.sleep(0.05)
        with lock:
            held[0] -= need
        gate.give(need)

    threads = [threading.Thread(target=plan) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2 * need and gate.free == gate.budget       # two at a time fit in 30 GiB, never three
    assert MemoryGate(8 << 30).need(Big()) == 8 << 30              # more than the budget: one plan at a time
    assert MemoryGate(None).need(Big()) == 0                       # no GPU, no gate
