"""Replies in the shape of the Anthropic Messages API (POST /v1/messages) for ScriptedServer."""
from __future__ import annotations

import itertools
import json

from . import Reply, ScriptedServer, retryable

__all__ = ["ScriptedServer", "Reply", "message", "text", "thinking", "tool_use", "error"]

_ids = itertools.count(1)


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def thinking(value: str, signature: str = "sig-abc") -> dict:
    return {"type": "thinking", "thinking": value, "signature": signature}


def tool_use(name: str, input: dict, id: str | None = None) -> dict:
    return {"type": "tool_use", "id": id or f"toolu_{next(_ids):04d}", "name": name, "input": input}


def message(*blocks: dict, stop_reason: str | None = None, model: str = "claude-opus-4-8", input_tokens: int = 1200,
            output_tokens: int = 300, cache_write: int = 1000, cache_read: int = 0) -> Reply:
    """A whole message, answered as JSON or, to a streaming request, as the event stream that builds it."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens,
             "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read}
    body = {"id": f"msg_{next(_ids):04d}", "type": "message", "role": "assistant", "model": model,
            "content": list(blocks), "stop_reason": stop_reason, "stop_sequence": None, "usage": usage}
    return Reply(200, body, events=_events(body))


def _events(body: dict) -> list[tuple[str, dict]]:
    """The Messages streaming protocol: message_start, per block start/delta/stop, message_delta, message_stop."""
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 1}}
    events = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            empty, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            empty, delta = {**block, "thinking": "", "signature": ""}, {"type": "thinking_delta",
                                                                        "thinking": block["thinking"]}
        else:
            empty, delta = {**block, "input": {}}, {"type": "input_json_delta",
                                                    "partial_json": json.dumps(block["input"])}
        events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": empty}))
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        if block["type"] == "thinking":
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "signature_delta",
                                                             "signature": block["signature"]}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                                     "usage": {"output_tokens": body["usage"]["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def error(status: int, kind: str, detail: str) -> Reply:
    body = {"type": "error", "error": {"type": kind, "message": detail}}
    return retryable(status, body) if status == 429 or status >= 500 else Reply(status, body)
