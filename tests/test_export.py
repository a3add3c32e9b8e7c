"""kloop export: databases built through the store API, every format loaded back with datasets."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sqlite3
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

datasets = pytest.importorskip("datasets", minversion="4.7")  # older ones corrupt tool calls

import evaluated  # noqa: E402  (tests/evaluated.py: results made by the evaluator's own producers)
from agent import cmd_data  # noqa: E402
from agent.inspect_tools import TOOLS  # noqa: E402
from agent.policy import Message  # noqa: E402
from agent.prompting import export_prompts  # noqa: E402
from tools.records.export import (ExportOptions, breaks_rules, build_records, normalized_kernel_hash,  # noqa: E402
                          scalar_reward, split_targets)
from tools.records.store import attempt_columns as store_columns  # noqa: E402
from tools.records.store import Attempt, open_db  # noqa: E402

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
GPU = evaluated.H100
VERSIONS = {"torch": "2.11.0", "triton": "3.6.0", "cupy": "14.2.0", "python": "3.12.3"}


def kernel(block: int) -> str:
    return KERNEL.format(block=block)


def timing(median: float) -> dict:
    return dataclasses.asdict(evaluated.timing(median))


def attempt_columns(verdict: str, source: str, median: float | None = None, eager_us: float = 30.0,
                    compile_us: float = 24.0, **extra) -> dict:
    """The columns the graph stores for one evaluated candidate: an evaluator result made by the evaluator's own
    producers (tests/evaluated.py), timed on GPU when `median` is given, through tools.records.store.attempt_columns."""
    timed = median is not None
    result = evaluated.result(
        verdict, median, eager_us=eager_us, compile_us=compile_us, gpu=GPU if timed else None,
        nbytes=3 * 4 * (1 << 20), flops=1 << 20, reasons=[] if verdict == "correct" else [f"{verdict}: see log"],
        ncu=evaluated.counters("add_kernel", gpu_time_us=median) if timed else None,
        resources=evaluated.resources("add_kernel", registers=32), versions=VERSIONS)
    columns = {"source": source, "reasoning": f"try: {verdict}", **store_columns(result)}
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


def options(**kw) -> ExportOptions:
    return ExportOptions(prompts=export_prompts(), **kw)


def verdicts_by_source(db) -> dict:
    """Every logged kernel's verdict, by normalized hash: what a trained turn must map back to."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT source, language, verdict FROM attempts WHERE source != ''").fetchall()
    out = {}
    for source, language, verdict in rows:
        out.setdefault(normalized_kernel_hash(source, language), set()).add(verdict)
    return out


def submitted_sources(messages) -> list[str]:
    return [(c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict)
             else json.loads(c["function"]["arguments"]))["source"]
            for m in messages for c in m.get("tool_calls") or [] if c["function"]["name"] == "submit_candidate"]


def test_trl_trains_only_the_final_verified_turn(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "trl.jsonl"
    result = run_export(db, out, "--format", "trl")
    assert result.exit_code == 0, result.output
    rows = list(load(out))
    by_run = {r["provenance"]["run_id"]: r for r in rows}
    # branch 1 of the offline run holds a rejected attempt: only branch 0 remains, ending at its fastest kernel
    assert sorted(by_run) == sorted(ids.values()) and len(rows) == 3
    offline = by_run[ids["offline"]]
    assert offline["provenance"]["attempt_number"] == 4 and offline["label"] is True
    assert offline["verdicts"] == ["compile_error", "incorrect", "correct", "correct"]
    # the history is context (one fresh request, as a model policy sends it); only the submission is trained
    assert [m["role"] for m in offline["prompt"]] == ["system", "user"]
    assert [m["role"] for m in offline["completion"]] == ["assistant"]
    call = offline["completion"][0]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "submit_candidate"
    assert call["function"]["arguments"]["source"] == kernel(1024)       # arguments are objects, not strings
    # the attempt's reasoning once, as the call's rationale; no text beside the call
    assert offline["completion"][0]["content"] == "" and call["function"]["arguments"]["rationale"] == "try: correct"
    user = offline["prompt"][1]["content"]
    assert "# Target: vector_add" in user and "        return x + y" in user
    assert "### Attempt 1 (triton): compile_error" in user and "kernel time: median 25.00 us" in user
    assert submitted_sources(offline["prompt"]) == []      # no earlier submission sits in a trained position
    assert [t["function"]["name"] for t in json.loads(offline["tools"])] == ["submit_candidate"]  # tools: a JSON string

    model = by_run[ids["anthropic"]]
    assert model["provenance"]["model"] == "claude-opus-4-8" and model["provenance"]["attempt_number"] == 1
    assert [m["role"] for m in model["prompt"]] == ["system", "user", "assistant", "tool"]
    assert model["prompt"][2]["reasoning_content"] == "Look at the seed's PTX first."
    # arguments round-trip exactly through datasets (below 4.7 every call got every tool's argument names as nulls)
    assert model["prompt"][2]["tool_calls"][0]["function"]["arguments"] == {"attempt": 1}
    assert model["completion"][0]["tool_calls"][0]["function"]["arguments"] == {
        "language": "triton", "source": kernel(512), "rationale": "wider blocks"}
    assert model["prompt"][3]["name"] == "get_ptx" and model["prompt"][3]["content"] == ".visible .entry"
    assert model["completion"][0]["content"] == "Vectorized loads, BLOCK=512."
    assert model["completion"][0]["tool_calls"][0]["function"]["arguments"]["source"] == kernel(512)
    assert {t["function"]["name"] for t in json.loads(model["tools"])} == {t["name"] for t in TOOLS}
    openai_run = by_run[ids["openai"]]
    assert openai_run["prompt"][0]["role"] == "system"
    assert openai_run["completion"][0]["tool_calls"][0]["function"]["arguments"]["rationale"] == "simple"
    # no failed kernel is ever a trained target
    verdicts = verdicts_by_source(db)
    for row in rows:
        for source in submitted_sources(row["completion"]):
            assert verdicts[normalized_kernel_hash(source)] == {"correct"}


def test_provenance_fields(runs_db, tmp_path, monkeypatch):
    db, ids = runs_db
    monkeypatch.chdir(db.parent)
    records, _ = build_records([db.name], options(format="kernelbook"))
    assert {r["provenance"]["db"] for r in records} == {str(db.resolve())}   # absolute, however it was typed
    records, _ = build_records([db], options(format="trl", license="cc-by-4.0"))
    for row in records:
        p = row["provenance"]
        assert p["kloop_version"] and p["license"] == "cc-by-4.0" and p["db"] == str(db)
        assert p["target_sha256"] == hashlib.sha256(TARGET.encode()).hexdigest()
        assert p["executed_on"] == "cuda" and p["gpu"] == GPU["name"] and p["driver"] == "580.95"
        assert p["cuda"] == "13.0" and p["versions"]["triton"] == "3.6.0" and p["versions"]["torch"] == "2.11.0"
        assert p["timing"] == {"flags": [], "throttled": False, "remeasured": False,
                               "derived_compile_baseline": False, "timed": True}
        assert p["isolation"] == ("unshare: bwrap unusable" if p["run_id"] == ids["openai"] else None)
        assert len(p["run_id"]) == 8 and isinstance(p["attempt_id"], int)


def test_a_cpu_interpreter_run_claims_no_gpu(tmp_path):
    db = tmp_path / "cpu.db"
    store = open_db(db)
    run_id = make_offline_run(store, timed=False)
    store.update_run(run_id, gpu_name="NVIDIA H200")   # a loopback run started on a GPU host, judged on CPU
    store.close()
    records, _ = build_records([db], options(format="kernelbook"))
    p = records[0]["provenance"]
    assert p["executed_on"] == "cpu-interpreter" and p["gpu"] is None and p["driver"] is None
    assert p["timing"]["timed"] is False


def test_all_correct_trains_every_verified_turn_once(runs_db, tmp_path):
    db, ids = runs_db
    records, summary = build_records([db], options(format="trl", train_on="all-correct"))
    by_run = {}
    for r in records:
        by_run.setdefault(r["provenance"]["run_id"], []).append(r["provenance"]["attempt_number"])
    # offline: correct attempts 3 and 4 (5 is 4 reformatted: left out, counted); anthropic 1; openai 1
    assert by_run == {ids["offline"]: [3, 4], ids["anthropic"]: [1], ids["openai"]: [1]}
    assert summary.duplicates == 1
    trained = [normalized_kernel_hash(s) for r in records for s in submitted_sources(r["completion"])]
    assert len(trained) == len(set(trained)) == 4          # every kernel trained exactly once
    # with a second copy of the database, nothing is trained twice either
    other = tmp_path / "copy.db"
    store = open_db(other)
    make_offline_run(store)
    store.close()
    records, summary = build_records([db, other], options(format="trl", train_on="all-correct"))
    assert len(records) == 4 and summary.duplicates == 1 + 3   # the copy's 3, 4 and 5 were trained already


def test_all_verdicts_rows_carry_labels_and_verdicts(runs_db):
    db, ids = runs_db
    records, _ = build_records([db], options(format="trl", train_on="all-correct", all_verdicts=True,
                                             run_ids=(ids["anthropic"],)))
    assert [(r["verdict"], r["label"]) for r in records] == [
        ("correct", True), ("incorrect", False), ("format_error", False)]
    assert [r["verdicts"] for r in records] == [["correct"], ["incorrect"], ["format_error"]]
    # final: the best verified turn (4, never the branch's last submission), and the failed ones on the way to it
    records, _ = build_records([db], options(format="trl", all_verdicts=True, run_ids=(ids["offline"],)))
    assert [(r["provenance"]["attempt_number"], r["verdict"], r["label"]) for r in records] == [
        (1, "compile_error", False), (2, "incorrect", False), (4, "correct", True)]


def add_marked_run(db) -> str:
    """An offline run whose kernels start with the offline policy's template line, one of them incorrect."""
    from tools.records.export import OFFLINE_MARK
    store = open_db(db)
    run_id = store.create_run(target_name="vector_add", target_source=TARGET, policy="offline", model="",
                              gpu_name=GPU["name"], versions=VERSIONS, baselines={"eager": timing(30.0)})
    marked = [("incorrect", kernel(32).replace("mask=mask) +", "mask=mask) *"), 40.0),
              ("correct", kernel(4096), 14.0), ("runtime_error", kernel(8), None)]
    for turn, (verdict, source, median) in enumerate(marked, 1):
        header = OFFLINE_MARK + json.dumps({"template": "triton_block", "values": {"BLOCK": turn}}) + "\n"
        store.add_attempt(run_id, branch=0, turn=turn, **attempt_columns(verdict, header + source, median))
    store.close()
    return run_id


def exported_units(fmt: str, out: Path) -> list[tuple[str, int, str | None, bool]]:
    """(run id, attempt number, kernel source as written, weighted) for every submission an export holds: weighted
    is what a trainer trains on or rewards as verified (trl/rl/verl/kernelbook label, openai weight 1, flashinfer
    PASSED)."""
    def source_of(message):
        sources = submitted_sources([message])
        if sources:
            return sources[0]
        match = re.search(r"```python\n# language: \w+\n(.*)\n```", message.get("content") or "", re.S)
        return match.group(1) + "\n" if match else None

    units = []
    if fmt == "flashinfer":
        for path in (out / "solutions").rglob("*.json"):
            solution = json.loads(path.read_text())
            run_id, number = solution["name"].split("_")[1:]
            trace = next(json.loads(line) for p in (out / "traces").rglob("*.jsonl")
                         for line in p.read_text().splitlines() if json.loads(line)["solution"] == solution["name"])
            units.append((run_id, int(number), solution["sources"][0]["content"],
                          trace["evaluation"]["status"] == "PASSED"))
        return units
    if fmt == "verl":
        import pyarrow.parquet as pq
        for row in pq.read_table(out).to_pylist():
            p = json.loads(row["extra_info"]["provenance"])
            units.append((p["run_id"], p["attempt_number"], source_of({"content": row["extra_info"]["response"]}),
                          row["extra_info"]["label"]))
        return units
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    if fmt == "openai":
        sidecar = [json.loads(line) for line in out.with_name(out.name + ".provenance.jsonl").read_text().splitlines()]
        for line, side in zip(lines, sidecar):
            weighted = [m for m in line["messages"] if m.get("weight") == 1]
            assert len(weighted) == len(side["trained_attempts"]) and weighted[-1] is line["messages"][-1]
            units += [(side["provenance"]["run_id"], n, source_of(m), True)
                      for n, m in zip(side["trained_attempts"], weighted)]
        return units
    for row in lines:
        p = row["provenance"]
        source = row.get("triton_code") or row.get("ptx_code") if fmt == "kernelbook" else source_of(row["completion"][0])
        units.append((p["run_id"], p["attempt_number"], source, row["label"]))
    return units


@pytest.mark.parametrize("fmt", ["trl", "openai", "rl", "verl", "kernelbook", "flashinfer"])
def test_no_format_or_flag_weights_a_kernel_that_is_not_correct(runs_db, tmp_path, fmt):
    """Every format x --train-on x --all-verdicts: what is trained (or labelled, weighted, PASSED) is a correct
    attempt's kernel byte for byte (less the offline policy's header line); what is not, is a failed one."""
    from tools.records.export import without_offline_mark
    db, ids = runs_db
    marked = add_marked_run(db)
    with sqlite3.connect(db) as conn:
        attempts = {(run, number): (source, verdict) for run, number, source, verdict in conn.execute(
            "SELECT run_id, number, source, verdict FROM attempts")}
    for train_on in ("final", "all-correct"):
        for all_verdicts in (False, True):
            out = tmp_path / f"{train_on}-{all_verdicts}" / ("out" if fmt == "flashinfer" else
                                                             f"out.{'parquet' if fmt == 'verl' else 'jsonl'}")
            out.parent.mkdir()
            args = ["--format", fmt, "--train-on", train_on] + (["--all-verdicts"] if all_verdicts else [])
            result = run_export(db, out, *args)
            assert result.exit_code == 0, (args, result.output)
            units = exported_units(fmt, out)
            assert any(weighted for *_, weighted in units), args
            for run_id, number, source, weighted in units:
                logged, verdict = attempts[(run_id, number)]
                assert weighted == (verdict == "correct"), (args, run_id, number, verdict)
                if source is not None:
                    assert source == without_offline_mark(logged), (args, run_id, number)
            numbers = {(r, n) for r, n, *_ in units}
            if fmt in ("trl", "openai") and train_on == "final":   # the best verified turn, with or without failures
                assert (ids["offline"], 4) in numbers and (marked, 2) in numbers and (ids["offline"], 3) not in numbers
            if fmt == "trl" and all_verdicts:
                assert (marked, 1) in numbers and ((marked, 3) in numbers) == (train_on == "all-correct")


def test_openai_weights_schema_sidecar_and_warning(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "openai.jsonl"
    result = run_export(db, out, "--format", "openai", "--train-on", "all-correct")
    assert result.exit_code == 0, result.output
    assert "warning: 4 example(s): OpenAI fine-tuning needs at least 10" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    sidecar = [json.loads(line) for line in (tmp_path / "openai.jsonl.provenance.jsonl").read_text().splitlines()]
    assert len(lines) == len(sidecar) == 4 and [s["line"] for s in sidecar] == [0, 1, 2, 3]
    verdicts = verdicts_by_source(db)
    for line, side in zip(lines, sidecar):
        assert set(line) == {"messages", "tools"}                      # no provenance or label in the line
        assert side["provenance"]["run_id"] and side["label"] is True
        for m in line["messages"]:
            assert set(m) <= {"role", "content", "tool_calls", "tool_call_id", "weight"}
            if m["role"] != "assistant":
                assert "weight" not in m
                continue
            assert m["weight"] in (0, 1)
            if m.get("tool_calls"):
                assert m.get("content", None) != ""                     # omitted, never "" next to tool calls
                assert all(isinstance(c["function"]["arguments"], str) and c["id"] for c in m["tool_calls"])
            submitted = submitted_sources([m])
            if m["weight"] == 1:
                assert submitted and all(verdicts[normalized_kernel_hash(s)] == {"correct"} for s in submitted)
        assert line["messages"][-1]["weight"] == 1
        tool_answers = [m for m in line["messages"] if m["role"] == "tool"]
        calls = {c["id"] for m in line["messages"] for c in m.get("tool_calls") or []}
        assert all(m["tool_call_id"] in calls for m in tool_answers)
    # openai has no label: with --all-verdicts a failed submission is weight-0 context or left out, and it says so
    result = run_export(db, out, "--format", "openai", "--train-on", "all-correct", "--all-verdicts")
    assert result.exit_code == 0 and "4 failed submission(s) left out" in result.output, result.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines
    anthropic = next(line for line, side in zip(lines, sidecar) if side["provenance"]["run_id"] == ids["anthropic"])
    assert [m.get("weight") for m in anthropic["messages"] if m["role"] == "assistant"] == [0, 1]  # inspection: 0


def test_exported_tolerances_are_the_evaluators_own(monkeypatch):
    import torch

    from tools import verify
    from tools.records import export

    assert export._tolerances({})["atol_rtol"] == {"float64": [1e-7, 1e-7], "float32": [1e-4, 1e-4],
                                                   "float16": [1e-2, 1e-2], "bfloat16": [2e-2, 2e-2],
                                                   "integer/bool": [0.0, 0.0]}
    outputs = {"outputs": [{"dtype": "int64"}, {"dtype": "bfloat16"}]}
    assert export._tolerances(outputs)["atol_rtol"] == {"bfloat16": [2e-2, 2e-2], "int64": [0.0, 0.0]}
    monkeypatch.setitem(verify.TOLERANCES, torch.bfloat16, (3e-2, 3e-2))   # what is judged is what is exported
    assert export._tolerances(outputs)["atol_rtol"]["bfloat16"] == [3e-2, 3e-2]


def test_rl_rows_rewards_and_groups(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "rl.jsonl"
    assert run_export(db, out, "--format", "rl", "--run", ids["anthropic"]).exit_code == 0
    rows = list(load(out))
    # every verdict by default; the format error (turn 3) has no kernel and is a zero-reward turn
    assert [(r["verdict"], r["label"], r["reward"]) for r in rows] == [
        ("correct", True, pytest.approx(1 + 0.5 * math.log2(30 / 18))), ("incorrect", False, 0.1),
        ("format_error", False, 0.0)]
    assert rows[0]["reward_components"]["speedup_eager"] == pytest.approx(30 / 18)
    assert rows[0]["reference_source"] == TARGET and rows[0]["baselines_us"] == {"eager": 30.0, "compile": 24.0}
    assert rows[0]["tolerances"]["atol_rtol"] == {"float32": [1e-4, 1e-4]}
    assert rows[0]["shapes"]["sizes"] == {"N": 1 << 20} and rows[0]["shapes"]["gpu"][0] == {}
    assert rows[0]["shapes"]["executed"] == "gpu" and rows[0]["shapes"]["cpu_interpreter"][0]["N"] <= 1 << 15
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user", "assistant", "tool"]
    assert rows[1]["completion"][0]["tool_calls"][0]["function"]["name"] == "submit_candidate"
    assert rows[2]["completion"][0]["content"] == "I think we are done."
    # a GRPO group is every row with the same prompt (text and roles): here each turn had its own
    from tools.records.export import plain_messages
    assert rows[0]["group_id"] == hashlib.sha256(json.dumps(plain_messages(rows[0]["prompt"]),
                                                            sort_keys=True).encode()).hexdigest()[:16]
    assert len({r["group_id"] for r in rows}) == 3


def test_no_export_carries_what_a_hidden_variant_withheld(runs_db, tmp_path):
    # an attempt's `withheld` (why a hidden variant failed, in full) is the operator's: a trained model never sees it
    db, ids = runs_db
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE attempts SET withheld = ? WHERE verdict = 'incorrect'",
                     [json.dumps(["hidden variant 1: incorrect: SECRET-SHAPE (7, 13)"])])
    for fmt, extra in (("trl", ["--all-verdicts"]), ("openai", []), ("rl", []), ("verl", []), ("kernelbook", []),
                       ("flashinfer", [])):
        out = tmp_path / fmt / ("out" if fmt == "flashinfer" else f"out.{'parquet' if fmt == 'verl' else 'jsonl'}")
        (tmp_path / fmt).mkdir()
        result = run_export(db, out, "--format", fmt, *extra)
        assert result.exit_code == 0, (fmt, result.output)
        written = [p for p in (tmp_path / fmt).rglob("*") if p.is_file()]
        assert written and not any(b"SECRET-SHAPE" in p.read_bytes() for p in written), fmt


def test_scalar_reward_formula():
    assert scalar_reward({"correct": True, "speedup_eager": None}) == 1.0
    assert scalar_reward({"correct": True, "speedup_eager": 2.0}) == 1.5
    assert scalar_reward({"correct": True, "speedup_eager": 100.0}) == 2.5      # clipped at 8x
    assert scalar_reward({"correct": True, "speedup_eager": 0.1}) == 0.5        # a slow verified kernel
    assert scalar_reward({"correct": False, "compiled": True}) == 0.1
    assert scalar_reward({"correct": False, "compiled": False}) == 0.0


def test_verl_parquet(runs_db, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    db, ids = runs_db
    out = tmp_path / "verl.parquet"
    result = run_export(db, out, "--format", "verl")
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(table.column_names)
    rows = table.to_pylist()
    # offline branch 0: 5 turns (5 = 4 reformatted, dropped) -> 4; anthropic 3; openai 1
    assert len(rows) == 4 + 3 + 1
    for row in rows:
        assert row["data_source"] == "kloop/vector_add" and row["ability"] == "gpu-kernel-optimization"
        assert row["reward_model"] == {"style": "rule", "ground_truth": TARGET}
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in row["prompt"])
        info = row["extra_info"]
        assert info["label"] == (info["verdict"] == "correct")
        assert json.loads(info["provenance"])["target_name"] == "vector_add"
    offline = [r for r in rows if json.loads(r["extra_info"]["provenance"])["run_id"] == ids["offline"]]
    assert [r["extra_info"]["verdict"] for r in offline] == ["compile_error", "incorrect", "correct", "correct"]
    assert "# language: triton" in offline[2]["extra_info"]["response"]           # the plain-text protocol
    assert "submit_candidate" not in offline[0]["prompt"][0]["content"]


def test_flashinfer_trace_folder(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "fi"
    result = run_export(db, out, "--format", "flashinfer")
    assert result.exit_code == 0, result.output
    definitions = list((out / "definitions").rglob("*.json"))
    assert len(definitions) == 1
    d = json.loads(definitions[0].read_text())
    assert set(d) >= {"name", "op_type", "axes", "inputs", "outputs", "reference"}
    assert d["axes"] == {"N": {"type": "var"}}
    assert d["inputs"] == {"x": {"shape": ["N"], "dtype": "float32"}, "y": {"shape": ["N"], "dtype": "float32"}}
    assert d["outputs"] == {"output": {"shape": ["N"], "dtype": "float32"}}
    assert "def run(x, y):" in d["reference"]
    solutions = [json.loads(p.read_text()) for p in (out / "solutions").rglob("*.json")]
    traces = [json.loads(line) for p in (out / "traces").rglob("*.jsonl") for line in p.read_text().splitlines()]
    # every verified kernel (offline 3 and 4, 5 repeats 4; one per model run), nothing else
    assert len(solutions) == len(traces) == 4
    for s in solutions:
        assert s["definition"] == d["name"] and s["spec"]["entry_point"] == "main.py::run"
        assert s["spec"]["language"] == "triton" and s["spec"]["target_hardware"] == [GPU["name"]]
        assert [f["path"] for f in s["sources"]] == ["kernel.py", "main.py"]
    for t in traces:
        assert t["definition"] == d["name"] and t["workload"]["axes"] == {"N": 1 << 20}
        assert t["workload"]["inputs"] == {"x": {"type": "random"}, "y": {"type": "random"}}
        e = t["evaluation"]
        assert e["status"] == "PASSED" and e["environment"]["hardware"] == GPU["name"]
        assert e["performance"]["speedup_factor"] > 1 and e["performance"]["reference_latency_ms"] == 0.03
    workloads = [json.loads(line) for p in (out / "workloads").rglob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(workloads) == 1 and workloads[0]["solution"] is None


def test_kernelbook_columns(runs_db, tmp_path):
    db, ids = runs_db
    out = tmp_path / "kb.jsonl"
    assert run_export(db, out, "--format", "kernelbook", "--min-speedup", "1.5", "--license", "mit").exit_code == 0
    rows = list(load(out))
    # offline best: 30/15 = 2x; anthropic best: 30/18 = 1.67x; openai: 30/22 = 1.36x is below the bar
    assert sorted(r["provenance"]["run_id"] for r in rows) == sorted([ids["offline"], ids["anthropic"]])
    row = next(r for r in rows if r["provenance"]["run_id"] == ids["offline"])
    assert row["triton_code"] == kernel(1024) and row["python_code"] == TARGET and row["ptx_code"] is None
    assert row["entry_point"] == "vector_add" and row["module_name"] == "vector_add" and row["synthetic"] is True
    assert row["original_triton_code"] is None           # no generated starter in this run
    assert row["licenses"] == ["mit"] and row["sha"] == hashlib.sha256(TARGET.encode()).hexdigest()
    assert isinstance(row["uuid"], int) and row["repo_link"] == f"kloop://{ids['offline']}/4"
    assert row["speedup_eager"] == pytest.approx(2.0) and row["language"] == "triton"
    assert run_export(db, tmp_path / "none.jsonl", "--format", "kernelbook", "--language", "ptx").exit_code == 2


def test_kernelbook_starter_and_ptx(tmp_path):
    from tools.records.export import OFFLINE_MARK
    from tools.records.store import OFFLINE_MARK as MARK
    assert OFFLINE_MARK == MARK
    db = tmp_path / "kb.db"
    store = open_db(db)
    run_id = store.create_run(target_name="vector_add", target_source=TARGET, policy="offline", model="",
                              versions=VERSIONS)
    starter = MARK + '{"template": "triton_block", "values": {"BLOCK": 256}}\n' + kernel(256)
    tuned = MARK + '{"template": "triton_block", "values": {"BLOCK": 1024}}\n' + kernel(1024)
    ptx = MARK + '{"template": "ptx_add", "values": {}}\nfrom tools.launch import PtxKernel\nPTX = ".entry"\n'
    store.add_attempt(run_id, branch=0, turn=1, **attempt_columns("correct", starter, 25.0))
    store.add_attempt(run_id, branch=0, turn=2, **attempt_columns("correct", tuned, 15.0))
    store.add_attempt(run_id, branch=0, turn=3, **{**attempt_columns("correct", ptx, 10.0), "language": "ptx"})
    store.close()
    rows, _ = build_records([db], options(format="kernelbook", language="triton"))
    assert rows[0]["triton_code"] == kernel(1024) and rows[0]["original_triton_code"] == kernel(256)  # no header
    rows, _ = build_records([db], options(format="kernelbook", language="ptx"))
    assert rows[0]["triton_code"] is None and rows[0]["ptx_code"] == ptx.split("\n", 1)[1] and rows[0]["language"] == "ptx"


def test_exclude_drops_exactly_the_evaluation_problems(runs_db, tmp_path):
    db, ids = runs_db
    store = open_db(db)
    other_target = TARGET.replace("x + y", "x * y")
    other = store.create_run(target_name="vector_mul", target_source=other_target, policy="offline", model="",
                             versions=VERSIONS)
    store.add_attempt(other, branch=0, turn=1, **attempt_columns("correct", kernel(64).replace(" + tl.load(y",
                                                                                                 " * tl.load(y"), 20.0))
    store.close()
    evalset = tmp_path / "level1"
    evalset.mkdir()
    # the same problem as KernelBench would ship it: other comments, a docstring, other layout
    (evalset / "1_vector_add.py").write_text('"""Adds."""\n# level 1\n' + TARGET.replace("\n\n\n", "\n\n"))
    (evalset / "2_unrelated.py").write_text(TARGET.replace("x + y", "x - y"))
    out = tmp_path / "kb.jsonl"
    result = run_export(db, out, "--format", "kernelbook", "--exclude", str(evalset))
    assert result.exit_code == 0, result.output
    rows = list(load(out))
    assert [r["provenance"]["run_id"] for r in rows] == [other]
    assert "3 excluded run(s)" in result.output
    records, summary = build_records([db], options(format="trl", exclude=(str(evalset / "1_vector_add.py"),)))
    assert [r["provenance"]["run_id"] for r in records] == [other] and summary.excluded == 3


def test_split_by_target_shares_no_target_between_train_and_test(runs_db, tmp_path):
    db, _ = runs_db
    store = open_db(db)
    for name, op in (("vector_mul", "*"), ("vector_sub", "-"), ("vector_div", "/")):
        run = store.create_run(target_name=name, target_source=TARGET.replace("x + y", f"x {op} y"), policy="offline",
                               model="", versions=VERSIONS)
        store.add_attempt(run, branch=0, turn=1, **attempt_columns("correct", kernel(64).replace(
            " + tl.load(y", f" {op} tl.load(y"), 20.0))
    store.close()
    whole, _ = build_records([db], options(format="rl"))
    out = tmp_path / "rl.jsonl"
    result = run_export(db, out, "--format", "rl", "--split-by", "target", "--test-fraction", "0.5")
    assert result.exit_code == 0, result.output
    train, test = load(tmp_path / "rl.train.jsonl"), load(tmp_path / "rl.test.jsonl")
    names = {split: {r["provenance"]["target_name"] for r in rows} for split, rows in (("train", train), ("test", test))}
    assert names["train"] and names["test"] and not names["train"] & names["test"], names
    assert names["train"] | names["test"] == {"vector_add", "vector_mul", "vector_sub", "vector_div"}
    assert len(train) + len(test) == len(whole) and not out.exists()
    assert f"test: {len(test)} row(s) from {len(names['test'])} op(s)" in result.output
    assert "file: rl.train.jsonl, rl.test.jsonl" in (tmp_path / "README.md").read_text()
    alone = run_export(db, tmp_path / "one.jsonl", "--format", "rl", "--split-by", "target", "--run", whole[0][
        "provenance"]["run_id"])   # one target: one side only, and a warning that says so
    assert alone.exit_code == 0 and "warning: one target only: nothing in one." in alone.output, alone.output


def test_a_target_keeps_its_side_of_the_split_as_targets_are_added():
    targets = [f"{i:064x}" for i in range(40)]
    sides = split_targets(targets, 0.25)
    assert 4 <= list(sides.values()).count("test") <= 18   # a hash's share, not an exact count
    assert all(split_targets(targets + [f"{i:064x}" for i in range(40, 80)], 0.25)[t] == side
               for t, side in sides.items())
    for fraction in (0.001, 0.999):   # two targets: neither side is left empty
        assert sorted(split_targets(targets[:2], fraction).values()) == ["test", "train"]
    assert split_targets(targets[:1], 0.5) in ({targets[0]: "train"}, {targets[0]: "test"})


def test_card_and_length_stats(runs_db, tmp_path):
    db, _ = runs_db
    out = tmp_path / "trl.jsonl"
    result = run_export(db, out, "--format", "trl", "--license", "apache-2.0")
    assert result.exit_code == 0, result.output
    assert re.search(r"^prompt +chars min \d+ median \d+ p90 \d+ max \d+; tokens min \d+", result.output, re.M)
    assert re.search(r"^trained +chars min \d+", result.output, re.M)
    assert re.search(r"^max_length >= \d+ tokens keeps every row whole .*verl data.max_prompt_length >= \d+.*"
                     r"tokens: estimate, 2.0 characters per token", result.output, re.M)
    card = (tmp_path / "README.md").read_text()
    assert re.search(r"verl: `data.max_prompt_length=\d+` \(the longest prompt; verl's default 1024 keeps \d of 3", card)
    assert re.search(r"TRL \(SFTConfig, KTOConfig\): `max_length=\d+`", card)
    assert card.startswith("---\nlicense: apache-2.0\n") and "kloop_export:\n  format: trl" in card
    assert "3 row(s)" in card and "NVIDIA H100 80GB HBM3" in card and "reward = 0 if" in card
    # a README.md that kloop did not write is left alone
    (tmp_path / "README.md").write_text("# my project\n")
    assert run_export(db, out, "--format", "trl").exit_code == 0
    assert (tmp_path / "README.md").read_text() == "# my project\n" and (tmp_path / "trl.jsonl.README.md").exists()


def test_length_stats_values(runs_db):
    db, ids = runs_db
    from tools.records.export import _build
    builder = _build([db], options(format="trl", run_ids=(ids["openai"],)))
    row = builder.rows[0]
    record = row["record"]
    assert row["trained"] == len(json.dumps(record["completion"][0]["tool_calls"][0]["function"]["arguments"])) + \
        len("submit_candidate")
    stats = builder.summary.lengths
    assert stats["prompt"]["chars"]["max"] == row["prompt"] and stats["prompt"]["tokens"]["max"] == math.ceil(
        row["prompt"] / 2.0)   # an estimate that errs long: BPE tokenizers did 2.07-3.1 characters a token here
    assert builder.summary.max_length == 1024 and builder.summary.max_prompt == math.ceil(row["prompt"] / 2.0)
    assert builder.summary.counted_by.startswith("estimate")


def test_tokenizer_counts_exactly_through_its_chat_template(runs_db, tmp_path):
    pytest.importorskip("transformers")
    from tools.records.export import _build
    db, ids = runs_db
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    builder = _build([db], options(format="trl", tokenizer=str(tmp_path / "tok")))
    for row in builder.rows:
        record = row["record"]
        tools = json.loads(record["tools"])
        prompt = tokenizer.apply_chat_template(record["prompt"], tools=tools, add_generation_prompt=True)["input_ids"]
        whole = tokenizer.apply_chat_template(record["prompt"] + record["completion"], tools=tools)["input_ids"]
        assert row["tokens"] == (len(prompt), len(whole) - len(prompt))
    summary = builder.summary
    assert summary.max_length == max(sum(r["tokens"]) for r in builder.rows)      # exact: not rounded up
    assert summary.counted_by == f"exact, tokenizer {tmp_path / 'tok'}"
    result = run_export(db, tmp_path / "x.jsonl", "--format", "trl", "--tokenizer", str(tmp_path / "nothing"))
    assert result.exit_code == 2 and result.output.startswith("error: --tokenizer") and \
        len(result.output.strip().splitlines()) == 1, result.output


def test_openai_lines_over_the_example_limit_are_counted(runs_db, tmp_path, monkeypatch):
    db, _ = runs_db
    monkeypatch.setattr("tools.records.export.OPENAI_MAX_TOKENS", 2000)
    result = run_export(db, tmp_path / "o.jsonl", "--format", "openai", "--train-on", "all-correct")
    counts = [math.ceil(len(line) / 2.0) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    match = re.search(r"warning: (\d+) of 4 line\(s\) exceed OpenAI's 2,000-token example limit \(estimate",
                      result.output)
    assert match and 0 < int(match.group(1)) <= sum(c > 2000 for c in counts), result.output


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


@pytest.mark.parametrize("case", ["unknown_run", "empty_db", "schema_version", "unwritable", "missing_db",
                                  "unknown_split", "split_fraction", "split_flashinfer"])
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
    elif case == "unwritable":   # a missing folder is made; one under a plain file cannot be
        (tmp_path / "a_file").write_text("")
        out = tmp_path / "a_file" / "dir" / "out.jsonl"
    elif case == "missing_db":
        db = tmp_path / "missing.db"
    elif case == "unknown_split":
        args += ["--split-by", "run"]
    elif case == "split_fraction":
        args += ["--split-by", "target", "--test-fraction", "1"]
    elif case == "split_flashinfer":
        args = ["--format", "flashinfer", "--split-by", "target"]
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
    def attempt(verdict, source):
        return Attempt(id=1, run_id="r", number=1, verdict=verdict, source=source)

    assert breaks_rules(attempt("rejected", "import os\n"))
    assert not breaks_rules(attempt("format_error", ""))
    assert not breaks_rules(attempt("rejected", ""))  # a format error as databases logged it before


def test_export_reads_beside_a_writer_without_waiting(runs_db, tmp_path, monkeypatch):
    db, _ = runs_db
    monkeypatch.setattr("tools.records.store.LOCK_TIMEOUT_S", 0.1)  # a writer's open would fail at once: export must not
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # a run still writing
    try:
        result = run_export(db, tmp_path / "kb.jsonl", "--format", "kernelbook")
    finally:
        holder.execute("ROLLBACK")
    assert result.exit_code == 0, result.output


CHAT_TEMPLATE = (  # a ChatML-like template with tool calls and generation markers, written here: nothing from a hub
    "{% if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ m.content or '' }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer():
    """A byte-level tokenizer with CHAT_TEMPLATE, made here (nothing from a hub)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                     pad_token="<pad>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model():
    """tiny_tokenizer() and a one-layer random Llama, made here (nothing from a hub)."""
    import transformers
    tokenizer = tiny_tokenizer()
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16384))
    return tokenizer, model


@pytest.mark.slow
@pytest.mark.parametrize("assistant_only_loss", [False, True])
def test_trl_sft_trains_on_the_verified_turn_only(runs_db, tmp_path, assistant_only_loss):
    """TRL's SFTTrainer on the trl export, with a byte-level tokenizer and a one-layer random model made here."""
    pytest.importorskip("trl")
    pytest.importorskip("transformers")
    from trl import SFTConfig, SFTTrainer

    db, _ = runs_db
    out = tmp_path / "trl.jsonl"
    assert run_export(db, out, "--format", "trl").exit_code == 0
    tokenizer, model = tiny_model()
    rows = load(out)
    dataset = rows.remove_columns([c for c in rows.column_names if c not in ("prompt", "completion", "tools")])
    # one token per byte here, so max_length is in characters: the export's longest row, and some room for the template
    longest = max(len(json.dumps(r["prompt"])) + len(json.dumps(r["completion"])) + len(r["tools"]) for r in rows)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=1,
                     max_length=longest + 512, report_to=[], save_strategy="no", use_cpu=True,
                     assistant_only_loss=assistant_only_loss)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    train = trainer.train_dataset
    assert len(train) == len(rows) == 3                       # nothing dropped as fully masked
    for example, row in zip(train, rows):
        mask = example.get("completion_mask") or example.get("assistant_masks")
        trained_ids = ([t for t, m in zip(example["input_ids"], mask) if m] if mask is not None
                       else [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100])
        trained = tokenizer.decode(trained_ids)
        source = row["completion"][0]["tool_calls"][0]["function"]["arguments"]["source"]
        assert json.dumps(source)[1:40] in trained             # the verified kernel is trained on
        assert "# Target" not in trained and "### Attempt" not in trained   # the context is not
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.slow
def test_kto_trains_on_the_label_column(runs_db, tmp_path):
    """TRL's KTOTrainer takes `--all-verdicts` rows as they are: prompt, completion and a boolean label."""
    pytest.importorskip("trl")
    pytest.importorskip("transformers")
    from trl import KTOConfig, KTOTrainer

    db, _ = runs_db
    out = tmp_path / "kto.jsonl"
    assert run_export(db, out, "--format", "trl", "--all-verdicts").exit_code == 0
    rows = load(out)
    assert sorted(rows["label"]) == [False, False, True, True, True]   # failed submissions: undesirable examples
    tokenizer, model = tiny_model()
    dataset = rows.remove_columns([c for c in rows.column_names if c not in ("prompt", "completion", "label")])
    longest = max(len(json.dumps(r["prompt"])) + len(json.dumps(r["completion"])) for r in rows)
    args = KTOConfig(output_dir=str(tmp_path / "kto"), max_steps=1, per_device_train_batch_size=2,
                     max_length=longest + 512, report_to=[], save_strategy="no", use_cpu=True)
    import copy
    trainer = KTOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=dataset,
                         processing_class=tokenizer)
    assert len(trainer.train_dataset) == len(rows)
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.slow
def test_grpo_step_with_kloops_reward_function(runs_db, tmp_path):
    """GRPOTrainer, one step, with agent.reward.trl_reward: the rl rows' reference_source reaches the reward
    function, which judges each generated completion through the evaluator (a random model writes no kernel:
    every completion is a zero-reward format error)."""
    pytest.importorskip("trl")
    pytest.importorskip("transformers")
    from trl import GRPOConfig, GRPOTrainer

    from agent import reward

    db, ids = runs_db
    out = tmp_path / "rl.jsonl"
    assert run_export(db, out, "--format", "rl", "--run", ids["anthropic"]).exit_code == 0
    rows = load(out)
    seen = []

    def kloop_reward(prompts=None, completions=None, reference_source=None, **kwargs):
        seen.append((len(completions), set(reference_source)))
        return reward.trl_reward(prompts=prompts, completions=completions, reference_source=reference_source)

    tokenizer, model = tiny_model()
    dataset = rows.select(range(2)).remove_columns(
        [c for c in rows.column_names if c not in ("prompt", "reference_source")])
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=16, report_to=[], save_strategy="no", use_cpu=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[kloop_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1
    assert seen and all(n == 2 and sources == {TARGET} for n, sources in seen)
    assert trainer.state.log_history[0]["reward"] == 0.0


@pytest.mark.slow
def test_reward_function_judges_completions_with_the_evaluator():
    """agent.reward turns completions (text, a TRL message list, a verl string) back into kloop verdicts."""
    from agent import reward
    from sandbox.evaluate import Session

    here = Path(__file__).parent
    reference = (here / "targets" / "tiny_add.py").read_text()
    honest = (here / "candidates" / "honest_add.py").read_text()
    wrong = honest.replace("tl.load(a_ptr + offs, mask=mask) +", "tl.load(a_ptr + offs, mask=mask) -")
    with Session(spares=0) as session:
        good = reward.score([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "submit_candidate", "arguments": json.dumps({"language": "triton", "source": honest,
                                                                   "rationale": "plain"})}}]}],
            reference, session=session)
        bad = reward.score(f"Subtract, for once.\n```python\n# language: triton\n{wrong}```", reference,
                           session=session)
    assert (good.verdict, good.reward, good.components["correct"]) == ("correct", 1.0, True)   # untimed on CPU
    assert (bad.verdict, bad.reward) == ("incorrect", 0.1)
    none = reward.score("I am done.", reference)
    assert (none.verdict, none.reward) == ("format_error", 0.0)
    assert reward.compute_score("kloop/tiny_add", "no code here", reference, {"language": "triton"}) == 0.0


def test_exclude_and_split_go_by_the_op(tmp_path):
    """An older release of a problem (sizes, constants, comments changed) excludes runs of the new one; the split
    keeps KernelBench's 23_Softmax and the built-in softmax on one side, whatever the fraction."""
    from test_decontaminate import SOFTMAX_V1, SOFTMAX_V2
    from tools.records.export import _build
    from tools.targets import path_of
    db = tmp_path / "ops.db"
    store = open_db(db)
    targets = {"softmax": path_of("softmax").read_text(), "23_Softmax": SOFTMAX_V2, "vector_add": TARGET,
               "vector_mul": TARGET.replace("x + y", "x * y"), "vector_sub": TARGET.replace("x + y", "x - y")}
    for name, source in targets.items():
        run = store.create_run(target_name=name, target_source=source, policy="offline", model="", versions=VERSIONS)
        store.add_attempt(run, branch=0, turn=1, **attempt_columns("correct", f"# {name}\n" + kernel(64), 20.0))
    store.close()
    rows = _build([db], options(format="kernelbook")).rows
    assert len({r["target"] for r in rows}) == 4     # five targets, four ops
    for fraction in (0.2, 0.4, 0.6, 0.8):
        sides = split_targets((r["target"] for r in rows), fraction)
        side = {r["record"]["entry_point"]: sides[r["target"]] for r in rows}
        assert side["softmax"] == side["23_Softmax"], (fraction, side)
    old = tmp_path / "KernelBench-2024" / "level1"
    old.mkdir(parents=True)
    (old / "23_Softmax.py").write_text(SOFTMAX_V1)
    out = tmp_path / "kb.jsonl"
    result = run_export(db, out, "--format", "kernelbook", "--exclude", str(old.parent))
    assert result.exit_code == 0, result.output
    assert sorted(r["entry_point"] for r in load(out)) == ["vector_add", "vector_mul", "vector_sub"]
    assert re.search(r"^excluded 23_Softmax \(run \w+\): level1/23_Softmax.py, the same problem name and op graph$",
                     result.output, re.M), result.output
    assert re.search(r"^excluded softmax \(run \w+\): level1/23_Softmax.py, the same op graph \(_softmax; sizes",
                     result.output, re.M), result.output
    card = (tmp_path / "README.md").read_text()
    assert "## Decontamination" in card and "- softmax (run" in card and ": 2 run(s)." in card


def test_group_by_target_gives_grpo_groups_with_contrast(runs_db, tmp_path):
    db, ids = runs_db
    by_prompt, summary = build_records([db], options(format="rl"))
    assert summary.groups == {"by": "prompt", "groups": len(by_prompt), "rows": len(by_prompt), "contrast": 0}
    by_target, summary = build_records([db], options(format="rl", group_by="target"))
    # one target, one language: every attempt of the three runs (offline branch 0, anthropic, openai) in one group
    assert len({r["group_id"] for r in by_target}) == 1 and len(by_target) == len(by_prompt)
    assert summary.groups["contrast"] == 1 and len({r["reward"] for r in by_target}) > 1
    out = tmp_path / "rl.parquet"
    result = run_export(db, out, "--format", "verl", "--group-by", "target")
    assert result.exit_code == 0 and "group_id by target: 1 group(s) of 8 row(s); 1 with more than one distinct " \
        "reward" in result.output, result.output
    card = (tmp_path / "README.md").read_text()
    # the compile error and the format error ran nothing
    assert "- rewards judged on: NVIDIA H100 80GB HBM3: 6 row(s); nothing (no kernel ran): 2 row(s)" in card, card
    assert "1 with more than one distinct reward" in card
    bad = run_export(db, out, "--format", "rl", "--group-by", "run")
    assert bad.exit_code == 2 and "unknown --group-by 'run'" in bad.output


def test_exports_into_a_new_folder_are_readable_and_keep_each_others_cards(runs_db, tmp_path):
    folder = tmp_path / "not" / "there" / "yet"
    for name, fmt in (("sft.jsonl", "trl"), ("ft.jsonl", "openai")):
        result = run_export(runs_db[0], folder / name, "--format", fmt)
        assert result.exit_code == 0, result.output
    cards = sorted(p.name for p in folder.glob("*README.md"))
    assert cards == ["README.md", "ft.jsonl.README.md"]                     # the second card beside, not over, the first
    assert "`sft.jsonl`" in (folder / "README.md").read_text()
    assert "`ft.jsonl`" in (folder / "ft.jsonl.README.md").read_text()
    assert (folder / "sft.jsonl").stat().st_mode & 0o777 == 0o666 & ~_umask()   # not mkstemp's 0600
    again = run_export(runs_db[0], folder / "sft.jsonl", "--format", "trl")    # the same export again: its own card
    assert again.exit_code == 0 and sorted(p.name for p in folder.glob("*README.md")) == cards


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask
