"""Memory across runs (tools/records/memory.py, agent/learn.py, `kloop memory`): tuning memory written by one offline run and
seeding the next on a different shape; lessons written by a model policy through a loopback server, retrieved by
FTS5 into the next run's prompt, judged and pruned; the memory commands."""
from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from agent import learn
from agent.cli import app
from agent.graph import Loop, LoopSettings, run_loop
from tools.records.store import offline_marker as read_marker
from agent.policy import Message, RunDigest
from fakes import anthropic_server as fa
from fakes import openai_server as fo
from tools.records.memory import CPU, clean_lesson, open_memory, size_bucket
from tools.result import EvalResult, Timing
from tools.records.store import open_db
from tools.target import load_target

REPO = Path(__file__).resolve().parents[1]


# -- the memory file ---------------------------------------------------------------------------------------------
def test_tunings_keep_the_best_verified_values_and_seed_the_nearest_bucket(tmp_path):
    m = open_memory(tmp_path / "memory.db")
    common = dict(target_name="t", run_id="r1", attempt_id=1, run_db="x.db")
    assert m.remember_tuning("add/block", "float32 2^20", 20, "float32", "H200", {"BLOCK": 1024}, 1.1, **common)
    assert not m.remember_tuning("add/block", "float32 2^20", 20, "float32", "H200", {"BLOCK": 256}, 1.0, **common)
    assert not m.remember_tuning("add/block", "float32 2^20", 20, "float32", "H200", {"BLOCK": 256}, None, **common)
    assert m.remember_tuning("add/block", "float32 2^20", 20, "float32", "H200", {"BLOCK": 2048}, 1.3, **common)
    assert m.remember_tuning("add/block", "float32 2^26", 26, "float32", "H200", {"BLOCK": 4096}, 1.0, **common)
    assert m.remember_tuning("add/block", "float32 2^11", 11, "float32", CPU, {"BLOCK": 64}, None, **common)
    assert m.remember_tuning("add/block", "float32 2^11", 11, "float32", CPU, {"BLOCK": 128}, None, **common)
    assert [(t["bucket"], t["gpu"], t["tunables"]) for t in m.tunings()] == [
        ("float32 2^20", "H200", {"BLOCK": 2048}), ("float32 2^26", "H200", {"BLOCK": 4096}),
        ("float32 2^11", CPU, {"BLOCK": 128})]
    # a similar target: same template and GPU, the nearest shape bucket
    assert [s["values"] for s in m.seeds(["add/block", "other"], 22, "float32", "H200")] == [{"BLOCK": 2048}]
    assert m.seeds(["add/block"], 25, "float32", "H200")[0]["values"] == {"BLOCK": 4096}
    assert m.seeds(["add/block"], 25, "float32", "H100") == []
    assert size_bucket(["float32", "float32"], 2000) == ("float32 2^11", 11)
    m.close()


def test_lessons_are_searched_judged_retired_and_forgotten(tmp_path):
    m = open_memory(tmp_path / "memory.db")
    ev = [{"attempt_id": 3, "number": 3, "verdict": "correct", "speedup_eager": 1.4}]
    kw = dict(target_name="softmax", gpu="H200", run_id="r1", run_db="x.db", evidence=ev)
    one = m.add_lesson("Row softmax in fp32: one program per row with BLOCK >= row length avoids a second pass.",
                       "softmax float32 float32 2^26 H200", **kw)
    two = m.add_lesson("Elementwise adds are bandwidth-bound; 4096-element blocks saturate HBM.",
                       "vector_add float32 H200", **kw)
    assert m.add_lesson("row SOFTMAX in fp32: one program per row with BLOCK >= row length avoids a second pass.",
                        "softmax", **kw) == one  # the same lesson again is support, not a copy
    assert m.get(f"L{one}")["support"] == 1 and len(m.get(f"L{one}")["evidence"]) == 2
    assert [r["id"] for r in m.retrieve(["softmax", "bfloat16"])] == [one]
    assert {r["id"] for r in m.retrieve(["H200"])} == {one, two}
    assert m.retrieve([]) == [] and m.retrieve(['"); DROP TABLE lessons; --']) == []
    assert clean_lesson("Use ```python\nimport os\n``` vectorized loads") == "Use vectorized loads"
    # contradicted more often than supported: retired, never retrieved again, kept for `show`
    assert m.judge(two, "contradicted", run_id="r2", run_db="x.db")["status"] == "retired"
    assert m.judge(one, "unrelated", run_id="r2", run_db="x.db") is None
    assert m.judge(one, "contradicted", run_id="r2", run_db="x.db")["status"] == "active"  # 1 support, 1 contradict
    assert [r["id"] for r in m.retrieve(["H200"])] == [one]
    assert m.get(f"L{two}")["judgements"][0]["verdict"] == "contradicted"
    assert m.forget_retired() == 1 and [r["id"] for r in m.lessons()] == [one]
    m.close()


# -- lessons through a loopback model ------------------------------------------------------------------------------
class FakeEvaluation:
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
        self.result.verdict, self.result.executed_on = "correct", "cuda"

    def profile(self):
        speedup = float(self.source.split()[-1])
        self.result.speedup, self.result.time_us = {"eager": speedup}, Timing(median=10 / speedup)


TARGET = SimpleNamespace(name="fake_add", description="elementwise add of two fp32 vectors", builtin=False)
LESSON = "For fake_add, wider blocks were 2x faster than 256-element blocks (attempt 2 vs 1)."


def submit(speed: float) -> dict:
    return fo.completion(tool_calls=[fo.tool_call("submit_candidate", {"language": "triton",
                                                                       "source": f"kernel {speed}"})])


def model_run(tmp_path, script, settings, attempts):
    """One openai-policy run against a loopback server (fake evaluator), then learn.after_run; returns what the
    server was sent, the run id and the lines after_run printed."""
    from agent.run import loop_search_settings
    from agent.policies.openai import OpenAIPolicy

    store = open_db(tmp_path / "kloop.db")
    settings = {**settings, **learn.prepare(settings, TARGET, "openai", None)}
    with fo.ScriptedServer(script) as server:
        policy = OpenAIPolicy("qwen", base_url=f"{server.url}/v1", api_key="k", max_retries=0)
        run_id = store.create_run(target_name=TARGET.name, policy="openai", settings=settings)
        loop = Loop(store=store, run_id=run_id, policy=policy, evaluation=FakeEvaluation,
                    settings=LoopSettings(max_attempts=attempts, language="triton", **loop_search_settings(settings)),
                    target_name=TARGET.name, target_source="class Model: ...")
        run_loop(loop, Path(f"{store.path}.checkpoints"))
        lines = learn.after_run(store, run_id, policy, settings, TARGET)
        bodies = server.bodies
    messages = store.messages(run_id)
    store.close()
    return bodies, run_id, lines, messages


def test_lessons_written_retrieved_shown_and_pruned_through_a_loopback_model(tmp_path):
    memory = tmp_path / "memory.db"
    settings = {"memory": str(memory), "strategy": "refine", "strategy_seed": 1}
    assert learn.prepare(settings, TARGET, "openai", None) == {} and not memory.exists()  # reading creates nothing

    # run 1: two kernels, then the lesson call; a lesson citing no attempt of the run is dropped
    answer = json.dumps({"lessons": [{"text": LESSON, "evidence": [1, 2]},
                                     {"text": "Unsupported claim.", "evidence": [99]}], "judgements": []})
    bodies, run1, lines, messages = model_run(tmp_path, [submit(1.0), submit(2.0), fo.completion(answer)],
                                              settings, 2)
    assert "Lessons this run was shown" not in bodies[2]["messages"][0]["content"]
    assert "distil what it taught" in bodies[2]["messages"][0]["content"].lower()
    assert "#2 triton correct, 2.00x eager" in bodies[2]["messages"][0]["content"]
    assert lines == ["memory: lesson L1"]
    # the extra call is logged with the run (its cost counts), attached to no attempt
    assert [m["role"] for m in messages if m["attempt_id"] is None] == ["request", "response"]
    m = open_memory(memory)
    (lesson,) = m.lessons()
    assert lesson["text"] == LESSON and [e["number"] for e in lesson["evidence"]] == [1, 2]
    assert lesson["evidence"][1]["speedup_eager"] == 2.0 and lesson["tags"].startswith("fake_add")
    m.close()

    # run 2: the lesson is retrieved into the prompt (the cached target part), then judged contradicted: retired
    answer = json.dumps({"lessons": [], "judgements": [{"id": 1, "verdict": "contradicted", "why": "256 won"}]})
    bodies, run2, lines, _ = model_run(tmp_path, [submit(1.5), fo.completion(answer)], settings, 1)
    prompt = bodies[0]["messages"][1]["content"]
    assert "## Lessons from earlier runs" in prompt and f"[L1] {LESSON}" in prompt
    assert "[L1]" in bodies[1]["messages"][0]["content"]  # shown to the judge
    assert lines == ["memory: lesson L1 contradicted (0/1, retired)"]
    store = open_db(tmp_path / "kloop.db")
    assert store.get_run(run2)["settings"]["memory_lessons"][0]["id"] == 1  # kept for a resume
    store.close()

    # run 3: a retired lesson is no longer retrieved
    assert learn.prepare(settings, TARGET, "openai", None) == {}


def test_anthropic_distils_through_its_loopback_server_and_survives_a_failed_call():
    from agent.policies.anthropic import AnthropicPolicy

    digest = RunDigest("fake_add", {"op": "fake_add", "description": "", "bucket": "float32 2^11", "gpu": CPU},
                       [], None, [{"id": 4, "text": "old lesson"}])
    answer = json.dumps({"lessons": [{"text": "x", "evidence": [1]}],
                         "judgements": [{"id": 4, "verdict": "supported", "why": "held"}]})
    with fa.ScriptedServer([fa.message(fa.text("Here: " + answer))]) as server:
        policy = AnthropicPolicy(api_key="k", base_url=server.url, max_retries=0, thinking="off")
        lessons, judgements, messages = policy.distill(digest)
        assert "[L4] old lesson" in server.bodies[0]["messages"][0]["content"]
        assert lessons == [{"text": "x", "evidence": [1]}] and judgements[0]["verdict"] == "supported"
        assert [m.role for m in messages] == ["request", "response"] and messages[1].cost_usd > 0
        lessons, judgements, messages = policy.distill(digest)  # the script ran out: a 500
    assert (lessons, judgements) == ([], []) and messages[-1].role == "error"


def test_policies_without_distill_write_no_lessons(tmp_path):
    store = open_db(tmp_path / "kloop.db")
    run_id = store.create_run(target_name="t", policy="offline")
    store.add_attempt(run_id, [Message(role="response", content={})], source="kernel 1", verdict="correct")
    settings = {"memory": str(tmp_path / "memory.db")}
    assert learn.after_run(store, run_id, SimpleNamespace(), settings) == []  # no marker: no tuning either
    assert learn.after_run(store, run_id, SimpleNamespace(), settings) == []  # already distilled
    assert open_memory(tmp_path / "memory.db").lessons() == []
    assert learn.after_run(store, run_id, SimpleNamespace(), {"memory": None}) == []
    store.close()


def test_remembered_row_tiles_are_scaled_to_the_new_rows_first():
    # softmax tuned over rows of 8192 kept BLOCK_COLS=1024; on rows of 16384 the same share of a row is 2048
    from agent.policies.offline import OfflinePolicy, scale_row_tiles

    remembered = [{"template": "softmax/triton_online", "values": {"BLOCK_COLS": 1024, "NUM_WARPS": 16},
                   "why": "T1", "row_length": 8192, "to_row_length": 16384}]
    policy = OfflinePolicy(load_target("softmax"), remembered=remembered)
    first, second = [read_marker(m.source)["values"] for m in islice(policy.moves(softmax_context()), 2)]
    assert first == {"BLOCK_COLS": 2048, "NUM_WARPS": 16} and second == {"BLOCK_COLS": 1024, "NUM_WARPS": 16}
    tiles = {"K0_R0_BLOCK": [16, 64, 1024, 4096], "K0_XBLOCK": [1, 2, 4], "K0_NUM_WARPS": [4, 8, 16]}
    tuned = {"K0_R0_BLOCK": 1024, "K0_XBLOCK": 2, "K0_NUM_WARPS": 8}
    assert scale_row_tiles(tuned, tiles, 8192, 2048) == {**tuned, "K0_R0_BLOCK": 64}   # 256 wanted: the nearest
    assert scale_row_tiles(tuned, tiles, 8192, 8192) == tuned == scale_row_tiles(tuned, tiles, None, 2048)
    # the same seed without row lengths (a memory file from before they were kept): one move, as remembered
    policy = OfflinePolicy(load_target("softmax"), remembered=[{**remembered[0], "row_length": None}])
    assert read_marker(next(policy.moves(softmax_context())).source)["values"] == {"BLOCK_COLS": 1024, "NUM_WARPS": 16}


def test_a_memory_file_from_before_row_lengths_is_upgraded(tmp_path):
    import sqlite3

    path = tmp_path / "memory.db"
    open_memory(path).close()
    with sqlite3.connect(path) as conn:   # the file as kloop wrote it before the column existed
        conn.execute("ALTER TABLE tunings DROP COLUMN row_length")
    m = open_memory(path)
    assert m.remember_tuning("t/k", "float32 2^20", 20, "float32", "H100", {"BLOCK_COLS": 512}, 1.2, target_name="t",
                             run_id="r", attempt_id=1, run_db="x.db", row_length=4096)
    assert m.seeds(["t/k"], 20, "float32", "H100")[0]["row_length"] == 4096
    m.close()


def softmax_context():
    from agent.policy import ProposeContext

    return ProposeContext(run_id="r", branch=0, turn=1, target_name="softmax", target_source="", language="triton",
                          gpu=None, history=[], best=None)


# -- tuning memory end to end, and `kloop memory` -------------------------------------------------------------------
# A seed kernel whose default SCALE is wrong: the offline search finds SCALE=1.0 on its third attempt.
SEED = '''import torch
import triton
import triton.language as tl

SCALE = 2.0


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    total = tl.load(a_ptr + offsets, mask=mask) + tl.load(b_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, total * scale, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 256),)](a, b, out, a.numel(), SCALE, BLOCK=256)
        return out
'''


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def test_every_entry_point_gets_memory_from_agent_run_when_its_settings_name_it(tmp_path, monkeypatch):
    """`start` reads the memory file the run's settings name and `run` writes it after the loop (one `memory` event
    per thing kept), whoever calls them; settings that name none (the default: suite, bench, the Python API)
    neither read nor write it."""
    from agent import run as runs
    from tools.records.store import OFFLINE_MARK as MARK
    from tools.records.store import attempt_columns

    seed, memory, target = tmp_path / "add_scaled.py", tmp_path / "memory.db", REPO / "tests/targets/tiny_add.py"
    seed.write_text(SEED)
    kept = open_memory(memory)
    kept.remember_tuning("add_scaled", "float32 2^11", 11, "float32", CPU, {"SCALE": 1.0}, None, target_name="tiny_add",
                         run_id="r0", attempt_id=1, run_db="old.db", row_length=1000)
    kept.close()

    def one_verified_attempt(store, run_id, *args, **kwargs):   # the loop, reduced to what memory keeps
        source = MARK + json.dumps({"template": "add_scaled", "values": {"SCALE": 0.5}}) + "\n" + SEED
        store.add_attempt(run_id, source=source, **attempt_columns(EvalResult(verdict="correct", executed_on="cpu")))

    def remembered() -> list[dict]:
        m = open_memory(memory)
        try:
            return [t["tunables"] for t in m.tunings()]
        finally:
            m.close()

    monkeypatch.setattr(runs, "run_graph", one_verified_attempt)
    store = open_db(tmp_path / "kloop.db")
    with_memory = runs.start(store, "offline", runs.settings_for(str(target), seed_kernel=str(seed), language="triton",
                                                                memory=str(memory)))
    assert with_memory.settings["memory_seeds"][0]["values"] == {"SCALE": 1.0}
    events = []
    runs.run(with_memory, events.append)
    assert events == [{"kind": "memory", "message": "memory: tunables of add_scaled for float32 2^11 on "
                                                    "cpu-interpreter (attempt 1)"}]
    assert remembered() == [{"SCALE": 0.5}]

    assert runs.DEFAULT_SETTINGS["memory"] is None
    without = runs.start(store, "offline", runs.settings_for(str(target), seed_kernel=str(seed), language="triton"))
    assert "memory_seeds" not in without.settings
    events.clear()
    runs.run(without, events.append)
    assert events == [] and remembered() == [{"SCALE": 0.5}]
    store.close()


def test_tuning_memory_seeds_the_next_run_on_another_shape(tmp_path):
    seed, db, memory = tmp_path / "add_scaled.py", tmp_path / "kloop.db", tmp_path / "memory.db"
    seed.write_text(SEED)
    bigger = tmp_path / "tiny_add_3000.py"
    bigger.write_text((REPO / "tests/targets/tiny_add.py").read_text().replace("N = 1000", "N = 3000"))

    first = cli("optimize", REPO / "tests/targets/tiny_add.py", "--policy", "offline", "--seed-kernel", seed,
                "--language", "triton", "--max-attempts", 3, "--db", db)
    assert "memory: tunables of add_scaled for float32 2^11 on cpu-interpreter (attempt 3)" in first.output
    store = open_db(db, create=False, readonly=True)
    run1 = store.list_runs()[0]
    assert [a.verdict for a in store.attempts(run1["id"])] == ["incorrect", "incorrect", "correct"]
    assert run1["settings"]["memory"] == str(memory.resolve()) and run1["settings"]["strategy"] == "refine"
    store.close()

    second = cli("optimize", bigger, "--policy", "offline", "--seed-kernel", seed, "--language", "triton",
                 "--max-attempts", 1, "--strategy", "metr", "--db", db)
    store = open_db(db, create=False, readonly=True)
    run2 = store.list_runs()[0]
    (attempt,) = store.attempts(run2["id"])
    # the first proposal uses the remembered tunables, and is verified at once (three attempts without memory)
    assert read_marker(attempt.source)["values"] == {"SCALE": 1.0} and attempt.verdict == "correct"
    assert "tunables that won before" in attempt.reasoning and "float32 2^11" in attempt.reasoning
    assert run2["settings"]["memory_seeds"][0]["values"] == {"SCALE": 1.0}
    assert (run2["settings"]["memory_seeds"][0]["row_length"], run2["settings"]["memory_seeds"][0]["to_row_length"]) \
        == (1000, 3000)   # the rows it was tuned at and this target's (no row tile here to scale)
    assert run2["settings"]["strategy"] == "metr" and attempt.parent_reason.startswith("metr: no attempt yet")
    assert attempt.archive_cell == "triton|?|sol?|occ?|add_scaled"
    store.close()
    assert "memory: tunables of add_scaled for float32 2^13" in second.output

    listed = json.loads(cli("memory", "list", "--memory", memory, "--json").output)
    assert [(t["item"], t["bucket"], t["tunables"]) for t in listed["tunings"]] == [
        ("T1", "float32 2^11", {"SCALE": 1.0}), ("T2", "float32 2^13", {"SCALE": 1.0})]
    assert "SCALE=1.0" in cli("memory", "list", "--memory", memory).output
    shown = json.loads(cli("memory", "show", "t1", "--memory", memory, "--json").output)
    assert shown["run_id"] == run1["id"] and shown["target_name"] == "tiny_add"
    assert "forgot T1" in cli("memory", "forget", "T1", "--memory", memory).output
    assert [t["item"] for t in json.loads(cli("memory", "list", "--memory", memory, "--json").output)["tunings"]] == ["T2"]
    missing = CliRunner().invoke(app, ["memory", "show", "L9", "--memory", str(memory)])
    assert missing.exit_code == 2 and "no lesson L9" in missing.output
    assert CliRunner().invoke(app, ["memory", "forget", "--memory", str(memory)]).exit_code == 2
