"""Turn run databases into training data: TRL / OpenAI chat JSONL, KernelBook-style pairs, per-turn RL records.

Every example ends at one logged submission (an attempt) and carries its provenance, so a dataset row can always be
traced back to the run, attempt and machine it came from. Model runs are rebuilt from the logged requests and
responses (each turn's conversation exactly as the model saw it); offline-policy runs, which have no model requests,
are rebuilt from their attempts with the model policies' own prompts: the target, then per attempt the reasoning plus
a `submit_candidate` call, answered with the evaluator's report on it.

    >>> summary = export(["runs/kloop.db"], "sft.jsonl", ExportOptions(format="trl", turns="last"))
    >>> summary.written
    12
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from agent import prompting
from agent.inspect_tools import SUBMIT, TOOLS, openai_tools
from agent.policy import AttemptView, ProposeContext
from tools.result import EvalResult
from tools.store import Store, StoreError, open_db

FORMATS = ("trl", "openai", "kernelbook", "rl")
TURNS = ("all", "last")
LANGUAGES = ("triton", "ptx")


class ExportError(Exception):
    """The export cannot be done as asked: one line for the user."""


@dataclass
class ExportOptions:
    format: str = "trl"
    turns: str = "all"                 # trl/openai: whole trajectories or one example per submission
    min_speedup: float | None = None   # over eager
    language: str | None = None
    include_rejected: bool = False     # keep trajectories that contain a rejected (rule-breaking) attempt
    all_verdicts: bool = False         # keep incorrect / failed submissions too (RL data)
    run_ids: tuple[str, ...] = ()      # empty: every run of every database


@dataclass
class ExportSummary:
    written: int = 0
    duplicates: int = 0
    runs: int = 0


# -- reading runs ----------------------------------------------------------------------------------------------------

def open_run_db(path: str | os.PathLike) -> Store:
    """An existing run database of this schema version, opened read-only; anything else is an ExportError line."""
    try:
        return open_db(path, create=False, readonly=True)
    except StoreError as e:
        raise ExportError(str(e)) from None


def normalized_kernel_hash(source: str, language: str = "triton") -> str:
    """sha256 of the source with comments and all whitespace removed: reformatted copies of a kernel collide."""
    text = source or ""
    if language == "ptx" or not _is_python(text):
        text = re.sub(r"//[^\n]*|/\*.*?\*/|#[^\n]*", "", text, flags=re.S)
    else:
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        text = " ".join(tok.string for tok in tokens if tok.type not in _LAYOUT_TOKENS)
    return hashlib.sha256(re.sub(r"\s+", "", text).encode()).hexdigest()


_LAYOUT_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                  tokenize.ENDMARKER}


def _is_python(text: str) -> bool:
    try:
        compile(text, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _select_runs(store: Store, run_ids: Iterable[str]) -> list[dict]:
    """The asked-for runs of this database (all of them, oldest first, when none are named)."""
    runs = sorted(store.list_runs(), key=lambda r: (r["created_at"], r["id"]))
    if not runs:
        raise ExportError(f"{store.path} holds no runs")
    wanted = set(run_ids)
    return [r for r in runs if not wanted or r["id"] in wanted]


def _provenance(db_path: Path, run: dict, attempt: dict) -> dict:
    versions = run.get("versions") or {}
    result = attempt.get("result") or {}
    return {
        "db": str(db_path), "run_id": run["id"], "attempt_id": attempt["id"], "attempt_number": attempt["number"],
        "gpu": run.get("gpu_name"),
        "versions": {k: versions.get(k) for k in ("torch", "triton", "cupy", "python")},
        "policy": run.get("policy"), "model": run.get("model"),
        # how the candidate's processes were isolated when it was judged (sandbox/jail.py): weaker modes say so
        "isolation": result.get("isolation") or run.get("isolation"),
    }


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _median_us(attempt: dict) -> float | None:
    timing = attempt.get("time_us")
    return _float(timing.get("median")) if isinstance(timing, dict) else None


# -- conversations ---------------------------------------------------------------------------------------------------
# Internal message shape (TRL's, plus ids): {"role", "content": str, "tool_calls": [{"id", "type": "function",
# "function": {"name", "arguments": dict}}], "name"/"tool_call_id" on tool answers, "reasoning_content" if any}.

@dataclass
class Turn:
    """One submission with the conversation that led to it."""
    attempt: dict
    prompt: list[dict]        # every message before the submitting assistant turn
    completion: dict          # the assistant turn that submitted the attempt
    tools: list[dict]


def _view(row: dict) -> AttemptView:
    """The attempt as the prompts describe it, without its source: the submit call right before already holds it."""
    return AttemptView(
        id=row["id"], number=row["number"], branch=row.get("branch") or 0, language=row.get("language") or "",
        source="", verdict=row.get("verdict") or "", reasons=row.get("reasons") or [],
        time_us=_median_us(row), speedup_eager=row.get("speedup_eager"), speedup_compile=row.get("speedup_compile"),
        sol_fraction=row.get("sol_fraction"), diagnosis=row.get("diagnosis") or "",
        result=EvalResult.from_dict(row.get("result")))


def offline_turns(run: dict, attempts: list[dict]) -> list[Turn]:
    """A branch of an offline-policy run as one conversation built from its attempts, worded with the prompts the
    model policies use: the target, then per attempt the reasoning plus a submit_candidate call, answered with the
    evaluator's report on it."""
    if not attempts:
        return []
    language = (run.get("settings") or {}).get("language") or "auto"
    gpu = next(((a.get("result") or {}).get("gpu") for a in attempts if (a.get("result") or {}).get("gpu")), None)
    ctx = ProposeContext(run_id=run["id"], branch=attempts[0].get("branch") or 0, turn=1,
                         target_name=run.get("target_name") or "", target_source=run.get("target_source") or "",
                         language=language, gpu=gpu, history=[], best=None)
    messages = [{"role": "system", "content": prompting.system_prompt(language, tools=True)},
                {"role": "user", "content": prompting.target_prompt(ctx) + "\n" + prompting.turn_prompt(ctx)}]
    tools = openai_tools([t for t in TOOLS if t["name"] == SUBMIT])
    turns = []
    for attempt in attempts:
        call_id = f"call_{attempt['number']}"
        reasoning = attempt.get("reasoning") or ""
        assistant = {"role": "assistant", "content": reasoning,
                     "tool_calls": [{"id": call_id, "type": "function", "function": {
                         "name": SUBMIT, "arguments": {"language": attempt.get("language") or "triton",
                                                       "source": attempt.get("source") or "", "rationale": reasoning}}}]}
        turns.append(Turn(attempt, list(messages), assistant, tools))
        messages += [assistant, {"role": "tool", "name": SUBMIT, "tool_call_id": call_id,
                                 "content": prompting.attempt_report(_view(attempt))}]
    return turns


def model_turns(attempts: list[dict], messages: list[dict]) -> list[Turn]:
    """A branch of a model run: for each attempt, the last request logged with it and the response to it.
    Messages of no attempt (failed model calls, a policy's closing words) are not submissions and are left out."""
    exchanges: dict[int, tuple[dict, dict]] = {}   # attempt id -> (request, response)
    request = None
    for row in messages:
        if row.get("attempt_id") is None:
            continue
        if row["role"] == "request":
            request = row
        elif row["role"] == "response" and request is not None:
            exchanges[row["attempt_id"]] = (request, row)
            request = None
    turns = []
    for attempt in attempts:
        if attempt["id"] not in exchanges:
            continue
        request, response = exchanges[attempt["id"]]
        prompt, tools = _request_messages(request)
        completion = _response_message(response)
        if prompt is None or completion is None:
            continue
        turns.append(Turn(attempt, prompt, completion, tools))
    return turns


def _provider(row: dict) -> str:
    provider = (row.get("provider") or "").lower()
    if provider in ("anthropic", "openai"):
        return provider
    content = row.get("content")
    if isinstance(content, dict) and ("choices" in content or any(
            isinstance(m, dict) and m.get("role") in ("system", "tool") for m in content.get("messages", []))):
        return "openai"
    return "anthropic"


def _text(content: Any) -> str:
    """Plain text of a string or a list of content blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") in
                           ("text", "input_text", "output_text"))
    return json.dumps(content)


def _request_messages(row: dict) -> tuple[list[dict] | None, list[dict]]:
    body = row.get("content")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None, []
    if _provider(row) == "openai":
        messages = [_openai_message(m) for m in body["messages"]]
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        return messages, tools
    messages = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    names = {}  # tool_use id -> tool name, for the answers
    for m in body["messages"]:
        if isinstance(m.get("content"), str):
            messages.append({"role": m["role"], "content": m["content"]})
        elif m.get("role") == "assistant":
            messages.append(_anthropic_assistant(m["content"], names))
        else:
            texts = []
            for block in m.get("content") or []:
                if block.get("type") == "tool_result":
                    messages.append({"role": "tool", "name": names.get(block.get("tool_use_id"), ""),
                                     "tool_call_id": block.get("tool_use_id", ""), "content": _text(block.get("content"))})
                elif block.get("type") == "text":
                    texts.append(block["text"])
            if texts:
                messages.append({"role": "user", "content": "\n\n".join(texts)})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t["input_schema"]}}
             for t in body.get("tools") or [] if "input_schema" in t]
    return messages, tools


def _anthropic_assistant(blocks: list[dict], names: dict) -> dict:
    message = {"role": "assistant", "content": "\n\n".join(b["text"] for b in blocks if b.get("type") == "text")}
    thinking = "\n\n".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
    if thinking:
        message["reasoning_content"] = thinking
    calls = [b for b in blocks if b.get("type") == "tool_use"]
    if calls:
        names.update({b["id"]: b["name"] for b in calls})
        message["tool_calls"] = [{"id": b["id"], "type": "function",
                                  "function": {"name": b["name"], "arguments": b.get("input") or {}}} for b in calls]
    return message


def _openai_message(m: dict) -> dict:
    role = "system" if m.get("role") == "developer" else m.get("role")
    message = {"role": role, "content": _text(m.get("content"))}
    if m.get("reasoning_content"):
        message["reasoning_content"] = m["reasoning_content"]
    if role == "tool":
        message.update(tool_call_id=m.get("tool_call_id", ""), name=m.get("name", ""))
    if m.get("tool_calls"):
        message["tool_calls"] = [{"id": c.get("id", ""), "type": "function", "function": {
            "name": c["function"]["name"], "arguments": _arguments_dict(c["function"].get("arguments"))}}
            for c in m["tool_calls"]]
    return message


def _arguments_dict(arguments: Any) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"raw": arguments}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _response_message(row: dict) -> dict | None:
    body = row.get("content")
    if not isinstance(body, dict):
        return None
    if _provider(row) == "openai":
        choices = body.get("choices") or []
        return _openai_message(choices[0]["message"]) if choices else None
    if isinstance(body.get("content"), list):
        return _anthropic_assistant(body["content"], {})
    return None


def _name_tool_answers(messages: list[dict]) -> list[dict]:
    """OpenAI-format requests do not name tool answers; TRL wants the name: take it from the call."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls", [])}
    return [dict(m, name=m.get("name") or names.get(m.get("tool_call_id"), "")) if m["role"] == "tool" else m
            for m in messages]


# -- output shapes ---------------------------------------------------------------------------------------------------

def trl_messages(messages: list[dict]) -> list[dict]:
    """TRL conversational: arguments are dicts, tool answers carry the tool's name, no ids."""
    out = []
    for m in _name_tool_answers(messages):
        m = {k: v for k, v in m.items() if k != "tool_call_id"}
        if "tool_calls" in m:
            m["tool_calls"] = [{"type": "function", "function": c["function"]} for c in m["tool_calls"]]
        out.append(m)
    return out


def openai_messages(messages: list[dict]) -> list[dict]:
    """OpenAI fine-tuning: arguments are JSON strings, calls have ids, tool answers carry tool_call_id."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if k not in ("name", "reasoning_content")}
        if "tool_calls" in m:
            m["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]]
        out.append(m)
    return out


def reward_components(attempt: dict) -> dict:
    """What an RL reward is built from; a format_error turn (no candidate) compiled nothing and is zero-reward."""
    verdict = attempt.get("verdict")
    return {
        "verdict": verdict,
        "compiled": verdict in ("correct", "incorrect", "runtime_error", "timeout"),
        "correct": verdict == "correct",
        "speedup_eager": _float(attempt.get("speedup_eager")),
        "speedup_compile": _float(attempt.get("speedup_compile")),
        "sol_fraction": _float(attempt.get("sol_fraction")),
    }


# -- selection -------------------------------------------------------------------------------------------------------

def _qualifies(attempt: dict, options: ExportOptions) -> bool:
    if not options.all_verdicts and attempt.get("verdict") != "correct":
        return False
    if options.language and attempt.get("language") != options.language:
        return False
    if options.min_speedup is not None and (attempt.get("speedup_eager") or 0.0) < options.min_speedup:
        return False
    return True


def breaks_rules(attempt: dict) -> bool:
    """Rejected for what its kernel did. An answer with no candidate (verdict format_error) is a failed turn, not
    cheating, and does not taint its trajectory; databases written before that verdict existed logged it as
    rejected with no source, which is read the same way."""
    return attempt.get("verdict") == "rejected" and bool((attempt.get("source") or "").strip())


def _best(attempts: list[dict]) -> dict:
    """Fastest over eager; without timings the earliest (the shortest trajectory to a working kernel)."""
    return max(attempts, key=lambda a: (a.get("speedup_eager") or 0.0, -a["number"]))


def _clean_branches(attempts: list[dict], options: ExportOptions) -> dict[int, list[dict]]:
    """The run's attempts by branch, leaving out branches with a rule-breaking attempt unless asked for."""
    branches: dict[int, list[dict]] = {}
    for attempt in attempts:
        branches.setdefault(attempt.get("branch") or 0, []).append(attempt)
    return {b: own for b, own in sorted(branches.items())
            if options.include_rejected or not any(breaks_rules(a) for a in own)}


def build_records(db_paths: list[str | os.PathLike], options: ExportOptions) -> tuple[list[dict], ExportSummary]:
    """All export lines for the given databases (deduplicated by kernel), and what was done."""
    _check_options(options)
    summary = ExportSummary()
    records, seen, found = [], set(), set()
    for db_path in db_paths:
        store = open_run_db(db_path)
        try:
            runs = _select_runs(store, options.run_ids)
            found |= {r["id"] for r in runs}
            summary.runs += len(runs)
            for run in runs:
                for attempt, record in _run_records(Path(db_path), store, run, options):
                    source = attempt.get("source") or ""
                    key = normalized_kernel_hash(source, attempt.get("language")) if source.strip() else None
                    if key in seen:   # turns without a kernel (format errors) are never duplicates
                        summary.duplicates += 1
                        continue
                    if key:
                        seen.add(key)
                    records.append(record)
        finally:
            store.close()
    missing = set(options.run_ids) - found
    if missing:
        raise ExportError(f"no run {', '.join(sorted(missing))} in {', '.join(map(str, db_paths))}")
    summary.written = len(records)
    return records, summary


def _check_options(options: ExportOptions) -> None:
    if options.format not in FORMATS:
        raise ExportError(f"unknown format {options.format!r} (one of {', '.join(FORMATS)})")
    if options.turns not in TURNS:
        raise ExportError(f"unknown --turns {options.turns!r} (all or last)")
    if options.language and options.language not in LANGUAGES:
        raise ExportError(f"unknown language {options.language!r} (triton or ptx)")


def _run_records(db_path: Path, store: Store, run: dict, options: ExportOptions):
    """(attempt, line) pairs of one run in the requested format."""
    branches = _clean_branches(store.attempts(run["id"]), options)
    if options.format == "kernelbook":
        pool = [a for own in branches.values() for a in own if _qualifies(a, options)]
        if pool:
            best = _best(pool)
            yield best, _kernelbook_record(db_path, run, best)
        return
    # Offline policies log only their reasoning; a branch is a model conversation when it has requests.
    messages = [m for m in store.messages(run["id"]) if m["role"] in ("request", "response")]
    for branch, own in branches.items():
        own_messages = [m for m in messages if (m.get("branch") or 0) == branch]
        has_requests = any(m["role"] == "request" for m in own_messages)
        turns = model_turns(own, own_messages) if has_requests else offline_turns(run, own)
        chosen = [t for t in turns if _qualifies(t.attempt, options)]
        if not chosen:
            continue
        if options.format in ("trl", "openai") and options.turns == "all":
            # The whole trajectory up to its best kernel (with --all-verdicts: up to its last submission).
            best = _best([t.attempt for t in chosen])
            chosen = [chosen[-1] if options.all_verdicts else next(t for t in chosen if t.attempt is best)]
        for turn in chosen:
            yield turn.attempt, _turn_record(db_path, run, turn, options.format)


def _turn_record(db_path: Path, run: dict, turn: Turn, fmt: str) -> dict:
    provenance = _provenance(db_path, run, turn.attempt)
    if fmt == "rl":
        return {"prompt": trl_messages(turn.prompt), "completion": trl_messages([turn.completion]),
                "tools": turn.tools, **reward_components(turn.attempt), "provenance": provenance}
    shape = trl_messages if fmt == "trl" else openai_messages
    return {"messages": shape(turn.prompt + [turn.completion]), "tools": turn.tools, "provenance": provenance}


def _kernelbook_record(db_path: Path, run: dict, attempt: dict) -> dict:
    source = attempt.get("source") or ""
    return {
        "entry_point": "Model",                 # KernelBench targets name their module Model
        "original_triton_code": source,         # as the agent wrote it (KernelBook: before clean-up)
        "python_code": run.get("target_source") or "",
        "triton_code": source,                  # for ptx kernels: the PTX-launching module
        "repo_name": "kloop",
        "module_name": run.get("target_name") or "",
        "synthetic": True,
        "language": attempt.get("language"),
        "verdict": attempt.get("verdict"),
        "time_us": _median_us(attempt),
        "speedup_eager": _float(attempt.get("speedup_eager")),
        "speedup_compile": _float(attempt.get("speedup_compile")),
        "sol_fraction": _float(attempt.get("sol_fraction")),
        "provenance": _provenance(db_path, run, attempt),
    }


# -- writing ---------------------------------------------------------------------------------------------------------

def write_jsonl_atomic(records: list[dict], out: str | os.PathLike) -> None:
    """Write all lines or nothing: a temp file beside the target, renamed over it when complete."""
    out = Path(out)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise ExportError(f"cannot write {out}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        os.replace(tmp, out)
    except OSError as e:
        os.unlink(tmp)
        raise ExportError(f"cannot write {out}: {e.strerror}") from None
    except BaseException:
        os.unlink(tmp)
        raise


def export(db_paths: list[str | os.PathLike], out: str | os.PathLike, options: ExportOptions) -> ExportSummary:
    """Build the lines of every database and write them to `out` (JSONL, atomically)."""
    if not db_paths:
        raise ExportError("give at least one --db")
    out = Path(out)
    if out.is_dir():
        raise ExportError(f"{out} is a directory: give a file path")
    records, summary = build_records(db_paths, options)
    if not records:
        raise ExportError(f"nothing to export: no {'' if options.all_verdicts else 'verified-correct '}submission "
                          f"in {summary.runs} run(s) passes the filters")
    write_jsonl_atomic(records, out)
    return summary
