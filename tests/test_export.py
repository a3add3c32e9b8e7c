"""kloop export: databases built through the store API, every format loaded back with datasets."""
from __future__ import annotations

import json
import sqlite3

import pytest
import typer
from typer.testing import CliRunner

datasets = pytest.importorskip("datasets")

from agent import cmd_data  # noqa: E402
from agent.inspect_tools import TOOLS  # noqa: E402
from agent.policy import Message  # noqa: E402
from tools.export import ExportOptions, breaks_rules, build_records, normalized_kernel_hash  # noqa: E402
from tools.store import open_db  # noqa: E402

TARGET = '''import torch
import torch.nn as nn

N = 1 << 20


class Model(nn.Module):
    def forward(self, x, y):
        return x + y


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
'''

KERNEL = '''import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, out, n, BLOCK=BLOCK_SIZE)
        return out


BLOCK_SIZE = {block}
'''
GPU = {"name": "NVIDIA H100 80GB HBM3", "sms": 132, "l2_bytes": 52428800, "cc": "9.0", "peak_gbps": 3352.0,
       "peak_tflops_bf16": 989.0, "peak_tflops_fp32": 67.0, "driver": "580.95", "cuda": "13.0"}
VERSIONS = {"torch": "2.11.0", "triton": "3.6.0", "cupy": "14.2.0", "python": "3.12.3"}


def kernel(block: int) -> str:
    return KERNEL.format(block=block)


def timing(median: float) -> dict:
    return {"median": median, "q1": median * 0.98, "q3": median * 1.02, "iqr": median * 0.04, "min": median * 0.95,
            "max": median * 1.1, "n": 100, "events_total_ms": median * 0.1, "wall_total_ms": median * 0.12}


def attempt_columns(verdict: str, source: str, median: float | None = None, eager_us: float = 30.0,
                    compile_us: float = 24.0, **extra) -> dict:
    """The columns the graph stores for one evaluated candidate (values shaped like the evaluator's)."""
    timed = median is not None
    nbytes = 3 * 4 * (1 << 20)
    roofline = {"bytes": nbytes, "flops": 1 << 20, "bound": "memory",
                "sol_us": nbytes / (GPU["peak_gbps"] * 1e3) if timed else None,
                "sol_fraction": nbytes / (GPU["peak_gbps"] * 1e3) / median if timed else None,
                "peak_gbps": GPU["peak_gbps"], "peak_tflops": GPU["peak_tflops_fp32"]}
    result = {"verdict": verdict, "language": "triton", "time_us": timing(median) if timed else None,
              "speedup": {"eager": eager_us / median, "compile": compile_us / median} if timed else None,
              "roofline": roofline, "gpu": GPU if timed else None, "versions": VERSIONS,
              "executed_on": "cuda" if timed else "cpu-interpreter",
              "timing_note": None if timed else "no CUDA GPU: interpreter run, no timing is real"}
    columns = {
        "language": "triton", "source": source, "verdict": verdict, "reasoning": f"try: {verdict}",
        "reasons": [] if verdict == "correct" else [f"{verdict}: see log"],
        "time_us": result["time_us"], "roofline": roofline, "result": result,
        "speedup_eager": eager_us / median if timed and verdict == "correct" else None,
        "speedup_compile": compile_us / median if timed and verdict == "correct" else None,
        "sol_fraction": roofline["sol_fraction"] if verdict == "correct" else None,
        "resources": [{"kernel": "add_kernel", "source": "triton", "registers": 32, "spills": 0, "shared_bytes": 0,
                       "num_warps": 4, "num_stages": 3, "threads": 128, "occupancy": 1.0}],
        "ncu": {"add_kernel": {"dram_pct": 88.0, "sm_pct": 20.0, "achieved_occupancy_pct": 90.0, "l2_hit_pct": 30.0,
                               "stalls": {"long_scoreboard": 0.7}, "gpu_time_us": median}} if timed else None,
        "nvml": {"before": {"sm_clock": 1980}, "after": {"sm_clock": 1980}, "throttled": False, "reasons": []}
        if timed else None,
    }
    columns.update(extra)
    return columns


def make_offline_run(store, timed: bool = True) -> str:
    """Branch 0: compile_error, incorrect, two correct kernels and a reformatted copy of the faster one;
    branch 1: a correct kernel, then a rejected one (the whole branch is left out by default)."""
    run_id = store.create_run(target_name="vector_add", target_source=TARGET, policy="offline", model="",
                              gpu_name=GPU["name"] if timed else None, versions=VERSIONS,
                              settings={"max_attempts": 8, "language": "triton", "branches": 2},
                              baselines={"eager": timing(30.0), "compile": timing(24.0)} if timed else None)
    fast_copy = "# same kernel, reformatted\n" + kernel(1024).replace("    mask = offs < n", "    mask = offs  <  n  # tail")
    rows = [
        (0, attempt_columns("compile_error", "def broken(:\n", compile_log="SyntaxError")),
        (0, attempt_columns("incorrect", kernel(256).replace("mask=mask) +", "mask=mask) -"), 40.0 if timed else None)),
        (0, attempt_columns("correct", kernel(256), 25.0 if timed else None)),
        (0, attempt_columns("correct", kernel(1024), 15.0 if timed else None)),
        (0, attempt_columns("correct", fast_copy, 15.5 if timed else None)),
        (1, attempt_columns("correct", kernel(2048), 20.0 if timed else None)),
        (1, attempt_columns("rejected", "import os\n" + kernel(4096), None, reasons=["imports os"])),
    ]
    turns = {0: 0, 1: 0}
    ids = []
    for branch, columns in rows:
        turns[branch] += 1
        # the offline policy logs its reasoning as a response message (no requests: there is no model)
        logged = [Message(role="response", provider="offline", content={"reasoning": columns["reasoning"]})]
        ids.append(store.add_attempt(run_id, logged, branch=branch, turn=turns[branch], **columns))
    store.update_run(run_id, status="finished", best_attempt_id=ids[3])
    return run_id


SUBMIT_SCHEMA = next(t["input_schema"] for t in TOOLS if t["name"] == "submit_candidate")


def make_anthropic_run(store) -> str:
    """Logged like the anthropic policy does: each turn a fresh conversation (target + turn prompt).
    Turn 1: the model inspects (get_ptx), then submits a correct kernel; turn 2: an incorrect one;
    turn 3: it answers without a submission (logged as a format_error attempt with no source)."""
    run_id = store.create_run(target_name="vector_add", target_source=TARGET, policy="anthropic",
                              model="claude-opus-4-8", gpu_name=GPU["name"], versions=VERSIONS)
    cache = {"type": "ephemeral"}

    def first_message(turn):
        return {"role": "user", "content": [{"type": "text", "text": "# Target: vector_add\n" + TARGET,
                                             "cache_control": cache},
                                            {"type": "text", "text": f"## Turn {turn}"}]}

    def commit(turn, conversations, columns):
        """What the graph does at the end of a turn: the attempt and the turn's messages in one go."""
        logged = []
        for conversation, blocks in conversations:
            request = {"model": "claude-opus-4-8", "max_tokens": 32000, "system": "You are an expert GPU kernel "
                       "engineer.", "tools": TOOLS, "messages": conversation, "thinking": {"type": "adaptive"}}
            response = {"id": f"msg_{turn}_{len(logged)}", "type": "message", "role": "assistant", "content": blocks,
                        "stop_reason": "tool_use", "usage": {"input_tokens": 900, "output_tokens": 400}}
            logged += [Message("request", request, provider="anthropic", model="claude-opus-4-8"),
                       Message("response", response, provider="anthropic", model="claude-opus-4-8",
                               input_tokens=900, output_tokens=400, cost_usd=0.03)]
        return store.add_attempt(run_id, logged, branch=0, turn=turn, **columns)

    inspect = [{"type": "thinking", "thinking": "Look at the seed's PTX first.", "signature": "sig"},
               {"type": "tool_use", "id": "toolu_1", "name": "get_ptx", "input": {"attempt": 1}}]
    answered = [first_message(1), {"role": "assistant", "content": inspect},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": ".visible .entry", "is_error": False,
                                              "cache_control": cache}]}]
    submit = [{"type": "text", "text": "Vectorized loads, BLOCK=512."},
              {"type": "tool_use", "id": "toolu_2", "name": "submit_candidate",
               "input": {"language": "triton", "source": kernel(512), "rationale": "wider blocks"}}]
    first = commit(1, [([first_message(1)], inspect), (answered, submit)],
                   attempt_columns("correct", kernel(512), 18.0))
    wrong = kernel(8192).replace("+ tl.load(y", "* tl.load(y")
    commit(2, [([first_message(2)], [{"type": "tool_use", "id": "toolu_3", "name": "submit_candidate",
                                      "input": {"language": "triton", "source": wrong, "rationale": "bigger"}}])],
           attempt_columns("incorrect", wrong, 12.0))
    commit(3, [([first_message(3)], [{"type": "text", "text": "I think we are done."}])],
           {"language": "triton", "source": "", "verdict": "format_error",
            "reasons": ["no submit_candidate call and no fenced python block"]})
    store.update_run(run_id, status="finished", best_attempt_id=first)
    return run_id


def make_openai_run(store) -> str:
    run_id = store.create_run(target_name="vector_add", target_source=TARGET, policy="openai", model="gpt-6",
                              gpu_name=GPU["name"], versions=VERSIONS)
    store.update_run(run_id, isolation="unshare: bwrap unusable")  # a weaker jail travels with every row
    attempt_id = store.add_attempt(run_id, branch=0, turn=1, **attempt_columns("correct", kernel(128), 22.0))
    request = {"model": "gpt-6", "messages": [{"role": "developer", "content": "You write kernels."},
                                              {"role": "user", "content": "Optimize vector_add"}],
               "tools": [{"type": "function", "function": {"name": "submit_candidate", "description": "submit",
                                                           "parameters": SUBMIT_SCHEMA}}]}
    response = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {
            "name": "submit_candidate",
            "arguments": json.dumps({"language": "triton", "source": kernel(128), "rationale": "simple"})}}]}}]}
    for role, body in (("request", request), ("response", response)):
        store.add_message(run_id, Message(role=role, content=body, provider="openai", model="gpt-6"),
                          attempt_id=attempt_id, branch=0, turn=1)
    return run_id


@pytest.fixture
def runs_db(tmp_path):
    path = tmp_path / "kloop.db"
    store = open_db(path)
    ids = {"offline": make_offline_run(store), "anthropic": make_anthropic_run(store), "openai": make_openai_run(store)}
    store.close()
    return path, ids


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("export")(cmd_data.export_command)
    app.command("report")(cmd_data.report_command)
    return app


def run_export(db, out, *args):
    return CliRunner().invoke(cli(), ["export", "--db", str(db), "--out", str(out), *args])


def load(path):
    return datasets.load_dataset("json", data_files=str(path), split="train")


def test_trl_whole_trajectories(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "trl.jsonl"
    result = run_export(db, out, "--format", "trl")
    assert result.exit_code == 0, result.output
    rows = list(load(out))
    by_run = {r["provenance"]["run_id"]: r for r in rows}
    # branch 1 of the offline run holds a rejected attempt: only branch 0 remains, ending at its fastest kernel
    assert sorted(by_run) == sorted(ids.values()) and len(rows) == 3
    offline = by_run[ids["offline"]]
    assert offline["provenance"]["attempt_number"] == 4
    assert [m["role"] for m in offline["messages"]] == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    call = offline["messages"][-1]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "submit_candidate"
    assert call["function"]["arguments"]["source"] == kernel(1024)       # arguments are objects, not strings
    assert offline["messages"][3] == {**offline["messages"][3], "role": "tool", "name": "submit_candidate"}
    assert offline["messages"][3]["content"].startswith("### Attempt 1 (triton): compile_error")
    assert "kernel time: median 25.00 us" in offline["messages"][7]["content"]   # attempt 3's report
    assert "@triton.jit" not in offline["messages"][7]["content"]   # the source is in the call, not repeated
    assert "# Target: vector_add" in offline["messages"][1]["content"]
    assert "        return x + y" in offline["messages"][1]["content"]
    assert offline["messages"][-1]["content"] == "try: correct"                  # the attempt's reasoning
    assert [t["function"]["name"] for t in offline["tools"]] == ["submit_candidate"]

    model = by_run[ids["anthropic"]]
    assert model["provenance"]["model"] == "claude-opus-4-8" and model["provenance"]["attempt_number"] == 1
    roles = [m["role"] for m in model["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert model["messages"][2]["reasoning_content"] == "Look at the seed's PTX first."
    assert model["messages"][1]["content"].startswith("# Target: vector_add") and "## Turn 1" in model["messages"][1]["content"]
    assert model["messages"][2]["tool_calls"][0]["function"]["arguments"]["attempt"] == 1
    assert model["messages"][3]["name"] == "get_ptx" and model["messages"][3]["content"] == ".visible .entry"
    assert model["messages"][4]["content"] == "Vectorized loads, BLOCK=512."
    assert model["messages"][4]["tool_calls"][0]["function"]["arguments"]["source"] == kernel(512)
    assert {t["function"]["name"] for t in model["tools"]} == {t["name"] for t in TOOLS}

    openai_run = by_run[ids["openai"]]
    assert openai_run["messages"][0]["role"] == "system"
    assert openai_run["messages"][-1]["tool_calls"][0]["function"]["arguments"]["rationale"] == "simple"
    for row in rows:
        assert set(row["provenance"]) == {"db", "run_id", "attempt_id", "attempt_number", "gpu", "versions",
                                          "policy", "model", "isolation"}
        assert row["provenance"]["isolation"] == ("unshare: bwrap unusable" if row is openai_run else None)
        assert row["provenance"]["versions"]["triton"] == "3.6.0" and row["provenance"]["db"] == str(db)


def test_trl_per_turn_dedupes_and_include_rejected(runs_db, tmp_path):
    db, ids = runs_db
    records, summary = build_records([db], ExportOptions(format="trl", turns="last", run_ids=(ids["offline"],)))
    # correct attempts 3, 4 of branch 0; attempt 5 is attempt 4 reformatted
    assert [r["provenance"]["attempt_number"] for r in records] == [3, 4] and summary.duplicates == 1
    assert records[0]["messages"][-1]["role"] == "assistant" and len(records[1]["messages"]) == 2 + 2 * 3 + 1
    records, _ = build_records([db], ExportOptions(format="trl", turns="last", include_rejected=True,
                                                   all_verdicts=True, run_ids=(ids["offline"],)))
    assert [r["provenance"]["attempt_number"] for r in records] == [1, 2, 3, 4, 6, 7]


def test_openai_format(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "openai.jsonl"
    assert run_export(db, out, "--format", "openai", "--turns", "last").exit_code == 0
    rows = list(load(out))
    assert len(rows) == 4   # offline: 3 and 4 (5 duplicates 4); anthropic: 1; openai: 1
    for row in rows:
        calls = [c for m in row["messages"] for c in m.get("tool_calls") or []]
        assert calls and all(isinstance(c["function"]["arguments"], str) and c["id"] for c in calls)
        json.loads(calls[-1]["function"]["arguments"])
        tool_answers = [m for m in row["messages"] if m["role"] == "tool"]
        assert all(m["tool_call_id"] for m in tool_answers)
        assert {c["id"] for c in calls} >= {m["tool_call_id"] for m in tool_answers}


def test_kernelbook_pairs_and_filters(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "kb.jsonl"
    assert run_export(db, out, "--format", "kernelbook", "--min-speedup", "1.5").exit_code == 0
    rows = list(load(out))
    # offline best: 30/15 = 2x; anthropic best: 30/18 = 1.67x; openai: 30/22 = 1.36x is below the bar
    assert sorted(r["provenance"]["run_id"] for r in rows) == sorted([ids["offline"], ids["anthropic"]])
    row = next(r for r in rows if r["provenance"]["run_id"] == ids["offline"])
    assert row["triton_code"] == kernel(1024) and row["python_code"] == TARGET
    assert row["entry_point"] == "Model" and row["module_name"] == "vector_add" and row["synthetic"] is True
    assert row["speedup_eager"] == pytest.approx(2.0) and row["language"] == "triton"
    assert run_export(db, tmp_path / "none.jsonl", "--format", "kernelbook", "--language", "ptx").exit_code == 2


def test_rl_records(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "rl.jsonl"
    assert run_export(db, out, "--format", "rl", "--all-verdicts", "--run", ids["anthropic"]).exit_code == 0
    rows = list(load(out))
    # the format error (turn 3) has no kernel: it keeps the branch and is a zero-reward turn
    assert [(r["verdict"], r["correct"], r["compiled"]) for r in rows] == [
        ("correct", True, True), ("incorrect", False, True), ("format_error", False, False)]
    assert rows[0]["speedup_eager"] == pytest.approx(30 / 18) and rows[1]["speedup_eager"] is None
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user", "assistant", "tool"]
    assert [m["role"] for m in rows[1]["prompt"]] == ["system", "user"]
    assert rows[1]["completion"][0]["role"] == "assistant"
    assert rows[1]["completion"][0]["tool_calls"][0]["function"]["name"] == "submit_candidate"
    assert rows[2]["completion"][0]["content"] == "I think we are done."


def test_normalized_hash_ignores_comments_and_layout():
    assert normalized_kernel_hash(kernel(64)) == normalized_kernel_hash("# note\n" + kernel(64).replace("\n\n", "\n"))
    assert normalized_kernel_hash(kernel(64)) != normalized_kernel_hash(kernel(128))
    ptx = ".visible .entry k(\n  .param .u64 a\n)\n{ ret; }\n"
    assert normalized_kernel_hash(ptx, "ptx") == normalized_kernel_hash("// generated\n" + ptx.replace("  ", "\t"),
                                                                        "ptx")


def test_several_databases_dedupe_across(runs_db, tmp_path):
    db, _ = runs_db
    other = tmp_path / "other.db"
    store = open_db(other)
    make_offline_run(store)
    store.close()
    records, summary = build_records([db, other], ExportOptions(format="kernelbook"))
    assert len(records) == 3 and summary.duplicates == 1   # the second database's run has the same best kernel


@pytest.mark.parametrize("case", ["unknown_run", "empty_db", "schema_version", "unwritable", "missing_db"])
def test_bad_input_is_one_line_and_writes_nothing(runs_db, tmp_path, case):
    db, _ = runs_db
    out = tmp_path / "out.jsonl"
    args = ["--format", "trl"]
    if case == "unknown_run":
        args += ["--run", "nosuchid"]
    elif case == "empty_db":
        db = tmp_path / "empty.db"
        open_db(db).close()
    elif case == "schema_version":
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    elif case == "unwritable":
        out = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    elif case == "missing_db":
        db = tmp_path / "missing.db"
    result = run_export(db, out, *args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert not out.exists()
    if out.parent.exists():
        assert not list(out.parent.glob(".out.jsonl.*"))   # no temp file left behind


def test_failed_export_keeps_the_previous_file(runs_db, tmp_path):
    db, _ = runs_db
    out = tmp_path / "data.jsonl"
    out.write_text("previous\n")
    assert run_export(db, out, "--format", "rl", "--run", "nosuchid").exit_code == 2
    assert out.read_text() == "previous\n"


def test_only_a_rejected_kernel_breaks_the_rules():
    assert breaks_rules({"verdict": "rejected", "source": "import os\n"})
    assert not breaks_rules({"verdict": "format_error", "source": ""})
    assert not breaks_rules({"verdict": "rejected", "source": ""})  # a format error as databases logged it before


def test_export_reads_beside_a_writer_without_waiting(runs_db, tmp_path, monkeypatch):
    db, _ = runs_db
    monkeypatch.setattr("tools.store.LOCK_TIMEOUT_S", 0.1)  # a writer's open would fail at once: export must not
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # a run still writing
    try:
        result = run_export(db, tmp_path / "kb.jsonl", "--format", "kernelbook")
    finally:
        holder.execute("ROLLBACK")
    assert result.exit_code == 0, result.output
