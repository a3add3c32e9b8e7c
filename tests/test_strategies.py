"""Search strategies (agent/strategies): each one's parent choice on a constructed archive, deterministic under a
seed; evolve's cells, islands and migration; the loop logging parent, reason, cell and island; a run resumed
mid-strategy continuing exactly as an uninterrupted one. The graph runs with a fake evaluator (no interpreter)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.graph import Loop, LoopSettings, run_loop
from agent.policies.offline import OfflinePolicy
from agent.policy import AttemptView, Message, Proposal, ProposeContext
from agent.strategies import (STRATEGIES, Archive, cell_of, choose, descriptors, efficiency, make_strategy, rng_for,
                              weights)
from agent.strategies.evolve import build_islands, island_of
from tools.result import EvalResult, Resources, Roofline, Timing
from tools.records.store import offline_marker as read_marker
from tools.records.store import Attempt, open_db


# -- a constructed archive ---------------------------------------------------------------------------------------
def row(number, verdict="correct", speedup=None, branch=0, island=None, bound=None, sol=None, occupancy=None,
        language="triton", template="t/block", parent=None):
    result = EvalResult(verdict=verdict, language=language, executed_on="cuda" if speedup else "cpu-interpreter")
    if bound:
        result.roofline = Roofline(bound=bound, sol_fraction=sol)
    if occupancy is not None:
        result.resources = [Resources(kernel="k", source="triton", registers=40, occupancy=occupancy)]
    source = f'# kloop-offline: {{"template": "{template}", "values": {{"BLOCK": 256, "num_warps": 4}}}}\nx = {number}'
    return Attempt.from_row({"id": 100 + number, "run_id": "r", "number": number, "branch": branch, "verdict": verdict,
                             "speedup_eager": speedup, "sol_fraction": sol, "language": language, "source": source,
                             "result": result.to_dict(), "island": island, "parent_attempt_id": parent})


ROWS = [row(1, "incorrect"), row(2, speedup=1.0, bound="memory", sol=0.3, occupancy=0.5),
        row(3, speedup=2.0, bound="memory", sol=0.6, occupancy=0.5),
        row(4, speedup=4.0, bound="memory", sol=0.8, occupancy=1.0, parent=102), row(5, "compile_error")]


def pick(name, rows=ROWS, best=104, seed=0, branch=0, turn=1, **kw):
    return make_strategy(name).pick(Archive(rows, best, **kw), rng_for(seed, branch, turn), branch, turn)


def test_refine_builds_on_the_best_and_shows_the_whole_history():
    p = pick("refine")
    assert p.attempt.number == 4 and p.shown is None and p.show_best and not p.show_parent
    assert p.reason == "refine: the run's best, attempt #4"
    assert pick("refine", rows=ROWS[:1], best=None).attempt is None


def test_best_of_n_samples_from_the_starting_point_and_sees_no_siblings():
    p = pick("best-of-n")
    assert p.attempt.number == 2 and [r.number for r in p.shown] == [2] and not p.show_best
    empty = pick("best-of-n", rows=ROWS[:1], best=None)
    assert empty.attempt is None and empty.shown == [] and "target alone" in empty.reason


def test_metr_draws_parents_by_efficiency_squared_deterministically():
    verified = [r for r in ROWS if r.verdict == "correct"]
    assert weights(verified) == pytest.approx([1 / 21, 4 / 21, 16 / 21])
    assert [efficiency(r) for r in verified] == [1.0, 2.0, 4.0]
    assert efficiency(row(1, sol=0.25)) == 2.5 and efficiency(row(1)) == 1.0
    draws = [pick("metr", seed=s).attempt.number for s in range(400)]
    assert [pick("metr", seed=s).attempt.number for s in range(400)] == draws  # same seed, same parent
    share = {n: draws.count(n) / len(draws) for n in (2, 3, 4)}
    assert share[4] == pytest.approx(16 / 21, abs=0.06) and share[2] == pytest.approx(1 / 21, abs=0.04)
    p = pick("metr", seed=3)
    assert p.shown == [p.attempt] and p.show_best and p.reason.startswith(f"metr: sampled attempt #{p.attempt.number}")
    # untimed kernels (CPU interpreter) are drawn uniformly; nothing verified: fix the branch's latest attempt
    untimed = [row(n) for n in (1, 2, 3)]
    assert weights(untimed) == pytest.approx([1 / 3] * 3)
    failed = pick("metr", rows=[row(1, "incorrect"), row(2, "incorrect", branch=1)], best=None)
    assert failed.attempt.number == 1 and "no verified kernel yet" in failed.reason


def test_descriptors_use_what_kloop_measures_and_fall_back_without_a_gpu():
    gpu = ROWS[3]
    assert cell_of(gpu) == "triton|memory|sol75-100|occ75-100|t/block"
    assert cell_of(ROWS[1]) == "triton|memory|sol25-50|occ50-75|t/block"
    assert cell_of(ROWS[0]) is None  # only verified attempts have a cell
    cpu = row(7)  # the CPU interpreter: no roofline, no resources: the template's warps tunable
    assert cell_of(cpu) == "triton|?|sol?|warps4|t/block"
    regs = EvalResult(verdict="correct", resources=[Resources(kernel="k", source="ptxas", registers=90)])
    assert descriptors("ptx", regs, "")["occ"] == "regs<=128" and descriptors("ptx", regs, "")["tmpl"] == "model"


def test_evolve_archive_islands_and_migration():
    rows = [row(1, speedup=1.0, island=0, bound="memory", sol=0.3, occupancy=0.5),
            row(2, speedup=3.0, island=1, bound="memory", sol=0.6, occupancy=0.5),
            row(3, speedup=2.0, island=0, bound="memory", sol=0.3, occupancy=0.5),   # same cell as 1, fitter
            row(4, "incorrect", island=1)]
    before = build_islands(Archive(rows, None, islands=2, migrate_every=8))
    assert {c: r.number for c, r in before[0].items()} == {"triton|memory|sol25-50|occ50-75|t/block": 3}
    assert {c: r.number for c, r in before[1].items()} == {"triton|memory|sol50-75|occ50-75|t/block": 2}
    # after attempt 4 (migrate_every=4) each island's best elite is copied to the next island (a ring)
    after = build_islands(Archive(rows, None, islands=2, migrate_every=4))
    assert sorted(r.number for r in after[0].values()) == [2, 3]
    assert sorted(r.number for r in after[1].values()) == [2, 3]
    assert island_of(Archive(rows), branch=0, turn=1) == 0 and island_of(Archive(rows), branch=1, turn=1) == 1
    assert island_of(Archive(rows), branch=0, turn=2) == 1


class FixedDraw(random.Random):
    def __init__(self, r):
        super().__init__(0)
        self.r = r

    def random(self):
        return self.r


def test_evolve_parent_selection_rule():
    rows = [row(1, speedup=1.0, island=0, bound="memory", sol=0.3, occupancy=0.5),
            row(2, speedup=3.0, island=0, bound="memory", sol=0.6, occupancy=0.5),
            row(3, speedup=2.0, island=0, bound="compute", sol=0.3, occupancy=0.5),
            row(4, speedup=5.0, island=1, bound="compute", sol=0.9, occupancy=0.5)]
    evolve = make_strategy("evolve")
    archive = Archive(rows, None, islands=2, migrate_every=100)
    exploit = evolve.pick(archive, FixedDraw(0.95), branch=0, turn=1)
    assert exploit.attempt.number == 2 and exploit.island == 0 and "exploit: island 0's best elite" in exploit.reason
    assert exploit.cell == "triton|memory|sol50-75|occ50-75|t/block"
    assert [r.number for r in exploit.shown] == [3, 1, 2]  # two inspirations, fittest first, then the parent
    assert "diversity" in evolve.pick(archive, FixedDraw(0.2), 0, 1).reason
    explore = evolve.pick(archive, FixedDraw(0.05), 0, 1)
    assert "explore" in explore.reason and explore.attempt.number in (1, 2, 3, 4)
    assert evolve.pick(archive, FixedDraw(0.95), branch=0, turn=2).attempt.number == 4  # island 1
    # exploit ties (untimed) go to the elite with the fewest children
    untimed = [row(1, island=0, template="a"), row(2, island=0, template="b"), row(3, island=0, template="c", parent=101)]
    assert evolve.pick(Archive(untimed, None), FixedDraw(0.95), 0, 1).attempt.number == 2
    nothing = evolve.pick(Archive([row(1, "incorrect")], None), FixedDraw(0.95), 0, 1)
    assert nothing.attempt.number == 1 and nothing.island == 0 and "no verified kernel yet" in nothing.reason


def test_every_strategy_is_a_deterministic_function_of_the_attempts_and_the_seed():
    for name in STRATEGIES:
        picks = {getattr(pick(name, seed=5, turn=t).attempt, "number", None) for _ in range(3) for t in (3,)}
        assert len(picks) == 1, name
    with pytest.raises(ValueError, match="unknown strategy"):
        make_strategy("greedy")


# -- through the loop ----------------------------------------------------------------------------------------------
class FakeEvaluation:
    """'wrong' sources are incorrect; otherwise the speedup is the source's last number."""

    pipelined = False   # stages in the loop's own thread (sandbox.seam.StagedEvaluation)

    def __init__(self, source):
        self.source, self.result = source, EvalResult(language="triton")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def adopt_as_best(self, number):
        pass

    def rejudge(self):  # its pairing with the best is fixed by its source
        pass

    def assemble(self):
        pass

    def verify(self):
        wrong = "wrong" in self.source
        self.result.verdict = "incorrect" if wrong else "correct"
        self.result.executed_on = "cuda"

    def profile(self):
        speedup = float(self.source.split()[-1])
        self.result.speedup = {"eager": speedup}
        self.result.time_us = Timing(median=10 / speedup)
        self.result.roofline = Roofline(bytes=1, bound="memory" if speedup < 3 else "compute",
                                        sol_fraction=min(speedup / 6, 1.0))


class ParentPolicy:
    """Writes 'from P turn T branch B <speedup>' with a speedup fixed by (parent, turn, branch); records contexts."""
    name, model = "scripted", ""

    def __init__(self):
        self.contexts = []

    def propose(self, ctx: ProposeContext) -> Proposal:
        self.contexts.append(ctx)
        parent = ctx.parent.number if ctx.parent else (ctx.best.number if ctx.best else 0)
        speed = 1 + (parent * 7 + ctx.turn * 3 + ctx.branch) % 5
        wrong = "wrong " if ctx.turn == 2 else ""
        return Proposal("triton", f"{wrong}from {parent} turn {ctx.turn} branch {ctx.branch} {speed}", "",
                        [Message(role="response", content={})])

    def reflect(self, ctx, attempt):
        return "", []


def run(store, strategy, max_attempts, run_id=None, policy=None, restart=False, branches=1, seed=11):
    run_id = run_id or store.create_run(target_name="fake", policy="scripted")
    settings = LoopSettings(max_attempts=max_attempts, patience=100, target_sol=2.0, strategy=strategy,
                            strategy_seed=seed, branches=branches, migrate_every=3)
    loop = Loop(store=store, run_id=run_id, policy=policy or ParentPolicy(), evaluation=FakeEvaluation,
                settings=settings, target_name="fake", target_source="class Model: ...")
    run_loop(loop, Path(f"{store.path}.checkpoints"), restart=restart)
    return run_id


def trace(store, run_id):
    by_id = {a.id: a.number for a in store.attempts(run_id)}
    return [(a.number, by_id.get(a.parent_attempt_id), a.parent_reason, a.archive_cell, a.island,
             a.source) for a in store.attempts(run_id)]


@pytest.fixture
def store(tmp_path):
    db = open_db(tmp_path / "kloop.db")
    yield db
    db.close()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_run_resumed_mid_strategy_continues_identically(store, strategy):
    whole = run(store, strategy, 7)
    part = run(store, strategy, 3)
    run(store, strategy, 7, run_id=part, restart=True)  # a finished run given a bigger budget: `kloop resume`
    assert trace(store, part) == trace(store, whole)
    rows = trace(store, whole)
    assert len(rows) == 7 and all(reason.startswith(strategy.replace("-", "-")) for _, _, reason, *_ in rows)
    # the cell is logged for verified attempts only; islands only under evolve
    assert all((cell is None) == ("wrong" in source) for *_, cell, _, source in rows)
    assert all((island is not None) == (strategy == "evolve") for *_, island, _ in rows)


def test_what_each_strategy_shows_the_next_proposal(store):
    seen = {}
    for strategy in STRATEGIES:
        policy = ParentPolicy()
        run_id = run(store, strategy, 5, policy=policy)
        seen[strategy] = (policy.contexts[-1], store.attempts(run_id))
    ctx, attempts = seen["refine"]
    assert ctx.parent is None and len(ctx.history) == 4 and ctx.best is not None and ctx.strategy == "refine"
    ctx, attempts = seen["best-of-n"]
    assert ctx.parent.number == 1 and [v.number for v in ctx.history] == [1] and ctx.best is None
    assert all(a.parent_attempt_id == attempts[0].id for a in attempts[1:])
    ctx, attempts = seen["metr"]
    assert ctx.parent is not None and [v.number for v in ctx.history] == [ctx.parent.number]
    assert ctx.parent_reason.startswith("metr: sampled attempt")
    ctx, attempts = seen["evolve"]
    assert ctx.parent is not None and ctx.history[-1].number == ctx.parent.number and len(ctx.history) <= 3


def test_strategies_run_with_branches(store):
    run_id = run(store, "evolve", 6, branches=2)
    attempts = store.attempts(run_id)
    assert len(attempts) == 6 and {a.branch for a in attempts} == {0, 1}
    # attempt t of branch b is on island (b + t - 1) mod 2
    assert all(a.island == (a.branch + a.turn - 1) % 2 for a in attempts)


def test_the_loop_reads_the_strategy_from_plain_settings(store):
    from agent.run import loop_search_settings, strategy_settings

    settings = strategy_settings("metr", 5)
    assert settings == {"strategy": "metr", "strategy_seed": 5}
    assert loop_search_settings(settings) == {"strategy": "metr", "strategy_seed": 5, "lessons": ()}
    assert loop_search_settings({}) == {"lessons": ()}  # a run made before strategies: refine
    assert 0 <= strategy_settings()["strategy_seed"] < 2**31
    run_id = store.create_run(target_name="fake", policy="scripted")
    assert choose(store, run_id, LoopSettings(), 0, 1).reason.startswith("refine")


# -- the offline policy builds on the strategy's parent ----------------------------------------------------------------
SEED = '''import torch
import triton
import triton.language as tl

BLOCK_SIZE = 256
NUM_WARPS = 4


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(a_ptr + offsets, mask=mask) + tl.load(b_ptr + offsets, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), BLOCK_SIZE),)](a, b, out, a.numel(), BLOCK_SIZE=BLOCK_SIZE,
                                                          num_warps=NUM_WARPS)
        return out
'''


def test_the_offline_policy_searches_around_the_parent_first(tmp_path):
    path = tmp_path / "add.py"
    path.write_text(SEED)
    policy = OfflinePolicy(seed_kernel=path)
    template = policy.templates[0]

    def view(number, values):
        return AttemptView(id=number, number=number, branch=0, language="triton", source=template.render(values),
                           verdict="correct", reasons=[], time_us=None, speedup_eager=None, speedup_compile=None,
                           sol_fraction=None, diagnosis="", result=EvalResult(verdict="correct"))

    start, other = view(1, {"BLOCK_SIZE": 256, "NUM_WARPS": 4}), view(2, {"BLOCK_SIZE": 1024, "NUM_WARPS": 4})
    ctx = ProposeContext(run_id="r", branch=0, turn=3, target_name="t", target_source="", language="triton", gpu=None,
                         history=[start, other], best=start, strategy="metr", parent=other)
    proposal = policy.propose(ctx)  # the parent (attempt 2) is searched around before the best (attempt 1)
    assert read_marker(proposal.source)["values"] == {"BLOCK_SIZE": 512, "NUM_WARPS": 4}
    assert proposal.reasoning.startswith("Attempt 2 ")


def test_evolve_progress_lines_name_the_parent_island_and_cell(store):
    """The attempt events carry the strategy's pick, and the progress line shows it (issue 38: evolve printed what
    refine prints)."""
    import io

    from agent.output import Output
    from agent.progress import ProgressView

    run_id = store.create_run(target_name="fake", policy="scripted")
    settings = LoopSettings(max_attempts=5, patience=100, target_sol=2.0, strategy="evolve", strategy_seed=11,
                            migrate_every=3)
    loop = Loop(store=store, run_id=run_id, policy=ParentPolicy(), evaluation=FakeEvaluation, settings=settings,
                target_name="fake", target_source="class Model: ...")
    events = []
    run_loop(loop, Path(f"{store.path}.checkpoints"), on_event=events.append)
    picks = [e["pick"] for e in events if e["kind"] == "attempt"]
    logged = trace(store, run_id)
    assert [p["parent"] if p else None for p in picks] == [parent for _, parent, *_ in logged]
    assert [p["reason"] if p else "" for p in picks] == [reason or "" for _, _, reason, *_ in logged]
    out = io.StringIO()
    view = ProgressView(5, Output(file=out))
    for event in events:
        view(event)
    lines = out.getvalue().splitlines()
    later = next(i for i, p in enumerate(picks) if p and p["parent"] is not None)
    pick = picks[later]
    assert lines[later].startswith(f"#{later + 1} (branch 0, from #{pick['parent']} island {pick['island']}"
                                   + (f" cell {pick['cell']})" if pick["cell"] else ")"))


def test_the_run_settings_check_refuses_an_unknown_strategy_for_every_entry_point():
    from agent import run as runs

    with pytest.raises(runs.RunError, match=r"^unknown strategy 'greedy' \(one of refine, best-of-n, metr, evolve\)$"):
        runs.check_settings("offline", runs.settings_for("vector_add", **runs.strategy_settings("greedy")))
    for name in STRATEGIES:
        runs.check_settings("offline", runs.settings_for("vector_add", **runs.strategy_settings(name)))
    runs.check_settings("offline", runs.settings_for("vector_add"))   # a run made before strategies: refine
