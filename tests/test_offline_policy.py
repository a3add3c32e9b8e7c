import dataclasses

import pytest

from agent.policies import make_policy
from agent.policies.offline import NO_STARTERS, Move
from agent.policy import AttemptView, PolicyError, ProposeContext
import evaluated
from tools.result import EvalResult, Resources
from tools.records.store import offline_marker as read_marker
from tools.records.store import source_hash
from tools.target import load_target

SEED = '''import torch
import triton
import triton.language as tl

BLOCK_SIZE = 1024  # elements per program
NUM_WARPS = 4
SCALE = 1.5


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), BLOCK_SIZE),)](x, out, x.numel(), BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
        return out
'''


def context(history, language="auto", branch=0, best=None):
    return ProposeContext(run_id="r", branch=branch, turn=len(history) + 1, target_name="t", target_source="",
                          language=language, gpu=None, history=history, best=best)


def attempt(number, proposal, verdict="correct", result: EvalResult | None = None, speedup=None):
    return AttemptView(id=number, number=number, branch=0, language=proposal.language, source=proposal.source,
                       verdict=verdict, reasons=[], time_us=None, speedup_eager=speedup, speedup_compile=None,
                       sol_fraction=None, diagnosis="", result=result or EvalResult())


def at_sol(fraction: float, **fields) -> EvalResult:
    """A correct 10 us kernel on an H100 at `fraction` of its memory speed-of-light (tests/evaluated.py)."""
    return evaluated.result("correct", 10.0, gpu=evaluated.H100, nbytes=int(fraction * 10.0 * 3352e3), **fields)


def drive(policy, turns, language="auto"):
    """Propose, record the proposal as a correct attempt, repeat; returns the proposals."""
    history, proposals = [], []
    for n in range(1, turns + 1):
        proposal = policy.propose(context(history, language))
        proposals.append(proposal)
        if proposal.done:
            break
        history.append(attempt(n, proposal))
    return proposals


@pytest.fixture
def seed(tmp_path):
    path = tmp_path / "scale.py"
    path.write_text(SEED)
    return path


def test_builtin_target_starts_from_the_catalog_starters():
    policy = make_policy("offline", target=load_target("vector_add"))
    first, second = drive(policy, 2)
    assert (first.language, second.language) == ("triton", "ptx")
    assert read_marker(first.source)["template"] == "vector_add/triton_block"
    assert "Start from the vector_add/triton_block" in first.reasoning
    triton_only = drive(make_policy("offline", target=load_target("vector_add")), 6, language="triton")
    assert {p.language for p in triton_only} == {"triton"}


def test_moves_are_deterministic_and_never_repeat_until_done(seed):
    runs = [drive(make_policy("offline", seed_kernel=seed), 200) for _ in range(2)]
    assert [p.source for p in runs[0]] == [p.source for p in runs[1]]
    proposals = runs[0]
    assert proposals[-1].done and not proposals[-1].source
    tried = [source_hash(p.source) for p in proposals[:-1]]
    assert len(tried) == len(set(tried)) > 10
    # SCALE is a float constant: a tunable too; the seed itself comes first, unchanged
    assert proposals[0].source.split("\n", 1)[1] == SEED
    defaults = {"BLOCK_SIZE": 1024, "NUM_WARPS": 4, "SCALE": 1.5}
    changed = {k for p in proposals[1:-1] for k, v in read_marker(p.source)["values"].items() if v != defaults[k]}
    assert changed == set(defaults)


def test_the_diagnosis_chooses_the_move(seed):
    policy = make_policy("offline", seed_kernel=seed)
    start = policy.propose(context([]))
    spilling = evaluated.result("correct", resources=evaluated.resources("k", registers=255, spills=12))
    move = policy.propose(context([attempt(1, start, result=spilling)]))
    assert read_marker(move.source)["values"]["BLOCK_SIZE"] == 512 and "spill" in move.reasoning

    policy = make_policy("offline", seed_kernel=seed)
    start = policy.propose(context([]))
    starved = at_sol(0.4)
    move = policy.propose(context([attempt(1, start, result=starved)]))
    assert read_marker(move.source)["values"]["BLOCK_SIZE"] == 2048 and "memory-bound" in move.reasoning

    policy = make_policy("offline", seed_kernel=seed)
    start = policy.propose(context([]))
    crowded = evaluated.result("correct", resources=evaluated.resources("k", registers=200, occupancy=0.25))
    move = policy.propose(context([attempt(1, start, result=crowded)]))
    assert read_marker(move.source)["values"]["NUM_WARPS"] == 2 and "occupancy" in move.reasoning


def test_searches_around_the_best_attempt(seed):
    policy = make_policy("offline", seed_kernel=seed)
    history = []
    for n in range(1, 4):
        history.append(attempt(n, policy.propose(context(history)), speedup=float(n == 2)))
    best = history[1]
    move = policy.propose(context(history, best=best))
    values, best_values = read_marker(move.source)["values"], read_marker(best.source)["values"]
    assert sum(values[k] != best_values[k] for k in values) == 1  # one step from the best
    assert move.reasoning.startswith("Attempt 2 (")


def test_memory_bound_triton_kernel_gets_ptx_cache_hint_edits():
    policy = make_policy("offline", target=load_target("vector_add"))
    start = policy.propose(context([], language="auto"))
    # A GPU run reports the kernel's PTX; the policy compiles its own (specialized + generic) for the main shape.
    result = at_sol(0.5, ptx={"vector_add_kernel": "// as a GPU run reports it"})
    first = attempt(1, start, result=result, speedup=1.0)
    history = [first, attempt(2, policy.propose(context([first])), verdict="runtime_error")]  # the PTX starter
    moves = [policy.propose(context(history, best=first))]
    while len(moves) < 9:
        history.append(attempt(len(history) + 1, moves[-1], verdict="runtime_error"))
        moves.append(policy.propose(context(history, best=first)))
    # The one-step neighbours first (BLOCK_SIZE, EVICTION, NUM_WARPS, each up and down), then the PTX moves.
    assert [m.language for m in moves[:6]] == ["triton"] * 6
    assert {tuple(sorted(read_marker(m.source)["values"].items())) for m in moves[:6]} == {
        tuple(sorted({**read_marker(start.source)["values"], name: value}.items()))
        for name, value in [("BLOCK_SIZE", 2048), ("BLOCK_SIZE", 8192), ("EVICTION", ""), ("EVICTION", "evict_last"),
                            ("NUM_WARPS", 4), ("NUM_WARPS", 16)]}
    moves = moves[6:]
    assert [m.language for m in moves] == ["ptx"] * 3
    assert [read_marker(m.source)["ptx_edit"] for m in moves] == ["none", "loads_nc_stores_cs", "stores_cs"]
    namespace = {}
    exec(compile(moves[2].source, "candidate", "exec"), namespace)
    entries = [v["entry"] for v in namespace["PTX_VARIANTS"]]
    assert entries == ["vector_add_kernel", "vector_add_kernel_generic"]
    assert all("st.global.cs" in text and "st.global.b" not in text for text in namespace["PTX_TEXTS"])
    assert namespace["PTX_VARIANTS"][0]["divisible"] == [3] and namespace["PTX_VARIANTS"][1]["divisible"] == []


def test_a_ptx_twin_still_compiling_holds_up_nothing_while_attempts_are_in_flight(monkeypatch):
    # Compiling the best's PTX takes seconds (a fresh process, the target's inputs at full size). A propose that
    # waited for it held up the logging of every attempt in flight: on an H100 pair, 26 stalls over 4 s made up 157 s
    # of 210. The compile starts with the first move around the best; while it runs and attempts are in flight, the
    # PTX moves are passed over (the two-step moves go first), and with nothing else left the loop is asked to wait.
    from agent.kernels import ptx_edits
    import threading

    started, release, compile_for_target = [], threading.Event(), ptx_edits.compile_for_target

    def slow_compile(source, spec):
        started.append(spec)
        release.wait(30)
        return compile_for_target(source, spec)

    monkeypatch.setattr(ptx_edits, "compile_for_target", slow_compile)
    policy = make_policy("offline", target=load_target("vector_add"))
    start = policy.propose(context([], language="auto"))
    first = attempt(1, start, result=at_sol(0.5, ptx={"vector_add_kernel": "// as a GPU run reports it"}), speedup=1.0)
    history = [first, attempt(2, policy.propose(context([first])), verdict="runtime_error")]
    moves = []
    while not moves or not moves[-1].wait:   # proposed in a burst, attempts in flight
        moves.append(policy.propose(dataclasses.replace(context(history, best=first), in_flight=len(moves) + 1)))
    assert started == ["vector_add"] and not moves[-1].source and not moves[-1].done
    markers = [read_marker(m.source) for m in moves[:-1]]
    assert not any("ptx_edit" in m for m in markers)   # no PTX twin move before its compile is done
    around_best = [m for m in markers if m["template"] == "vector_add/triton_block"]
    assert len(around_best) > 6   # the six one-step moves, then the two-step ones that come after the PTX moves
    assert any(m["template"] == "vector_add/ptx_vec4" for m in markers)   # and the next anchor's
    release.set()
    ptx = policy.propose(context(history, best=first))   # nothing in flight: it waits for the compile itself
    assert ptx.language == "ptx" and read_marker(ptx.source)["ptx_edit"] == "none" and not ptx.wait
    assert started == ["vector_add"]   # once per source


def test_a_best_without_a_ptx_twin_does_not_hold_back_the_ptx_moves_of_one_with_it(monkeypatch):
    # matmul_bias_relu's best is a TMA starter (its PTX takes tensor maps: no PTX twin); the grouped starter, slower,
    # has one. Its PTX moves come right after the best's one-step neighbours, not after the best's whole
    # neighbourhood and every faster attempt's (on the H100, 158 candidates in 5 minutes reached no PTX one).
    policy = make_policy("offline", target=load_target("matmul_bias_relu"))
    monkeypatch.setattr(policy, "ptx_moves", lambda anchor, about: iter(
        [Move(f"# ptx of attempt {anchor.id}\n", "ptx", "")] if policy.has_ptx_twin(anchor) else []))
    compiled = evaluated.result("correct", 200.0, ptx={"matmul_kernel": "// as a GPU run reports it"})
    history = []
    for n in range(1, 4):   # the three starters: TMA persistent, TMA warp-specialized, grouped
        history.append(attempt(n, policy.propose(context(history, language="auto")), result=compiled,
                               speedup=[1.1, 1.0, 0.9][n - 1]))
    best = history[0]
    assert [read_marker(a.source)["template"].split("/")[1] for a in history] == \
        ["triton_tma_persistent", "triton_tma_ws", "triton_grouped"]
    assert [policy.has_ptx_twin(a) for a in history] == [False, False, True]
    moves = [m.source for m in policy.moves(context(history, language="auto", best=best))]
    first_ptx = moves.index("# ptx of attempt 3\n")
    one_step = [m for m in moves[:first_ptx] if m not in {a.source for a in history}]   # the starters come first
    assert one_step and all(read_marker(m)["template"].endswith("triton_tma_persistent") for m in one_step)
    assert all(sum(read_marker(m)["values"][k] != read_marker(best.source)["values"][k]
                   for k in read_marker(best.source)["values"]) == 1 for m in one_step)
    assert moves.count("# ptx of attempt 3\n") == 2   # and again in its own turn as an anchor (a repeat is skipped)


def test_no_target_and_no_seed_kernel_is_refused(tmp_path):
    with pytest.raises(PolicyError) as error:   # a user target gets Inductor's starter: tests/test_inductor.py
        make_policy("offline")
    assert str(error.value) == NO_STARTERS
    with pytest.raises(PolicyError, match="cannot read seed kernel"):
        make_policy("offline", seed_kernel=tmp_path / "missing.py")
    with pytest.raises(PolicyError, match="unknown policy"):
        make_policy("psychic")


def test_diagnosis_reads_the_counters():
    from agent.diagnose import diagnose

    text, facts = diagnose(at_sol(
        0.42, eager_us=13.1, compile_us=9.7, nvml={"throttled": True, "reasons": ["SwPowerCap"]},
        resources=[Resources(kernel="k", source="ptxas", registers=168, spills=32, shared_bytes=0, occupancy=0.25)],
        ncu=evaluated.counters("k", dram_pct=41.0, sm_pct=12.0, achieved_occupancy_pct=23.0,
                               stalls={"long_scoreboard": 6.5, "wait": 0.4, "barrier": 1.2})))
    assert facts["bound"] == "memory" and facts["spills"] == 32 and facts["spilling"]
    assert facts["low_occupancy"] and facts["register_heavy"] and facts["memory_room"] and facts["throttled"]
    assert facts["top_stall"] == "long_scoreboard"
    for phrase in ("memory-bound, at 42% of speed-of-light", "168 registers, 32 spilled", "throttled",
                   "achieved occupancy 23%", "long_scoreboard 6.5, barrier 1.2", "1.31x over eager"):
        assert phrase in text

    text, facts = diagnose(evaluated.result("compile_error", reasons=["line 3: bad token"],
                                            resources=[Resources(kernel="k", source="triton")]))
    assert text.splitlines()[0] == "verdict compile_error: line 3: bad token" and "registers" not in text
    assert not (facts["spilling"] or facts["memory_room"] or facts["low_occupancy"])


H100 = {"name": "NVIDIA H100 80GB HBM3", "sms": 132, "cc": "9.0", "smem_per_block_bytes": 232448,
        "smem_per_sm_bytes": 233472}


def _compute_bound(sol=0.7, **ncu):
    return {"verdict": "correct", "roofline": {"bound": "compute", "sol_fraction": sol},
            "resources": [{"kernel": "matmul_kernel", "source": "triton", "registers": 161, "spills": 0,
                           "occupancy": 0.125}],
            "ncu": {"matmul_kernel": ncu} if ncu else None}


def _next_move_after_the_starters(best_result, gpu=H100, target="matmul_bf16"):
    """The three starters tried, the first (persistent TMA) the best with `best_result`: the policy's next move."""
    policy = make_policy("offline", target=load_target(target))

    def ctx(history, best=None):
        return ProposeContext(run_id="r", branch=0, turn=len(history) + 1, target_name=target, target_source="",
                              language="triton", gpu=gpu, history=history, best=best)

    history = []
    for n in range(1, 4):
        proposal = policy.propose(ctx(history))
        history.append(attempt(n, proposal, result=EvalResult.from_dict(best_result) if n == 1 else None,
                               speedup=2.0 if n == 1 else 1.0))
    assert read_marker(history[0].source)["template"] == f"{target}/triton_tma_persistent"
    move = policy.propose(ctx(history, best=history[0]))
    before, after = read_marker(history[0].source)["values"], read_marker(move.source)["values"]
    return {k: (before[k], after[k]) for k in after if after[k] != before[k]}, move.reasoning, policy, ctx, history


def test_compute_bound_diagnosis_reads_tensor_pipe_and_stalls():
    from agent.diagnose import diagnose

    text, facts = diagnose(EvalResult.from_dict(_compute_bound(
        tensor_pct=55.0, stalls={"long_scoreboard": 3.2, "math_pipe_throttle": 1.1})))
    assert facts["compute_room"] and facts["waiting_on_loads"] and not facts["tensor_busy"]
    assert not facts["low_occupancy"]      # one 161-register program per SM is how a tensor-core tile runs
    assert "tensor pipe 55%" in text and "warps wait for their tiles (long_scoreboard)" in text
    _, facts = diagnose(EvalResult.from_dict(_compute_bound(tensor_pct=91.0, stalls={"math_pipe_throttle": 2.0})))
    assert facts["tensor_busy"] and not facts["waiting_on_loads"]
    _, facts = diagnose(EvalResult.from_dict(_compute_bound(stalls={"mio_throttle": 2.5, "wait": 0.3})))
    assert facts["shared_bound"] and facts["tensor_pct"] is None


@pytest.mark.parametrize("result, expected, why", [
    # Warps wait on their tiles: one more stage (4 x 48 KiB ring + 32 KiB epilogue = 224 KiB still fits an H100).
    (_compute_bound(tensor_pct=55.0, stalls={"long_scoreboard": 3.2}), {"NUM_STAGES": (3, 4)}, "wait for their tiles"),
    # The tensor pipe is busy: no schedule step fits (two 176 KiB programs per SM do not), no bigger tile fits
    # (256x256 needs 256 registers a thread, BLOCK_K 128 288 KiB): the group size is what is left.
    (_compute_bound(tensor_pct=91.0, stalls={"math_pipe_throttle": 2.0}), {"GROUP_M": (8, 16)}, "tensor pipe is busy"),
    # Spills: a smaller tile first.
    ({"verdict": "correct", "roofline": {"bound": "compute", "sol_fraction": 0.5},
      "resources": [{"kernel": "matmul_kernel", "source": "triton", "registers": 255, "spills": 40}]},
     {"BLOCK_N": (256, 128)}, "spill"),
])
def test_the_diagnosis_picks_the_compute_bound_move(result, expected, why):
    changed, reasoning, *_ = _next_move_after_the_starters(result)
    assert changed == expected and why in reasoning, (changed, reasoning)


def test_tile_search_never_proposes_what_does_not_fit_the_gpu():
    from agent.kernels.catalog import STARTERS

    _, _, policy, ctx, history = _next_move_after_the_starters(_compute_bound())
    fits = {s.name: s.fits for s in STARTERS["matmul_bf16"]}
    for n in range(4, 40):
        proposal = policy.propose(ctx(history, best=history[0]))
        marker = read_marker(proposal.source)
        defaults = dict(policy.by_name[marker["template"]].defaults)
        assert fits[marker["template"]]({**defaults, **marker["values"]}, H100) is None, marker
        history.append(attempt(n, proposal, verdict="incorrect"))
    assert len({source_hash(a.source) for a in history}) == len(history) >= 39
