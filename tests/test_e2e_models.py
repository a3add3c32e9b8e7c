"""End to end through the CLI, the real graph, evaluator (Triton interpreter on CPU), store and checkpoints, with the
model policies talking to loopback fakes of the Anthropic and OpenAI APIs: everything a run does must be logged,
replayable with no network, exportable as training data, and the API key must never reach a candidate.

The two model runs (and the replay of the first) are made once for the module; each test reads what they left.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

datasets = pytest.importorskip("datasets")

from agent.cli import app  # noqa: E402
from agent.policies.anthropic import DEFAULT_MODEL, cost_usd  # noqa: E402
from fakes import anthropic_server as fa  # noqa: E402
from fakes import openai_server as fo  # noqa: E402
from sandbox.pool import WarmPool  # noqa: E402
from sandbox.process import clean_env  # noqa: E402
from tools import rules  # noqa: E402
from tools.records.store import open_db  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CORRECT = (REPO / "agent/kernels/vector_add/triton_block.py").read_text()
WRONG = CORRECT.replace("a + b, mask=mask", "a - b, mask=mask")
# Run (b)'s kernels differ from run (a)'s: export keeps one copy of a kernel across runs.
CORRECT_B = CORRECT.replace("BLOCK_SIZE = 4096", "BLOCK_SIZE = 2048")
WRONG_B = WRONG.replace("BLOCK_SIZE = 4096", "BLOCK_SIZE = 2048")
# Raises (a runtime_error) if any *KEY*/*TOKEN*/*SECRET* variable reached its process; `import os` is refused by the
# static rules, which the module switches off so the run-time defence is what is tested.
PROBE = (REPO / "tests/candidates/reads_secrets.py").read_text()
ANTHROPIC_KEY = "sk-ant-e2e-dummy-never-in-a-candidate"
OPENAI_KEY = "sk-openai-e2e-dummy-never-in-a-candidate"
FAKE_GPU = {"name": "NVIDIA H200", "sms": 132, "l2_bytes": 60 * 2**20, "cc": "9.0", "driver": "580.95",
            "cuda": "13.0", "peak_gbps": 4810.0, "peak_tflops_bf16": 989.0, "peak_tflops_fp32": 67.0}
NO_CODE = "I think this kernel is already as fast as vector_add gets."
assert len({CORRECT, WRONG, CORRECT_B, WRONG_B}) == 4


def submit(source: str, rationale: str) -> dict:
    return {"language": "triton", "source": source, "rationale": rationale}


def anthropic_script() -> list:
    """Turn 1: a wrong kernel. Turn 2: an API failure (500, no retries), then an inspection call, then the correct
    kernel. Turn 3: an answer with no code. Turn 4: the environment probe."""
    return [
        fa.message(fa.thinking("Start simple."), fa.text("A first try."),
                   fa.tool_use("submit_candidate", submit(WRONG, "one block per program"))),
        fa.error(500, "api_error", "Internal server error"),
        fa.message(fa.tool_use("get_ptx", {"attempt": 1}), cache_read=1000, cache_write=0),
        fa.message(fa.text("Fix the sign."), fa.tool_use("submit_candidate", submit(CORRECT, "add, not subtract"))),
        fa.message(fa.text(NO_CODE)),
        fa.message(fa.tool_use("submit_candidate", submit(PROBE, "smaller blocks"))),
    ]


def openai_script() -> list:
    """Turn 1: a wrong kernel. Turn 2: an API failure (503), then a diff call, then a correct kernel. Turn 3: no code."""
    return [
        fo.completion(tool_calls=[fo.tool_call("submit_candidate", submit(WRONG_B, "first try"))]),
        fo.error(503, "overloaded"),
        fo.completion("Let me compare.", tool_calls=[fo.tool_call("diff", {"attempt_a": 1, "attempt_b": 1})]),
        fo.completion(tool_calls=[fo.tool_call("submit_candidate", submit(CORRECT_B, "fixed sign, 2048 blocks"))]),
        fo.completion(NO_CODE),
    ]


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def newest_run(db: Path) -> dict:
    store = open_db(db, create=False, readonly=True)
    try:
        return store.list_runs()[0]
    finally:
        store.close()


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    db = tmp_path_factory.mktemp("e2e") / "kloop.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        mp.setenv("OPENAI_API_KEY", OPENAI_KEY)
        mp.setattr(rules, "check_source", lambda source: [])
        with fa.ScriptedServer(anthropic_script()) as server:
            out_a = cli("optimize", "vector_add", "--policy", "anthropic", "--base-url", server.url, "--max-retries", 0,
                        "--thinking", 2048, "--effort", "high", "--language", "triton", "--max-attempts", 4,
                        "--db", db, "--no-memory")  # the lesson call is tested in tests/test_memory.py
            anthropic_bodies = server.bodies
        run_a = newest_run(db)

        mp.setattr("agent.run.gpu_facts", lambda: dict(FAKE_GPU))  # the run's GPU facts, shown from turn 1
        with fo.ScriptedServer(openai_script()) as server:
            cli("optimize", "vector_add", "--policy", "openai", "--base-url", f"{server.url}/v1", "--model",
                "qwen-coder", "--max-retries", 0, "--language", "triton", "--max-attempts", 3, "--db", db,
                "--no-memory")
            openai_bodies = server.bodies
        run_b = newest_run(db)

        def no_network(self, address):
            raise AssertionError(f"the replay opened a connection to {address}")

        mp.setattr(socket.socket, "connect", no_network)
        out_c = cli("optimize", "vector_add", "--policy", "replay", "--from", run_a["id"], "--max-attempts", 10,
                    "--db", db)
        run_c = newest_run(db)
    store = open_db(db, create=False, readonly=True)
    yield {"db": db, "store": store, "a": run_a["id"], "b": run_b["id"], "c": run_c["id"], "out_a": out_a.output,
           "out_c": out_c.output, "anthropic_bodies": anthropic_bodies, "openai_bodies": openai_bodies}
    store.close()


def verdicts(store, run_id: str) -> list[str]:
    return [a.verdict for a in store.attempts(run_id)]


def test_anthropic_run_logs_everything(e2e):
    store, run_id = e2e["store"], e2e["a"]
    run = store.get_run(run_id)
    assert run["status"] == "finished" and "reached 4 attempts" in run["notes"]
    assert run["model"] == DEFAULT_MODEL and run["settings"]["model"] == DEFAULT_MODEL  # pinned for resume
    attempts = store.attempts(run_id)
    # The API failure made no attempt and spent none of the budget; the answer without code is a format_error.
    assert [(a.number, a.turn, a.verdict) for a in attempts] == [
        (1, 1, "incorrect"), (2, 2, "correct"), (3, 3, "format_error"), (4, 4, "correct")]
    assert [a.source for a in attempts] == [WRONG, CORRECT, "", PROBE]
    assert "max abs error" in attempts[0].reasons[0]
    assert attempts[2].reasoning == NO_CODE and "no submit_candidate call" in attempts[2].reasons[0]
    assert attempts[1].result.executed_on == "cpu-interpreter"

    messages = store.messages(run_id)
    # Requests in full: what the server received is what was logged (the SDK adds only the stream flag).
    bodies = e2e["anthropic_bodies"]
    requests = [m for m in messages if m["role"] == "request"]
    assert [m["content"] for m in requests] == [{k: v for k, v in b.items() if k != "stream"} for b in bodies]
    assert bodies[0]["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert bodies[0]["output_config"] == {"effort": "high"}
    # The cached prefix (system + target, hardware included) is the same from turn 1 on.
    prefixes = {json.dumps([b["system"], b["messages"][0]["content"][0]["text"]]) for b in bodies}
    assert len(prefixes) == 1 and "no GPU" in bodies[0]["messages"][0]["content"][0]["text"]
    # Responses in full, with tokens and costs.
    responses = [m for m in messages if m["role"] == "response"]
    script = [r.body for r in anthropic_script() if r.status == 200]
    assert [[b["type"] for b in m["content"]["content"]] for m in responses] == \
        [[b["type"] for b in s["content"]] for s in script]
    assert responses[0]["content"]["content"][0]["thinking"] == "Start simple."
    assert responses[1]["content"]["content"][0]["input"] == {"attempt": 1}
    assert [(m["input_tokens"], m["output_tokens"], m["cache_write_tokens"], m["cache_read_tokens"])
            for m in responses][:3] == [(1200, 300, 1000, 0), (1200, 300, 0, 1000), (1200, 300, 1000, 0)]
    assert cost_usd(DEFAULT_MODEL, 1200, 300, 1000, 0) > 0
    assert responses[0]["cost_usd"] == pytest.approx(cost_usd(DEFAULT_MODEL, 1200, 300, 1000, 0))
    assert store.usage(run_id)["cost_usd"] == pytest.approx(sum(m["cost_usd"] for m in responses))
    # The failed call: logged with its request, attached to no attempt.
    (error,) = [m for m in messages if m["role"] == "error"]
    assert error["attempt_id"] is None and "InternalServerError 500" in error["content"]["error"]
    assert requests[1]["attempt_id"] is None and requests[1]["seq"] == error["seq"] - 1
    assert "no attempt was spent" in e2e["out_a"]
    # The inspection call and its answer, attached to the attempt they led to.
    (call,) = [m for m in messages if m["role"] == "tool_call"]
    (answer,) = [m for m in messages if m["role"] == "tool_result"]
    assert call["content"]["name"] == "get_ptx" and call["content"]["input"] == {"attempt": 1}
    assert answer["content"]["tool_use_id"] == call["content"]["id"]
    assert call["attempt_id"] == answer["attempt_id"] == attempts[1].id
    tool_result = bodies[3]["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result" and tool_result["content"] == answer["content"]["content"]
    # The format error's model exchange is kept with its attempt (a negative example for training).
    assert [m["role"] for m in messages if m["attempt_id"] == attempts[2].id] == ["request", "response"]


def test_openai_run_logs_everything_and_shows_the_gpu_from_turn_1(e2e):
    store, run_id = e2e["store"], e2e["b"]
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["model"] == "qwen-coder"
    assert run["gpu"] == FAKE_GPU and run["gpu_name"] == "NVIDIA H200" and run["driver"] == "580.95"
    assert verdicts(store, run_id) == ["incorrect", "correct", "format_error"]
    bodies = e2e["openai_bodies"]
    assert "NVIDIA H200" in bodies[0]["messages"][1]["content"]
    assert len({json.dumps(b["messages"][0]) for b in bodies}) == 1
    messages = store.messages(run_id)
    assert [m["content"] for m in messages if m["role"] == "request"] == bodies
    responses = [m for m in messages if m["role"] == "response"]
    assert len(responses) == 4 and all(m["input_tokens"] == 900 and m["output_tokens"] == 200 for m in responses)
    assert responses[1]["content"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "diff"
    (error,) = [m for m in messages if m["role"] == "error"]
    assert error["attempt_id"] is None and "503" in error["content"]["error"]
    (call,) = [m for m in messages if m["role"] == "tool_call"]
    (answer,) = [m for m in messages if m["role"] == "tool_result"]
    assert call["content"]["input"] == {"attempt_a": 1, "attempt_b": 1} and not answer["content"]["is_error"]
    assert bodies[3]["messages"][-1] == {"role": "tool", "tool_call_id": call["content"]["id"],
                                         "content": answer["content"]["content"]}


def test_replay_repeats_the_candidates_offline_linked_to_the_original(e2e):
    store = e2e["store"]
    original = [a.source for a in store.attempts(e2e["a"]) if a.source]
    replayed = store.attempts(e2e["c"])
    assert [a.source for a in replayed] == original == [WRONG, CORRECT, PROBE]
    assert [a.verdict for a in replayed] == ["incorrect", "correct", "correct"]
    run = store.get_run(e2e["c"])
    assert (run["parent_run_id"], run["parent_kind"], run["policy"]) == (e2e["a"], "replay-policy", "replay")
    assert run["status"] == "finished" and "nothing more to try" in run["notes"]
    assert not any(m["role"] in ("request", "response", "error") for m in store.messages(e2e["c"]))


@pytest.mark.parametrize("fmt", ["trl", "openai", "kernelbook", "rl"])
def test_export_of_both_model_runs(e2e, tmp_path, fmt):
    out = tmp_path / f"{fmt}.jsonl"
    extra = ["--all-verdicts"] if fmt == "rl" else []
    cli("export", "--db", e2e["db"], "--run", e2e["a"], "--run", e2e["b"], "--format", fmt, "--out", out, *extra)
    rows = list(datasets.load_dataset("json", data_files=str(out), split="train"))
    # openai lines hold only what fine-tuning takes; their provenance is a line-aligned sidecar
    sidecar = out.with_name(out.name + ".provenance.jsonl")
    provenance = [json.loads(line)["provenance"] for line in sidecar.read_text().splitlines()] \
        if fmt == "openai" else [r["provenance"] for r in rows]
    assert len(provenance) == len(rows) and {p["run_id"] for p in provenance} == {e2e["a"], e2e["b"]}
    if fmt == "kernelbook":
        assert sorted(r["triton_code"] for r in rows) == sorted([CORRECT, CORRECT_B])
        assert all(r["verdict"] == "correct" for r in rows)
        return
    if fmt == "rl":
        by_run = {run: [r["verdict"] for r in rows if r["provenance"]["run_id"] == run] for run in (e2e["a"], e2e["b"])}
        assert by_run == {e2e["a"]: ["incorrect", "correct", "format_error", "correct"],
                          e2e["b"]: ["incorrect", "correct", "format_error"]}
        no_code = [r for r in rows if r["verdict"] == "format_error"]
        assert all(not r["reward_components"]["correct"] and not r["reward_components"]["compiled"] for r in no_code)
        assert all(r["reward"] == 0.0 and r["label"] is False for r in no_code)
        assert all(r["completion"][0]["content"] == NO_CODE for r in no_code)
        return
    # trl/openai: each run's trajectory up to its verified kernel, the inspection round included; only that
    # verified submission is trained (trl: the completion; openai: the one assistant turn with weight 1).
    assert len(rows) == 2
    for row in rows:
        if fmt == "trl":
            messages, trained = row["prompt"] + row["completion"], row["completion"]
        else:
            messages = row["messages"]
            trained = [m for m in messages if m["role"] == "assistant" and m.get("weight") == 1]
        roles = [m["role"] for m in messages]
        assert roles[:2] == ["system", "user"] and roles[-3:] == ["assistant", "tool", "assistant"]
        assert trained == [messages[-1]]
        last_call = messages[-1]["tool_calls"][0]["function"]
        arguments = json.loads(last_call["arguments"]) if fmt == "openai" else last_call["arguments"]
        assert last_call["name"] == "submit_candidate" and arguments["source"] in (CORRECT, CORRECT_B)
        assert {messages[-3]["tool_calls"][0]["function"]["name"]} <= {"get_ptx", "diff"}


def test_the_api_key_never_reaches_a_candidate(e2e):
    store = e2e["store"]
    probe = store.attempts(e2e["a"])[3]
    # The probe ran (rules off) in a worker while ANTHROPIC_API_KEY and OPENAI_API_KEY were set here: it raises
    # if any such variable reached it, so 'correct' means none did.
    assert probe.source == PROBE and probe.verdict == "correct", probe.reasons
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
        env = clean_env(Path("/tmp"), cuda=False)
        assert ANTHROPIC_KEY not in env.values() and not any("KEY" in k for k in env)
        with WarmPool(spares=0) as pool:
            planner = pool.acquire("planner")
            try:
                environ = b"".join(Path(f"/proc/{pid}/environ").read_bytes() for pid in _tree(planner.proc.pid))
            finally:
                planner.close()
    assert ANTHROPIC_KEY.encode() not in environ and b"ANTHROPIC_API_KEY" not in environ


def _tree(pid: int) -> list[int]:
    """pid and its descendants (the jail tool, then the planner inside it)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found
