"""Turn run databases into training data that trainers take as they are, with no unverified kernel ever trained on.

Formats (`ExportOptions.format`):
  trl        prompt/completion rows: the conversation before a submission is context, the submitting assistant turn
             is the trained part. `train_on="final"`: one row per branch, ending at its best verified kernel;
             `"all-correct"`: one row per verified turn (failed turns stay in the prompt as context only);
             `all_verdicts`: failed submissions as their own rows with label false (KTO).
  openai     chat fine-tuning lines (`messages`, `tools`): `weight: 1` only on verified submissions, 0 on every other
             assistant turn (openai has no label: a failed submission is only ever context); provenance, labels and
             verdicts go to a line-aligned sidecar file.
  rl         one row per turn, every verdict: prompt, completion, reference source, shapes, tolerances, baselines,
             reward components, a scalar reward (tools/records/reward.py), `label`, and a `group_id` (GRPO) per
             prompt or per target (`group_by`).
  verl       the rl rows in verl's parquet schema (data_source, prompt, ability, reward_model, extra_info).
  kernelbook one row per run: the target (python_code) and its best verified kernel, KernelBook's columns.
  flashinfer a FlashInfer Trace directory: definitions/, workloads/, solutions/, traces/.

Every row carries provenance (kloop version, target sha256, where it executed, GPU/driver/CUDA/torch/triton, timing
flags, run and attempt ids, policy/model, the user's license); a dataset card (README.md with a YAML header) is
written next to the export. `exclude` drops every run whose target computes the same op as an evaluation problem
(tools/records/decontaminate.py); `split_by="target"` writes train and test files that share no op. Token counts are exact
with `tokenizer`, else an estimate that errs long (CHARS_PER_TOKEN).

Layering: tools/ never imports agent/. Offline-policy runs log no model requests, so their conversations are
rebuilt with the model policies' wording, which the caller passes as `Prompts` (agent.prompting.export_prompts()).

    >>> from agent.prompting import export_prompts
    >>> summary = export(["runs/kloop.db"], "sft.jsonl", ExportOptions(format="trl", prompts=export_prompts()))
    >>> summary.written
    12
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import statistics
import tempfile
import tokenize
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from tools.records import wire
from tools.records.decontaminate import DecontaminationError, load_problems, match, problem
from tools.records.reward import REWARD_FORMULA, reward_components, scalar_reward
from tools.records.store import Attempt, OFFLINE_MARK, Store, StoreError, fastest_key, offline_marker, open_db
from tools.records.wire import SUBMIT

FORMATS = ("trl", "openai", "rl", "verl", "kernelbook", "flashinfer")
SPLITS = ("train", "test")
TRAIN_ON = ("final", "all-correct")
GROUP_BY = ("prompt", "target")   # rl/verl group_id: rows with the same prompt, or every attempt at one target
LANGUAGES = ("triton", "ptx")
# Without --tokenizer, token counts are an estimate that errs long. Real tokenizers did 2.7-3.0 characters per token on
# kloop's rows (issue 37); a byte-level BPE trained on the exports (results/trainers-round2) did 2.07-3.1 per row
# (median 2.8; PTX and long numbers lowest), so 2.0 leaves every row whole. --tokenizer counts exactly.
CHARS_PER_TOKEN = 2.0
OPENAI_MAX_TOKENS = 65_536   # OpenAI's limit per fine-tuning example
SHOWN_EXCLUSIONS = 10        # excluded runs printed (the card lists every one)
OPENAI_MIN_EXAMPLES = 10


class ExportError(Exception):
    """The export cannot be done as asked: one line for the user."""


@dataclass
class Prompts:
    """The wording of a rebuilt offline-policy conversation, given by the caller (agent.prompting.export_prompts)."""
    system: Callable[[str, bool], str]              # (language, tools) -> the system prompt
    turn: Callable[[dict, dict | None, list[Attempt], int], str]   # (run, gpu, earlier attempts, turn) -> the
                                                    # user message: the target, then this turn's evidence
    submit_tool: dict                               # submit_candidate, chat-completions form


@dataclass
class ExportOptions:
    format: str = "trl"
    train_on: str = "final"            # trl/openai: the best verified turn per branch, or every verified turn
    min_speedup: float | None = None   # over eager (rl/verl: applies to correct turns only)
    language: str | None = None
    include_rejected: bool = False     # keep trajectories that contain a rejected (rule-breaking) attempt
    all_verdicts: bool = False         # trl/openai/kernelbook/flashinfer: failed submissions too, with label/verdict
    run_ids: tuple[str, ...] = ()      # empty: every run of every database
    license: str | None = None         # the dataset's license, set by the user (provenance and card)
    exclude: tuple[str, ...] = ()      # files or folders of evaluation problems whose targets are left out
    split_by: str | None = None        # "target": train and test files that share no target
    test_fraction: float = 0.1         # of the targets, by a stable hash of each (split_by)
    prompts: Prompts | None = None     # needed for offline-policy runs in chat formats
    tokenizer: str | None = None       # a local path or an installed name: exact token counts (else an estimate)
    group_by: str = "prompt"           # rl/verl group_id (GROUP_BY)


@dataclass
class ExportSummary:
    written: int = 0
    duplicates: int = 0                # rows (or trained turns) left out because their kernel was already trained
    excluded: int = 0                  # rows left out because their target is an evaluation problem
    runs: int = 0
    lengths: dict = field(default_factory=dict)   # prompt / trained: {n, chars: {...}, tokens: {...}}
    max_length: int | None = None      # tokens: a trainer's max_length that keeps every row whole
    max_prompt: int | None = None      # tokens: the longest prompt (verl's data.max_prompt_length)
    max_trained: int | None = None     # tokens: the longest trained part (verl's data.max_response_length)
    counted_by: str = ""               # how tokens were counted: "estimate, N characters per token" or the tokenizer
    files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    splits: dict = field(default_factory=dict)    # split_by: "train"/"test" -> {"rows": n, "targets": n (op groups)}
    exclusions: list = field(default_factory=list)   # {"run_id", "target", "problem", "why"} per run left out
    groups: dict = field(default_factory=dict)       # rl/verl: {"by", "groups", "rows", "contrast"}: contrast counts
                                                     # the groups with more than one distinct reward (GRPO learns there)
    untrained: int = 0                 # openai --all-verdicts: failed submissions in no line with a trained turn

    def lines(self) -> list[str]:
        """What `kloop export` prints after the first line."""
        out = []
        for part in ("prompt", "trained"):
            stats = self.lengths.get(part)
            if stats and stats["n"]:
                c, t = stats["chars"], stats["tokens"]
                out.append(f"{part:8s} chars min {c['min']} median {c['median']} p90 {c['p90']} max {c['max']}; "
                           f"tokens min {t['min']} median {t['median']} p90 {t['p90']} max {t['max']}")
        if self.max_length:
            out.append(f"max_length >= {self.max_length} tokens keeps every row whole (TRL max_length; verl "
                       f"data.max_prompt_length >= {self.max_prompt}, data.max_response_length >= {self.max_trained}); "
                       f"tokens: {self.counted_by}")
        if self.groups:
            g = self.groups
            out.append(f"group_id by {g['by']}: {g['groups']} group(s) of {g['rows']} row(s); {g['contrast']} with "
                       "more than one distinct reward (a GRPO group without one teaches nothing)")
        out += [f"{name}: {n['rows']} row(s) from {n['targets']} op(s)" for name, n in self.splits.items()]
        out += [f"excluded {e['target']} (run {e['run_id']}): {e['problem']}, {e['why']}"
                for e in self.exclusions[:SHOWN_EXCLUSIONS]]
        if len(self.exclusions) > SHOWN_EXCLUSIONS:
            out.append(f"... and {len(self.exclusions) - SHOWN_EXCLUSIONS} more excluded run(s), each in the card")
        return out + [f"warning: {w}" for w in self.warnings]


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


def normalized_target_hash(source: str) -> str:
    """The decontamination key of a problem: its source with comments, docstrings and layout removed."""
    text = source or ""
    if _is_python(text):
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        kept, previous = [], tokenize.NEWLINE
        for tok in tokens:
            # a string statement (docstring) starts a logical line: drop it
            if tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                previous = tokenize.STRING
                continue
            if tok.type not in _LAYOUT_TOKENS:
                kept.append(tok.string)
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                previous = tok.type
        text = " ".join(kept)
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


def kloop_version() -> str:
    try:
        from importlib.metadata import version
        return version("kloop")
    except Exception:
        return "unknown"


def _provenance(db_path: Path, run: dict, attempt: Attempt, license: str | None) -> dict:
    """Where a row came from. The GPU is the one the attempt executed on: a CPU-interpreter attempt claims none."""
    versions = dict(run.get("versions") or {})
    result = attempt.result
    versions.update({k: v for k, v in (result.versions or {}).items() if v})
    executed_on = result.executed_on
    gpu = result.gpu if executed_on == "cuda" else None
    run_gpu = run.get("gpu") if isinstance(run.get("gpu"), dict) else {}
    on_gpu = executed_on == "cuda"
    nvml = result.nvml or {}
    flags = list(result.flags or [])
    compile_baseline = (result.baselines or {}).get("compile")
    return {
        "kloop_version": kloop_version(),
        "db": str(Path(db_path).resolve()),
        "run_id": run["id"], "attempt_id": attempt.id, "attempt_number": attempt.number,
        "branch": attempt.branch or 0, "created_at": attempt.created_at,
        "target_name": run.get("target_name"),
        "target_sha256": run.get("target_sha256") or hashlib.sha256((run.get("target_source") or "").encode()).hexdigest(),
        "executed_on": executed_on,
        "checks": int(result.checks or 0),   # tools.result.CHECKS_VERSION of the verdict (0: before versions)
        "gpu": ((gpu or {}).get("name") or (run_gpu or {}).get("name") or run.get("gpu_name")) if on_gpu else None,
        "driver": ((gpu or {}).get("driver") or run.get("driver")) if on_gpu else None,
        "cuda": ((gpu or {}).get("cuda") or versions.get("cuda") or run.get("cuda")) if on_gpu else None,
        "versions": {k: versions.get(k) for k in ("torch", "triton", "cupy", "python")},
        "timing": {"flags": flags, "throttled": bool(nvml.get("throttled")),
                   "remeasured": any("measured again" in f or "re-measured" in f or "remeasured" in f for f in flags),
                   "derived_compile_baseline": bool(compile_baseline and compile_baseline.derived_from_eager),
                   "timed": result.time_us is not None and on_gpu},
        "policy": run.get("policy"), "model": run.get("model") or None,
        # how the candidate's processes were isolated when it was judged (sandbox/jail.py): weaker modes say so
        "isolation": result.isolation or run.get("isolation"),
        "license": license,
    }


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# -- conversations ---------------------------------------------------------------------------------------------------
# Logged requests and responses are read by each provider's wire module (tools/records/wire/), into its conversation shape
# (TRL's, plus ids): {"role", "content": str, "tool_calls": [{"id", "type": "function", "function": {"name",
# "arguments": dict}}], "name"/"tool_call_id" on tool answers, "reasoning_content" if any}.

@dataclass
class Turn:
    """One submission with the conversation that led to it."""
    attempt: Attempt
    prompt: list[dict]        # every message before the submitting assistant turn
    completion: dict          # the assistant turn that submitted the attempt
    tools: list[dict]
    context: list[Attempt] = field(default_factory=list)   # attempts submitted earlier in `prompt`, in order


def offline_turns(run: dict, attempts: list[Attempt], prompts: Prompts | None, text: bool = False) -> list[Turn]:
    """A branch of an offline-policy run as the requests a model policy would have sent: per attempt, a fresh
    conversation (system prompt; the target and this turn's evidence, i.e. the earlier attempts, the last few in full)
    answered by a submit_candidate call carrying the attempt (with `text`: kloop's plain-text protocol, a fenced
    block). Like a model run's, each prompt stays bounded however long the run was."""
    if not attempts:
        return []
    if prompts is None:
        raise ExportError("offline-policy runs are rebuilt with the model prompts: pass ExportOptions.prompts "
                          "(agent.prompting.export_prompts())")
    language = (run.get("settings") or {}).get("language") or "auto"
    gpu = next((a.result.gpu for a in attempts if a.result.executed_on == "cuda"), None)
    system = {"role": "system", "content": prompts.system(language, not text)}
    tools = [] if text else [prompts.submit_tool]
    turns = []
    for i, attempt in enumerate(attempts):
        reasoning = attempt.reasoning or ""
        lang = attempt.language or "triton"
        source = without_offline_mark(attempt.source or "")
        if text:
            assistant = {"role": "assistant", "content": f"{reasoning}\n\n```python\n# language: {lang}\n"
                                                         f"{source.rstrip()}\n```".lstrip()}
        else:   # the reasoning once, as the call's rationale
            assistant = {"role": "assistant", "content": "",
                         "tool_calls": [{"id": f"call_{attempt.number}", "type": "function", "function": {
                             "name": SUBMIT, "arguments": {"language": lang, "source": source,
                                                           "rationale": reasoning}}}]}
        user = {"role": "user", "content": prompts.turn(run, gpu, attempts[:i], i + 1)}
        turns.append(Turn(attempt, [system, user], assistant, tools, list(attempts[:i])))
    return turns


def without_offline_mark(source: str) -> str:
    """An offline-policy kernel without its first line, the policy's own note of the template it rendered (a comment
    no model should learn to write)."""
    return source.split("\n", 1)[1] if source.startswith(OFFLINE_MARK) and "\n" in source else source


def model_turns(attempts: list[Attempt], messages: list[dict]) -> list[Turn]:
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
        if attempt.id not in exchanges:
            continue
        request, response = exchanges[attempt.id]
        prompt, tools = _request_messages(request)
        completion = _response_message(response)
        if prompt is None or completion is None:
            continue
        turns.append(Turn(attempt, prompt, completion, tools))
    return turns


def _request_messages(row: dict) -> tuple[list[dict] | None, list[dict]]:
    return wire.module(wire.provider_of(row)).read_request(row.get("content"))


def _response_message(row: dict) -> dict | None:
    reply = wire.read_response(wire.provider_of(row), row.get("content"))
    return reply.as_message() if reply is not None else None


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


def openai_messages(messages: list[dict], weights: dict[int, int] | None = None) -> list[dict]:
    """OpenAI fine-tuning: arguments are JSON strings, calls have ids, tool answers carry tool_call_id, an assistant
    turn with tool calls and no text has no content key, and every assistant turn has a weight (0 unless given)."""
    out = []
    for i, m in enumerate(messages):
        m = {k: v for k, v in m.items() if k not in ("name", "reasoning_content")}
        if "tool_calls" in m:
            m["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]]
            if not m.get("content"):
                m.pop("content", None)
        if m["role"] == "assistant":
            m["weight"] = (weights or {}).get(i, 0)
        out.append(m)
    return out


def plain_messages(messages: list[dict]) -> list[dict]:
    """Role and text only (verl's prompt): a submission becomes the fenced block of kloop's plain-text protocol,
    a tool's answer a user message."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            args = call["function"]["arguments"]
            if call["function"]["name"] == SUBMIT and isinstance(args, dict):
                content += (f"\n\n```python\n# language: {args.get('language') or 'triton'}\n"
                            f"{(args.get('source') or '').rstrip()}\n```")
            else:
                content += f"\n\n[{call['function']['name']}({json.dumps(args)})]"
        role = "user" if m["role"] == "tool" else m["role"]
        out.append({"role": role, "content": content.strip()})
    return out


# -- target facts (rl, verl, flashinfer) ------------------------------------------------------------------------------

_FACTS: dict[str, dict] = {}


def target_facts(source: str) -> dict:
    """The checked shapes and the input/output tensors of a target, found by running its reference on the meta device
    (as tools.target does); {"error": ...} when that fails. Shapes are a deterministic function of the source."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key in _FACTS:
        return _FACTS[key]
    facts: dict = {}
    try:
        import inspect
        import warnings

        import torch

        from tools.target import Target, module_from_source, size_constants

        module = module_from_source(source, {}, f"kloop_export_{key[:12]}")
        target = Target(name="export", path=Path("<export>"), source=source, module=module, builtin=False)
        facts["sizes"] = {k: list(v) if isinstance(v, (tuple, list)) else v for k, v in size_constants(source).items()}
        facts["shapes"] = {"gpu": target.shapes(small=False), "cpu_interpreter": target.shapes(small=True)}
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad(), torch.device("meta"):
            warnings.simplefilter("ignore")
            inputs = module.get_inputs()
            init = module.get_init_inputs()
            outputs = module.Model(*init)(*inputs)
        names = [p for p in inspect.signature(module.Model.forward).parameters if p != "self"]
        names = [n for n in names if not n.startswith("*")] or []
        facts["inputs"] = [_tensor_fact(names[i] if i < len(names) else f"input_{i}", x) for i, x in enumerate(inputs)]
        outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
        facts["outputs"] = [_tensor_fact("output" if len(outputs) == 1 else f"output_{i}", x)
                            for i, x in enumerate(outputs)]
        facts["init_inputs"] = json.loads(json.dumps(init)) if _jsonable(init) else None
    except Exception as e:   # a target that cannot run on meta still exports, without these facts
        facts = {"error": f"{type(e).__name__}: {e}"[:300]}
    _FACTS[key] = facts
    return facts


def _tensor_fact(name: str, value: Any) -> dict:
    shape = list(getattr(value, "shape", ()) or ())
    dtype = str(getattr(value, "dtype", type(value).__name__)).replace("torch.", "")
    return {"name": name, "shape": [int(s) for s in shape], "dtype": dtype, "tensor": hasattr(value, "shape"),
            **({} if hasattr(value, "shape") else {"value": value if _jsonable(value) else repr(value)})}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _tolerances(facts: dict) -> dict:
    """The evaluator's own tolerances (tools/verify.py), by dtype name, for the target's outputs: an export states
    what was judged. Outputs that are not floating point must match exactly (verify.compare)."""
    from tools.verify import TOLERANCES

    judged = {str(dtype).removeprefix("torch."): list(pair) for dtype, pair in TOLERANCES.items()}
    judged["integer/bool"] = [0.0, 0.0]
    dtypes = {o["dtype"] for o in facts.get("outputs") or []}
    table = {d: judged.get(d, judged["integer/bool"]) for d in sorted(dtypes)} or judged
    return {"rule": "|out - ref| <= atol + rtol * |ref|; NaN/inf at the same positions", "atol_rtol": table}


# -- selection -------------------------------------------------------------------------------------------------------

def _qualifies(attempt: Attempt, options: ExportOptions, all_verdicts: bool | None = None) -> bool:
    all_verdicts = options.all_verdicts if all_verdicts is None else all_verdicts
    correct = attempt.verdict == "correct"
    if not all_verdicts and not correct:
        return False
    if options.language and attempt.language != options.language:
        return False
    if correct and options.min_speedup is not None and (attempt.speedup_eager or 0.0) < options.min_speedup:
        return False
    if not correct and options.min_speedup is not None and not all_verdicts:
        return False
    return True


def breaks_rules(attempt: Attempt) -> bool:
    """Rejected for what its kernel did. An answer with no candidate (verdict format_error) is a failed turn, not
    cheating, and does not taint its trajectory; databases written before that verdict existed logged it as
    rejected with no source, which is read the same way."""
    return attempt.verdict == "rejected" and bool((attempt.source or "").strip())


def _clean_branches(attempts: list[Attempt], options: ExportOptions) -> dict[int, list[Attempt]]:
    """The run's attempts by branch, leaving out branches with a rule-breaking attempt unless asked for."""
    branches: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        branches.setdefault(attempt.branch, []).append(attempt)
    return {b: own for b, own in sorted(branches.items())
            if options.include_rejected or not any(breaks_rules(a) for a in own)}


def _kernel_key(run: dict, attempt: Attempt) -> str | None:
    """The same kernel for the same target is one training example; a turn without a kernel has no key."""
    source = attempt.source or ""
    if not source.strip():
        return None
    return (run.get("target_sha256") or hashlib.sha256((run.get("target_source") or "").encode()).hexdigest()) + \
        ":" + normalized_kernel_hash(source, attempt.language)


class _Builder:
    """Rows of every database in one format, deduplicated by trained kernel, with their provenance."""

    def __init__(self, options: ExportOptions) -> None:
        self.options = options
        self.summary = ExportSummary()
        self.rows: list[dict] = []         # {"record", "sidecar", "prompt_text", "trained_text", ...}
        self.trained: set[str] = set()     # kernel keys already trained on (or, in rl/flashinfer, already written)
        try:
            self.exclude = load_problems(options.exclude) if options.exclude else []
        except DecontaminationError as e:
            raise ExportError(str(e)) from None
        self.flashinfer: dict = {"definitions": {}, "workloads": {}, "solutions": [], "traces": []}
        self.target = ""                   # the op group of the run being read (split_by: one side per op)

    def run(self, db_path: Path, store: Store, run: dict) -> None:
        target = problem(run.get("target_source") or "", run.get("target_name") or run["id"])
        self.target = target.group   # every row _add makes is this run's
        matched = match(target, self.exclude) if self.exclude else None
        if matched:
            self.summary.excluded += 1
            self.summary.exclusions.append({"run_id": run["id"], "target": target.name, "problem": matched[0].name,
                                            "why": matched[1]})
            return
        fmt = self.options.format
        branches = _clean_branches(store.attempts(run["id"]), self.options)
        if fmt in ("kernelbook", "flashinfer"):
            self._kernels(db_path, run, branches)
            return
        messages = [m for m in store.messages(run["id"]) if m["role"] in ("request", "response")]
        for branch, own in branches.items():
            own_messages = [m for m in messages if (m.get("branch") or 0) == branch]
            if any(m["role"] == "request" for m in own_messages):
                turns = model_turns(own, own_messages)
            else:
                turns = offline_turns(run, own, self.options.prompts, text=fmt == "verl")
            if fmt in ("rl", "verl"):
                self._rl(db_path, run, turns)
            else:
                self._sft(db_path, run, turns)

    # trl / openai
    def _sft(self, db_path: Path, run: dict, turns: list[Turn]) -> None:
        """The trained turns (verified only: the best per branch, or every one) and, with all_verdicts, the failed
        submissions: trl rows with label false; openai context with weight 0 (it has no label)."""
        options = self.options
        verified = [t for t in turns if _qualifies(t.attempt, options, all_verdicts=False)]
        if options.train_on == "final" and verified:
            # the fastest; without timings the earliest (the shortest trajectory to a working kernel)
            verified = [min(verified, key=lambda t: fastest_key(t.attempt))]
        failed = []
        if options.all_verdicts:
            # final: the failed submissions on the way to the best verified turn (all of them where none verified)
            until = verified[-1].attempt.number if options.train_on == "final" and verified else math.inf
            failed = [t for t in turns if t.attempt.verdict != "correct" and t.attempt.number < until
                      and _qualifies(t.attempt, options)]
        chosen = sorted(verified + failed, key=lambda t: t.attempt.number)
        fresh = []
        for turn in chosen:
            key = _kernel_key(run, turn.attempt)
            if key is not None and key in self.trained:
                self.summary.duplicates += 1     # this kernel is in the export already: not twice
                continue
            if key is not None:
                self.trained.add(key)
            fresh.append(turn)
        if options.format == "trl":
            for turn in fresh:
                self._trl_row(db_path, run, turn)
        else:
            self._openai_rows(db_path, run, fresh)

    def _labels(self, turn: Turn) -> dict:
        verdict = turn.attempt.verdict
        return {"label": verdict == "correct", "verdict": verdict,
                "verdicts": [a.verdict for a in turn.context] + [verdict]}

    def _trl_row(self, db_path: Path, run: dict, turn: Turn) -> None:
        prompt, completion = trl_messages(turn.prompt), trl_messages([turn.completion])
        record = {"prompt": prompt, "completion": completion, "tools": json.dumps(turn.tools),
                  **self._labels(turn), "provenance": _provenance(db_path, run, turn.attempt, self.options.license)}
        self._add(record, _text_of(prompt) + json.dumps(turn.tools), _text_of(completion),
                  chat=(prompt, completion, turn.tools))

    def _openai_rows(self, db_path: Path, run: dict, turns: list[Turn]) -> None:
        """One line per chain of turns: where a later turn's prompt continues an earlier line (a conversation that
        went on), the line grows. Only verified submissions carry weight 1; a failed one (all_verdicts) is context
        with weight 0, and a line with nothing to train is left out (OpenAI reads no label: trl has KTO rows)."""
        line: dict | None = None
        for turn in turns:
            if line and turn.prompt[:len(line["messages"])] == line["messages"]:
                line["messages"] = turn.prompt + [turn.completion]
            else:
                if line:
                    self._openai_line(db_path, run, line)
                line = {"messages": turn.prompt + [turn.completion], "weights": {}, "turns": [], "tools": turn.tools}
            if turn.attempt.verdict == "correct":
                line["weights"][len(line["messages"]) - 1] = 1
            line["turns"].append(turn)
        if line:
            self._openai_line(db_path, run, line)

    def _openai_line(self, db_path: Path, run: dict, line: dict) -> None:
        trained = [t for t in line["turns"] if t.attempt.verdict == "correct"]
        if not trained:
            self.summary.untrained += len(line["turns"])
            return
        messages = openai_messages(line["messages"], line["weights"])
        record = {"messages": messages, "tools": line["tools"]}
        last = trained[-1]
        sidecar = {**self._labels(last), "trained_attempts": [t.attempt.number for t in trained],
                   "context_attempts": [t.attempt.number for t in line["turns"] if t not in trained],
                   "provenance": _provenance(db_path, run, last.attempt, self.options.license)}
        weighted = [m for m in messages if m.get("weight") == 1]
        rest = [m for m in messages if m.get("weight") != 1]
        first = next(i for i, m in enumerate(messages) if m.get("weight") == 1)
        chat = trl_messages(line["messages"])
        self._add(record, _text_of(rest) + json.dumps(line["tools"]), _text_of(weighted), sidecar=sidecar,
                  chat=(chat[:first], chat[first:], line["tools"]))

    # rl / verl
    def _rl(self, db_path: Path, run: dict, turns: list[Turn]) -> None:
        source = run.get("target_source") or ""
        facts = target_facts(source)
        for turn in turns:
            attempt = turn.attempt
            if not _qualifies(attempt, self.options, all_verdicts=True):
                continue
            key = _kernel_key(run, attempt)
            if key is not None and key in self.trained:
                self.summary.duplicates += 1
                continue
            if key is not None:
                self.trained.add(key)
            components = reward_components(attempt.to_dict())   # the reward reads the row as stored
            reward = scalar_reward(components)
            if self.options.group_by == "target":   # every attempt at this target, across runs and turns
                group = f"target:{normalized_target_hash(source)}:{attempt.language or ''}"
            else:
                group = json.dumps(plain_messages(turn.prompt), sort_keys=True)
            group_id = hashlib.sha256(group.encode()).hexdigest()[:16]
            baselines = _baselines(run, attempt)
            provenance = _provenance(db_path, run, attempt, self.options.license)
            shapes = {"sizes": facts.get("sizes"), **(facts.get("shapes") or {}),
                      "executed": "cpu_interpreter" if provenance["executed_on"] != "cuda" else "gpu",
                      "rule": "derived from reference_source by tools.target (deterministic); inputs are seeded by "
                              "the evaluator's secret, never stored"}
            if self.options.format == "rl":
                prompt, completion = trl_messages(turn.prompt), trl_messages([turn.completion])
                record = {"prompt": prompt, "completion": completion, "tools": json.dumps(turn.tools),
                          "group_id": group_id, "reward": reward, "label": components["correct"],
                          "reward_components": components, "verdict": attempt.verdict,
                          "reasons": list(attempt.reasons or []), "language": attempt.language,
                          "target_name": run.get("target_name"), "reference_source": source,
                          "shapes": shapes, "tolerances": _tolerances(facts), "baselines_us": baselines,
                          "provenance": provenance}
            else:
                prompt, completion = plain_messages(turn.prompt), plain_messages([turn.completion])
                record = {"data_source": f"kloop/{run.get('target_name') or 'target'}", "prompt": prompt,
                          "ability": "gpu-kernel-optimization",
                          "reward_model": {"style": "rule", "ground_truth": source},
                          "extra_info": {"index": len(self.rows), "group_id": group_id,
                                         "target_name": run.get("target_name") or "",
                                         "target_sha256": provenance["target_sha256"],
                                         "language": attempt.language or "",
                                         "verdict": attempt.verdict or "", "label": components["correct"],
                                         "reward": reward, "response": completion[0]["content"],
                                         "reward_components": json.dumps(components),
                                         "shapes": json.dumps(shapes), "tolerances": json.dumps(_tolerances(facts)),
                                         "baselines_us": json.dumps(baselines),
                                         "provenance": json.dumps(provenance, default=str)}}
            self._add(record, _text_of(prompt) + json.dumps(turn.tools), _text_of(completion),
                      chat=(prompt, completion, turn.tools if self.options.format == "rl" else []))
            self.rows[-1].update(group=group_id, reward=reward)

    # kernelbook / flashinfer
    def _kernels(self, db_path: Path, run: dict, branches: dict[int, list[Attempt]]) -> None:
        attempts = [a for own in branches.values() for a in own]
        pool = [a for a in attempts if _qualifies(a, self.options) and (a.source or "").strip()]
        if not pool:
            return
        if self.options.format == "kernelbook":   # one row per run: its fastest verified kernel (else its last)
            correct = [a for a in pool if a.verdict == "correct"]
            pool = [min(correct, key=fastest_key)] if correct else [pool[-1]]
        for attempt in pool:
            key = _kernel_key(run, attempt)
            if key in self.trained:
                self.summary.duplicates += 1
                continue
            self.trained.add(key)
            if self.options.format == "kernelbook":
                record = _kernelbook_record(db_path, run, attempt, attempts, self.options.license)
                self._add(record, record["python_code"], record["triton_code"] or record["ptx_code"] or "")
            else:
                self._flashinfer(db_path, run, attempt)

    def _flashinfer(self, db_path: Path, run: dict, attempt: Attempt) -> None:
        facts = target_facts(run.get("target_source") or "")
        provenance = _provenance(db_path, run, attempt, self.options.license)
        definition = flashinfer_definition(run, facts)
        self.flashinfer["definitions"][definition["name"]] = definition
        workload = flashinfer_workload(definition, facts, provenance)
        self.flashinfer["workloads"].setdefault(definition["name"], {})[workload["uuid"]] = workload
        solution = flashinfer_solution(definition, run, attempt, facts, provenance)
        trace = flashinfer_trace(definition, workload, solution, attempt, provenance)
        self.flashinfer["solutions"].append(solution)
        self.flashinfer["traces"].append(trace)
        self._add({"solution": solution, "trace": trace, "provenance": provenance}, definition["reference"],
                  solution["sources"][0]["content"])

    def _add(self, record: dict, prompt_text: str, trained_text: str, sidecar: dict | None = None,
             chat: tuple[list[dict], list[dict], list[dict]] | None = None) -> None:
        """One row; `chat` (prompt messages, trained messages, tools) is what a tokenizer's chat template renders."""
        self.rows.append({"record": record, "sidecar": sidecar, "prompt_text": prompt_text,
                          "trained_text": trained_text, "chat": chat, "prompt": len(prompt_text),
                          "trained": len(trained_text), "target": self.target})


def _baselines(run: dict, attempt: Attempt) -> dict:
    """Median eager / torch.compile times (us) the attempt was compared with; None where untimed."""
    medians = {name: timing.median for name, timing in (attempt.result.baselines or {}).items()} or \
        {name: (timing or {}).get("median") for name, timing in (run.get("baselines") or {}).items()}
    return {name: _float(medians.get(name)) for name in ("eager", "compile")}


def _text_of(messages: list[dict]) -> str:
    parts = []
    for m in messages:
        parts.append(m.get("content") or "")
        parts.append(m.get("reasoning_content") or "")
        for call in m.get("tool_calls") or []:
            args = call["function"]["arguments"]
            parts.append(call["function"]["name"] + (args if isinstance(args, str) else json.dumps(args)))
    return "".join(parts)


def _starter(attempt: Attempt, attempts: list[Attempt]) -> str | None:
    """The generated starter a kernel was derived from: for the offline policy, the run's first attempt rendered
    from the same template (catalog starter or --seed-kernel); None where no starter was used (model policies)."""
    template = _template_of(attempt.source or "")
    if template is None:
        return None
    for other in sorted(attempts, key=lambda a: a.number):
        if _template_of(other.source or "") == template:
            return without_offline_mark(other.source or "")
    return None


def _template_of(source: str) -> str | None:
    return (offline_marker(source) or {}).get("template")


def _kernelbook_record(db_path: Path, run: dict, attempt: Attempt, attempts: list[Attempt], license: str | None) -> dict:
    source = without_offline_mark(attempt.source or "")
    ptx = attempt.language == "ptx"
    provenance = _provenance(db_path, run, attempt, license)
    return {
        "uuid": int(hashlib.sha256(f"{run['id']}:{attempt.id}:{source}".encode()).hexdigest()[:15], 16),
        "entry_point": run.get("target_name") or "Model",   # the op's name; the module class is always Model
        "python_code": run.get("target_source") or "",
        "triton_code": None if ptx else source,
        "ptx_code": source if ptx else None,            # the PTX-launching module, never in triton_code
        "original_triton_code": _starter(attempt, attempts),   # the generated starter it came from, if any
        "repo_name": "kloop",
        "module_name": run.get("target_name") or "",
        "synthetic": True,
        "licenses": [license] if license else [],
        "stars": 0,
        "sha": provenance["target_sha256"],
        "repo_link": f"kloop://{run['id']}/{attempt.number}",
        "language": attempt.language,
        "verdict": attempt.verdict,
        "label": attempt.verdict == "correct",
        "time_us": _float(attempt.median_us),
        "speedup_eager": _float(attempt.speedup_eager),
        "speedup_compile": _float(attempt.speedup_compile),
        "sol_fraction": _float(attempt.sol_fraction),
        "provenance": provenance,
    }


# -- FlashInfer Trace ------------------------------------------------------------------------------------------------
# Field names follow flashinfer_bench.data (Definition, Workload, Solution, Trace/Evaluation).
FLASHINFER_STATUS = {"correct": "PASSED", "incorrect": "INCORRECT_NUMERICAL", "compile_error": "COMPILE_ERROR",
                     "runtime_error": "RUNTIME_ERROR", "timeout": "TIMEOUT", "rejected": "COMPILE_ERROR"}
_FI_DTYPES = {"float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "bool"}


def flashinfer_definition(run: dict, facts: dict) -> dict:
    source = run.get("target_source") or ""
    name = f"{_slug(run.get('target_name') or 'target')}_{normalized_target_hash(source)[:8]}"
    sizes = {k: v for k, v in (facts.get("sizes") or {}).items() if isinstance(v, int)}
    axes: dict[str, dict] = {}

    def spec(tensor: dict) -> dict:
        dims = []
        for j, size in enumerate(tensor["shape"]):
            named = next((k for k, v in sizes.items() if v == size), None)
            if named:
                axes.setdefault(named, {"type": "var"})
                dims.append(named)
            else:
                axis = f"{tensor['name']}_d{j}"
                axes[axis] = {"type": "const", "value": size}
                dims.append(axis)
        dtype = tensor["dtype"] if tensor["dtype"] in _FI_DTYPES else "float32"
        return {"shape": dims, "dtype": dtype}

    inputs = {t["name"]: spec(t) for t in facts.get("inputs") or [] if t.get("tensor")}
    outputs = {t["name"]: spec(t) for t in facts.get("outputs") or [] if t.get("tensor")}
    args = ", ".join(inputs) or "*inputs"
    reference = (source.rstrip() + "\n\n\n_kloop_model = None\n\n\ndef run(" + args + "):\n"
                 "    \"\"\"FlashInfer entry point: the KernelBench Model, built once (seed 0) with get_init_inputs().\"\"\"\n"
                 "    global _kloop_model\n    if _kloop_model is None:\n        torch.manual_seed(0)\n"
                 "        _kloop_model = Model(*get_init_inputs())\n"
                 f"    return _kloop_model({args})\n")
    return {"name": name, "op_type": "kloop", "axes": axes, "inputs": inputs, "outputs": outputs,
            "reference": reference, "tags": ["kloop", f"kloop:target:{run.get('target_name')}"],
            "description": f"kloop target {run.get('target_name')} (KernelBench-style module, entry run())",
            **({"constraints": []} if facts.get("error") is None else {"description":
                f"kloop target {run.get('target_name')}; shapes unknown: {facts['error']}"})}


def flashinfer_workload(definition: dict, facts: dict, provenance: dict) -> dict:
    """The shape the attempt was judged at: the main GPU shape, or the CPU-interpreter one."""
    shapes = facts.get("shapes") or {}
    main = ((shapes.get("gpu") if provenance["executed_on"] == "cuda" else shapes.get("cpu_interpreter")) or [{}])[0]
    sizes = {k: v for k, v in (facts.get("sizes") or {}).items() if isinstance(v, int)}
    axes = {k: int(main.get(k, sizes[k])) for k, a in definition["axes"].items() if a["type"] == "var" and k in sizes}
    inputs = {name: {"type": "random"} for name in definition["inputs"]}
    for t in facts.get("inputs") or []:
        if not t.get("tensor"):
            inputs[t["name"]] = {"type": "scalar", "value": t.get("value")}
    uid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"kloop:{definition['name']}:{json.dumps(axes, sort_keys=True)}"))
    return {"axes": axes, "inputs": inputs, "uuid": uid}


def flashinfer_solution(definition: dict, run: dict, attempt: Attempt, facts: dict, provenance: dict) -> dict:
    args = ", ".join(definition["inputs"]) or "*inputs"
    init = facts.get("init_inputs")
    wrapper = ("import torch\n\nfrom kernel import ModelNew\n\n_model = None\n\n\ndef run(" + args + "):\n"
               "    global _model\n    if _model is None:\n        torch.manual_seed(0)\n"
               f"        _model = ModelNew(*{json.dumps(init if init is not None else [])})\n"
               f"    return _model({args})\n")
    hardware = provenance["gpu"] or "cpu-interpreter"
    return {"name": f"kloop_{run['id']}_{attempt.number}", "definition": definition["name"],
            "author": f"kloop-{run.get('policy') or 'unknown'}" + (f"-{_slug(run['model'])}" if run.get("model") else ""),
            "spec": {"language": "triton" if attempt.language != "ptx" else "python",
                     "target_hardware": [hardware], "entry_point": "main.py::run",
                     "dependencies": ["torch", "triton"] + (["cupy", "kloop (tools.launch)"]
                                                            if attempt.language == "ptx" else [])},
            "sources": [{"path": "kernel.py", "content": without_offline_mark(attempt.source or "")},
                        {"path": "main.py", "content": wrapper}],
            "description": (attempt.reasoning or "")[:500]}


def flashinfer_trace(definition: dict, workload: dict, solution: dict, attempt: Attempt, provenance: dict) -> dict:
    verdict = attempt.verdict
    status = FLASHINFER_STATUS.get(verdict, "RUNTIME_ERROR")
    evaluation = {"status": status,
                  "environment": {"hardware": provenance["gpu"] or "cpu-interpreter",
                                  "libs": {k: str(v) for k, v in {**provenance["versions"], "cuda": provenance["cuda"],
                                                                  "driver": provenance["driver"]}.items() if v}},
                  "timestamp": attempt.created_at or datetime.now(timezone.utc).isoformat(),
                  "log": "\n".join(attempt.reasons or [])[:4000]}
    correctness = attempt.result.correctness
    if status in ("PASSED", "INCORRECT_NUMERICAL"):
        evaluation["correctness"] = {
            "max_relative_error": float(correctness.max_rel_err or 0.0) if correctness else 0.0,
            "max_absolute_error": float(correctness.max_abs_err or 0.0) if correctness else 0.0,
            "extra": {"kloop_trials": correctness.trials if correctness else None,
                      "kloop_shapes": correctness.shapes if correctness else None}}
    if status == "PASSED":
        median, eager = _float(attempt.median_us), _baselines({}, attempt).get("eager")
        timed = median is not None and provenance["executed_on"] == "cuda"
        evaluation["performance"] = {"latency_ms": median / 1000 if timed else 0.0,
                                     "reference_latency_ms": eager / 1000 if timed and eager else 0.0,
                                     "speedup_factor": float(attempt.speedup_eager or 0.0) if timed else 0.0}
    return {"definition": definition["name"], "workload": workload, "solution": solution["name"],
            "evaluation": evaluation}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_").lower() or "x"


# -- building --------------------------------------------------------------------------------------------------------

def build_records(db_paths: list[str | os.PathLike], options: ExportOptions) -> tuple[list[dict], ExportSummary]:
    """All export rows for the given databases (deduplicated by trained kernel), and what was done."""
    builder = _build(db_paths, options)
    return [row["record"] for row in builder.rows], builder.summary


def _build(db_paths: list[str | os.PathLike], options: ExportOptions) -> _Builder:
    _check_options(options)
    builder = _Builder(options)
    found = set()
    for db_path in db_paths:
        store = open_run_db(db_path)
        try:
            runs = _select_runs(store, options.run_ids)
            found |= {r["id"] for r in runs}
            builder.summary.runs += len(runs)
            for run in runs:
                builder.run(Path(db_path), store, run)
        finally:
            store.close()
    missing = set(options.run_ids) - found
    if missing:
        raise ExportError(f"no run {', '.join(sorted(missing))} in {', '.join(map(str, db_paths))}")
    builder.summary.written = len(builder.rows)
    summary = builder.summary
    if options.format in ("rl", "verl") and builder.rows:
        rewards: dict[str, set] = {}
        for row in builder.rows:
            rewards.setdefault(row["group"], set()).add(row["reward"])
        summary.groups = {"by": options.group_by, "groups": len(rewards), "rows": len(builder.rows),
                          "contrast": sum(len(r) > 1 for r in rewards.values())}
    counter = TokenCounter(options.tokenizer)
    summary.lengths, summary.max_length, summary.max_prompt, summary.max_trained = length_stats(builder.rows, counter)
    summary.counted_by = counter.name
    if options.format == "openai":
        over = sum(row["tokens"][0] + row["tokens"][1] > OPENAI_MAX_TOKENS for row in builder.rows)
        if over:
            summary.warnings.append(f"{over} of {len(builder.rows)} line(s) exceed OpenAI's {OPENAI_MAX_TOKENS:,}-"
                                    f"token example limit ({counter.name}): filter them (--language, --train-on "
                                    "final) or expect OpenAI to refuse the file")
    if builder.summary.untrained:
        builder.summary.warnings.append(f"{builder.summary.untrained} failed submission(s) left out: an openai line "
                                        "has no label, so a failed turn is only context (weight 0) before a verified "
                                        "one; --format trl --all-verdicts writes them as label-false rows (KTO)")
    if options.format == "openai" and 0 < len(builder.rows) < OPENAI_MIN_EXAMPLES:
        builder.summary.warnings.append(f"{len(builder.rows)} example(s): OpenAI fine-tuning needs at least "
                                        f"{OPENAI_MIN_EXAMPLES}")
    return builder


def _check_options(options: ExportOptions) -> None:
    if options.format not in FORMATS:
        raise ExportError(f"unknown format {options.format!r} (one of {', '.join(FORMATS)})")
    if options.train_on not in TRAIN_ON:
        raise ExportError(f"unknown --train-on {options.train_on!r} (final or all-correct)")
    if options.language and options.language not in LANGUAGES:
        raise ExportError(f"unknown language {options.language!r} (triton or ptx)")
    if options.group_by not in GROUP_BY:
        raise ExportError(f"unknown --group-by {options.group_by!r} (prompt or target)")
    if options.split_by not in (None, "target"):
        raise ExportError(f"unknown --split-by {options.split_by!r} (target)")
    if options.split_by and not 0 < options.test_fraction < 1:
        raise ExportError(f"--test-fraction must lie between 0 and 1, not {options.test_fraction:g}")
    if options.split_by and options.format == "flashinfer":
        raise ExportError("--split-by writes train and test files; --format flashinfer writes one folder (export "
                          "twice, with --exclude, for two)")


def split_targets(targets: Iterable[str], test_fraction: float) -> dict[str, str]:
    """Each target hash's split: "test" where a hash of it falls below test_fraction, so a target keeps its side as
    runs and targets are added to later exports. With two or more targets neither side is left empty: the lowest
    falls to test, or the highest to train."""
    def position(target: str) -> float:
        return int(hashlib.sha256(f"kloop-split:{target}".encode()).hexdigest()[:12], 16) / 16 ** 12

    ranked = sorted(set(targets), key=position)
    sides = {t: "test" if position(t) < test_fraction else "train" for t in ranked}
    if len(ranked) >= 2 and "test" not in sides.values():
        sides[ranked[0]] = "test"
    if len(ranked) >= 2 and "train" not in sides.values():
        sides[ranked[-1]] = "train"
    return sides


def split_path(out: Path, name: str) -> Path:
    """sft.jsonl -> sft.train.jsonl, sft.test.jsonl"""
    return out.with_name(f"{out.stem}.{name}{out.suffix}")


class TokenCounter:
    """Tokens of a row: with a tokenizer (a local path or an installed name, never downloaded) exactly, through its
    chat template where it has one; without, an estimate at CHARS_PER_TOKEN that errs long."""

    def __init__(self, tokenizer: str | None) -> None:
        self.tokenizer = _load_tokenizer(tokenizer) if tokenizer else None
        self.name = (f"exact, tokenizer {tokenizer}" if tokenizer else
                     f"estimate, {CHARS_PER_TOKEN} characters per token (--tokenizer counts exactly)")

    def count(self, row: dict) -> tuple[int, int]:
        """(prompt tokens, trained tokens)"""
        if self.tokenizer is None:
            return math.ceil(row["prompt"] / CHARS_PER_TOKEN), math.ceil(row["trained"] / CHARS_PER_TOKEN)
        if row["chat"] and getattr(self.tokenizer, "chat_template", None):
            prompt, trained, tools = row["chat"]
            before = self._template(prompt, tools, generation=True)
            whole = self._template(prompt + trained, tools, generation=False)
            return before, max(whole - before, 0)
        encode = self.tokenizer.encode
        return len(encode(row["prompt_text"], add_special_tokens=False)), \
            len(encode(row["trained_text"], add_special_tokens=False))

    def _template(self, messages: list[dict], tools: list[dict], generation: bool) -> int:
        try:
            ids = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                                     add_generation_prompt=generation)
        except Exception as e:   # a template that cannot render these messages: say so, not a wrong count
            raise ExportError(f"--tokenizer: its chat template cannot render a row ({type(e).__name__}: {e})"[:300]) \
                from None
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        return len(ids)


def _load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ExportError("--tokenizer needs transformers (pip install transformers)") from None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as e:
        raise ExportError(f"--tokenizer {name}: no such local or installed tokenizer ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None


def length_stats(rows: list[dict], counter: TokenCounter | None = None) -> tuple[dict, int | None, int | None,
                                                                                    int | None]:
    """Characters and tokens of the prompt (context) and the trained part of every row (each row's counts go to its
    "tokens"); the max_length that keeps every row whole (an estimate rounded up to 1024), the longest prompt and
    the longest trained part."""
    counter = counter or TokenCounter(None)
    for row in rows:
        row["tokens"] = counter.count(row)
    stats = {}
    for i, part in enumerate(("prompt", "trained")):
        chars = sorted(row[part] for row in rows)
        if not chars:
            stats[part] = {"n": 0}
            continue
        tokens = sorted(row["tokens"][i] for row in rows)
        stats[part] = {"n": len(chars), "chars": _spread(chars), "tokens": _spread(tokens)}
    if not rows:
        return stats, None, None, None
    longest = max(sum(row["tokens"]) for row in rows)
    if counter.tokenizer is None:
        longest = int(math.ceil(longest / 1024) * 1024)
    return stats, longest, stats["prompt"]["tokens"]["max"], stats["trained"]["tokens"]["max"]


def _spread(values: list[int]) -> dict:
    return {"min": values[0], "median": int(statistics.median(values)),
            "p90": values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)], "max": values[-1]}


# -- writing ---------------------------------------------------------------------------------------------------------

def write_jsonl_atomic(records: list[dict], out: str | os.PathLike) -> None:
    """Write all lines or nothing: a temp file beside the target, renamed over it when complete."""
    _write_atomic(out, lambda f: [f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n") for r in records])


def _write_atomic(out: str | os.PathLike, write: Callable, binary: bool = False) -> None:
    out = Path(out)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise ExportError(f"cannot write {out}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp's 0600 would keep a dataset from its other readers
        os.replace(tmp, out)
    except OSError as e:
        os.unlink(tmp)
        raise ExportError(f"cannot write {out}: {e.strerror}") from None
    except BaseException:
        os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_parquet(records: list[dict], out: str | os.PathLike) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("--format verl writes parquet: pip install pyarrow (or kloop[data])") from None
    table = pa.Table.from_pylist(records)
    _write_atomic(out, lambda f: pq.write_table(table, f), binary=True)


def write_flashinfer(data: dict, out: Path) -> list[Path]:
    """definitions/<op_type>/<def>.json, workloads/<op_type>/<def>.jsonl, solutions/<author>/<op_type>/<def>/<sol>.json,
    traces/<author>/<op_type>/<def>.jsonl (FlashInfer Trace layout)."""
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot write {out}: {e.strerror}") from None

    def put(path: Path, text: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ExportError(f"cannot write {path}: {e.strerror}") from None
        _write_atomic(path, lambda f: f.write(text))
        written.append(path)

    for name, definition in data["definitions"].items():
        put(out / "definitions" / definition["op_type"] / f"{name}.json", json.dumps(definition, indent=2) + "\n")
        workloads = data["workloads"].get(name, {}).values()
        put(out / "workloads" / definition["op_type"] / f"{name}.jsonl", "".join(
            json.dumps({"definition": name, "workload": w, "solution": None, "evaluation": None}) + "\n"
            for w in workloads))
    traces: dict[Path, list[dict]] = {}
    for solution, trace in zip(data["solutions"], data["traces"]):
        op_type = data["definitions"][solution["definition"]]["op_type"]
        put(out / "solutions" / solution["author"] / op_type / solution["definition"] / f"{solution['name']}.json",
            json.dumps(solution, indent=2) + "\n")
        traces.setdefault(out / "traces" / solution["author"] / op_type / f"{solution['definition']}.jsonl",
                          []).append(trace)
    for path, rows in traces.items():
        put(path, "".join(json.dumps(t) + "\n" for t in rows))
    return written


def _write_rows(rows: list[dict], out: Path, fmt: str, summary: ExportSummary) -> None:
    """One file of rows (verl: parquet, else JSONL; openai: and its provenance sidecar), each written atomically."""
    if not out.parent.is_dir():
        raise ExportError(f"cannot write {out}: no such directory {out.parent}")
    records = [row["record"] for row in rows]
    if fmt == "verl":
        write_parquet(records, out)
    else:
        write_jsonl_atomic(records, out)
    summary.files.append(str(out))
    if fmt == "openai":
        sidecar = out.with_name(out.name + ".provenance.jsonl")
        write_jsonl_atomic([{"line": i, **row["sidecar"]} for i, row in enumerate(rows)], sidecar)
        summary.files.append(str(sidecar))


def card_path(out: Path) -> Path:
    """README.md beside the export (inside it, for a folder); a README.md kloop did not write is never replaced."""
    folder = out if out.is_dir() else out.parent
    card = folder / "README.md"
    if card.exists():   # another export's card (or one kloop did not write) stays: this one gets a card of its own
        text = card.read_text(errors="replace")
        if "kloop_export:" not in text[:2000] or f"`{out.name}`" not in text:
            return folder / f"{out.name}.README.md"
    return card


def dataset_card(options: ExportOptions, summary: ExportSummary, rows: list[dict], out: Path) -> str:
    provenance = [r["record"].get("provenance") or (r["sidecar"] or {}).get("provenance") or
                  json.loads(r["record"].get("extra_info", {}).get("provenance", "{}")) for r in rows]
    gpus = sorted({p.get("gpu") or "none (CPU interpreter)" for p in provenance if p})
    targets = sorted({p.get("target_name") or "?" for p in provenance if p})
    policies = sorted({f"{p.get('policy')}{'/' + p['model'] if p.get('model') else ''}" for p in provenance if p})
    isolation = sorted({str(p.get("isolation")) for p in provenance if p})
    n = summary.written
    size = next(name for limit, name in ((1e3, "n<1K"), (1e4, "1K<n<10K"), (1e5, "10K<n<100K"), (1e6, "100K<n<1M"),
                                         (float("inf"), "1M<n<10M")) if n < limit)
    yaml = ["---", f"license: {options.license or 'other'}", "language:", "- en", "tags:", "- kloop", "- gpu-kernels",
            "- triton", "- ptx", "- code", "task_categories:", "- text-generation", "size_categories:", f"- {size}",
            f"pretty_name: kloop {options.format} export", "kloop_export:", f"  format: {options.format}",
            f"  kloop_version: {kloop_version()}", f"  rows: {n}",
            f"  file: {', '.join(split_path(out, k).name for k in summary.splits) if summary.splits else out.name}",
            "---", ""]
    lengths = "\n".join(f"- {line}" for line in summary.lines() if not line.startswith("warning"))
    body = f"""# kloop {options.format} export

Kernels written by kloop's agent loop and judged by its evaluator (a jailed planner, trusted executor and referee;
see kloop's docs/design.md). {'Every trained turn is a verified-correct kernel.' if options.format in ('trl', 'openai')
and not options.all_verdicts else 'Rows carry each submission verdict (`label` is true only for verified-correct).'}

- format: `{options.format}` (file `{out.name}`), {n} row(s) from {summary.runs} run(s)
- train on: {options.train_on}; all verdicts: {options.all_verdicts}; language: {options.language or 'any'};
  min speedup: {options.min_speedup}; rule-breaking trajectories: {'kept' if options.include_rejected else 'left out'}
- duplicates left out: {summary.duplicates}; rows excluded as evaluation problems: {summary.excluded}
  ({', '.join(options.exclude) or 'no --exclude given'})
- split: {'; '.join(f"`{split_path(out, k).name}` {v['rows']} row(s), {v['targets']} op(s)"
                   for k, v in summary.splits.items()) + ' (no op on both sides)' if summary.splits else 'none'}
- targets: {', '.join(targets)}
- executed on: {', '.join(gpus)}
- policies: {', '.join(policies)}
- isolation: {', '.join(isolation)}
- license: {options.license or 'not set (use --license)'}

## Lengths
{lengths or '- none'}

## Trainer settings
{_trainer_settings(summary, rows)}

## Decontamination
{_exclusions(options, summary)}

## Reward (rl, verl)
{REWARD_FORMULA}.
{_reward_notes(summary, provenance) if options.format in ('rl', 'verl') else ''}
## Provenance
Every row (openai: the line-aligned `{out.name}.provenance.jsonl`) names the kloop version, run and attempt ids,
target sha256, where it executed (`executed_on`; no GPU is named for CPU-interpreter attempts), GPU, driver, CUDA,
torch and triton versions, timing flags, policy and model, isolation mode and license.
"""
    return "\n".join(yaml) + body


def _exclusions(options: ExportOptions, summary: ExportSummary) -> str:
    if not options.exclude:
        return "- no --exclude given"
    head = (f"Runs whose target computes the same op as a problem in {', '.join(options.exclude)} are left out "
            "(tools/records/decontaminate.py: the same traced aten op graph with sizes and numbers abstracted, the same "
            "normalized source, or a near-duplicate source where the op cannot be traced): "
            f"{summary.excluded} run(s).")
    return "\n".join([head, ""] + [f"- {e['target']} (run {e['run_id']}): {e['problem']}, {e['why']}"
                                   for e in summary.exclusions])


def _reward_notes(summary: ExportSummary, provenance: list[dict]) -> str:
    """Which device judged the rows' rewards, and how many GRPO groups hold a contrast."""
    judged: dict[str, int] = {}
    for p in provenance:
        device = p.get("gpu") or "a GPU" if p.get("executed_on") == "cuda" else \
            "the Triton CPU interpreter (correctness only, untimed: a verified kernel scores 1.0)" \
            if p.get("executed_on") == "cpu-interpreter" else "nothing (no kernel ran)"
        judged[device] = judged.get(device, 0) + 1
    g = summary.groups
    return ("\n- rewards judged on: " + "; ".join(f"{device}: {n} row(s)" for device, n in sorted(judged.items())) +
            (f"\n- `group_id` by {g['by']}: {g['groups']} group(s) of {g['rows']} row(s); {g['contrast']} with more "
             f"than one distinct reward (GRPO learns only from those; `--group-by target` puts every attempt at a "
             f"target in one group)" if g else "") + "\n")


def _trainer_settings(summary: ExportSummary, rows: list[dict]) -> str:
    """What to set so that no row is cut: TRL's max_length, verl's prompt and response lengths (tokens)."""
    if not summary.max_length:
        return "- none"
    fits = sum(row["tokens"][0] <= 1024 for row in rows)
    return (f"- tokens counted: {summary.counted_by}\n"
            f"- TRL (SFTConfig, KTOConfig): `max_length={summary.max_length}` keeps every row whole (TRL's default "
            f"1024 cuts the trained turn off, or drops it under assistant_only_loss)\n"
            f"- verl: `data.max_prompt_length={summary.max_prompt}` (the longest prompt; verl's default 1024 keeps "
            f"{fits} of {len(rows)} prompt(s)), `data.max_response_length={summary.max_trained}` (the longest "
            f"logged completion; a model's own may run longer)")


def export(db_paths: list[str | os.PathLike], out: str | os.PathLike, options: ExportOptions) -> ExportSummary:
    """Build the rows of every database and write them to `out` (JSONL; verl: parquet; flashinfer: a folder), with a
    dataset card beside them (openai: and a provenance sidecar), each file atomically."""
    if not db_paths:
        raise ExportError("give at least one --db")
    out = Path(out)
    if options.format != "flashinfer" and out.is_dir():
        raise ExportError(f"{out} is a directory: give a file path")
    if options.format == "flashinfer" and out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file: --format flashinfer writes a folder")
    builder = _build(db_paths, options)
    summary, rows = builder.summary, builder.rows
    if not rows:
        raise ExportError(f"nothing to export: no {'' if options.all_verdicts or options.format in ('rl', 'verl') else 'verified-correct '}"
                          f"submission in {summary.runs} run(s) passes the filters"
                          + (f" ({summary.excluded} run(s) excluded as evaluation problems)" if summary.excluded else ""))
    try:   # the folder --out names, made only once there is something to write
        (out if options.format == "flashinfer" else out.parent).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot make the folder for {out}: {e.strerror}") from None
    if options.format == "flashinfer":
        summary.files += [str(p) for p in write_flashinfer(builder.flashinfer, out)]
    elif options.split_by:
        sides = split_targets((row["target"] for row in rows), options.test_fraction)
        for name in SPLITS:
            part = [row for row in rows if sides[row["target"]] == name]
            summary.splits[name] = {"rows": len(part), "targets": len({row["target"] for row in part})}
            if part:
                _write_rows(part, split_path(out, name), options.format, summary)
            else:
                summary.warnings.append(f"one target only: nothing in {split_path(out, name).name}")
    else:
        _write_rows(rows, out, options.format, summary)
    card = card_path(out)
    _write_atomic(card, lambda f: f.write(dataset_card(options, summary, rows, out)))
    summary.files.append(str(card))
    return summary
