"""The tools a model may call: submit_candidate, and inspection of earlier attempts read from the run database.

TOOLS is one JSON-schema list for every provider (Anthropic takes it as is, `openai_tools` wraps it for chat
completions). The graph's tool node answers inspection calls with `run_tool`, which never raises: an unknown tool,
bad arguments or a missing attempt come back as a result with is_error set, which the model reads and the loop goes on.
"""
from __future__ import annotations

import dataclasses
import difflib
import json

from tools.records.store import Attempt
from tools.records.wire import SUBMIT
# A PTX or SASS dump of a big kernel can run to megabytes; the model gets the head and is told so.
MAX_RESULT_CHARS = 40_000

_ATTEMPT = {"type": "integer", "minimum": 1, "description": "attempt number in this run (as shown in the history)"}

TOOLS: list[dict] = [
    {
        "name": SUBMIT,
        "description": "Submit the next candidate: a whole Python module defining ModelNew. Ends your turn.",
        "input_schema": {
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": ["triton", "ptx"]},
                "source": {"type": "string", "description": "the complete module source"},
                "rationale": {"type": "string", "description": "what this candidate changes and why, briefly"},
            },
            "required": ["language", "source", "rationale"],
        },
    },
    {
        "name": "get_ptx",
        "description": "The PTX of an earlier attempt's kernels (Triton's generated PTX, or the submitted PTX).",
        "input_schema": {"type": "object", "properties": {"attempt": _ATTEMPT}, "required": ["attempt"]},
    },
    {
        "name": "get_sass",
        "description": "The SASS (machine code, from cuobjdump) of an earlier attempt's kernels, where available.",
        "input_schema": {"type": "object", "properties": {"attempt": _ATTEMPT}, "required": ["attempt"]},
    },
    {
        "name": "get_ncu",
        "description": "Nsight Compute counters of an earlier attempt's kernels (DRAM/SM throughput, occupancy, "
                       "L2 hit rate, warp stall reasons), where they were collected.",
        "input_schema": {"type": "object", "properties": {"attempt": _ATTEMPT}, "required": ["attempt"]},
    },
    {
        "name": "diff",
        "description": "Unified diff of two attempts' sources (from attempt_a to attempt_b).",
        "input_schema": {"type": "object", "properties": {"attempt_a": _ATTEMPT, "attempt_b": _ATTEMPT},
                         "required": ["attempt_a", "attempt_b"]},
    },
    {
        "name": "best_kernel",
        "description": "The best verified attempt of this run so far: its number, timing, speedups and source.",
        "input_schema": {"type": "object", "properties": {}},
    },
]
INSPECTION_TOOLS = [tool for tool in TOOLS if tool["name"] != SUBMIT]
_BY_NAME = {tool["name"]: tool for tool in TOOLS}


def openai_tools(tools: list[dict] = TOOLS) -> list[dict]:
    """The same tools in chat-completions function-calling form."""
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["input_schema"]}} for t in tools]


class ToolInputError(Exception):
    """A tool call the database cannot answer as asked (the message goes back to the model)."""


def run_tool(store, run_id: str, call: dict) -> dict:
    """Answer one inspection call {id, name, input} from the run database.

    Returns {"tool_use_id", "name", "content" (text for the model), "is_error"}; never raises for bad calls.
    """
    name = call.get("name", "")
    result = {"tool_use_id": call.get("id", ""), "name": name, "content": "", "is_error": False}
    try:
        if name not in _BY_NAME or name == SUBMIT:
            known = ", ".join(t["name"] for t in INSPECTION_TOOLS)
            raise ToolInputError(f"unknown inspection tool {name!r} (known: {known})")
        arguments = call.get("input")
        _check_arguments(name, arguments)
        result["content"] = _clip(_HANDLERS[name](store, run_id, **arguments))
    except ToolInputError as e:
        result.update(content=str(e), is_error=True)
    return result


def _check_arguments(name: str, arguments) -> None:
    schema = _BY_NAME[name]["input_schema"]
    if not isinstance(arguments, dict):
        raise ToolInputError(f"{name}: arguments must be an object, got {type(arguments).__name__}")
    properties = schema.get("properties", {})
    unknown = set(arguments) - set(properties)
    if unknown:
        raise ToolInputError(f"{name}: unknown argument(s) {', '.join(sorted(unknown))}")
    for key in schema.get("required", []):
        if key not in arguments:
            raise ToolInputError(f"{name}: missing argument {key!r}")
    for key, value in arguments.items():
        if properties[key].get("type") == "integer" and (not isinstance(value, int) or isinstance(value, bool)
                                                         or value < 1):
            raise ToolInputError(f"{name}: {key} must be an attempt number (1 or more), got {value!r}")


def _attempt(store, run_id: str, number: int) -> Attempt:
    for attempt in store.attempts(run_id):
        if attempt.number == number:
            return attempt
    raise ToolInputError(f"this run has no attempt {number}")


def _per_kernel(attempt: Attempt, texts: dict[str, str] | str, what: str) -> str:
    if isinstance(texts, str):  # a column holding plain text rather than JSON
        texts = {"kernel": texts}
    if not texts:
        raise ToolInputError(f"attempt {attempt.number} has no {what} (verdict {attempt.verdict}: "
                             "it may not have compiled, or the tool was not available)")
    return "\n\n".join(f"// ===== {name} =====\n{text}" for name, text in texts.items())


def _get_ptx(store, run_id: str, attempt: int) -> str:
    found = _attempt(store, run_id, attempt)
    return _per_kernel(found, found.result.ptx, "PTX")


def _get_sass(store, run_id: str, attempt: int) -> str:
    found = _attempt(store, run_id, attempt)
    return _per_kernel(found, found.result.sass, "SASS")


def _get_ncu(store, run_id: str, attempt: int) -> str:
    ncu = _attempt(store, run_id, attempt).result.ncu
    if not ncu:
        raise ToolInputError(f"attempt {attempt} has no Nsight Compute data (ncu runs only on a GPU, on correct "
                             "attempts, when profiling is on)")
    return json.dumps({kernel: dataclasses.asdict(counters) for kernel, counters in ncu.items()}, indent=1)


def _diff(store, run_id: str, attempt_a: int, attempt_b: int) -> str:
    a, b = _attempt(store, run_id, attempt_a), _attempt(store, run_id, attempt_b)
    lines = difflib.unified_diff((a.source or "").splitlines(keepends=True),
                                 (b.source or "").splitlines(keepends=True),
                                 fromfile=f"attempt {attempt_a}", tofile=f"attempt {attempt_b}")
    return "".join(lines) or f"attempts {attempt_a} and {attempt_b} have the same source"


def _best_kernel(store, run_id: str) -> str:
    best = store.best_attempt(run_id)
    if best is None:
        raise ToolInputError("no attempt of this run has been verified correct yet")
    speedups = ", ".join(f"{value:.2f}x over {name}" for name, value in
                         (("eager", best.speedup_eager), ("torch.compile", best.speedup_compile))
                         if value is not None) or "no timing"
    timing = f", median {best.median_us:.2f} us" if best.median_us is not None else ""
    return f"attempt {best.number} ({best.language}): {speedups}{timing}\n\n{best.source}"


_HANDLERS = {"get_ptx": _get_ptx, "get_sass": _get_sass, "get_ncu": _get_ncu, "diff": _diff,
             "best_kernel": _best_kernel}


def _clip(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return text[:MAX_RESULT_CHARS] + f"\n[... {len(text) - MAX_RESULT_CHARS} more characters not shown]"
