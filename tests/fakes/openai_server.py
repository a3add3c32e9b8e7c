"""Replies in the shape of the OpenAI chat-completions API (POST /v1/chat/completions) for ScriptedServer."""
from __future__ import annotations

import itertools
import json

from . import Reply, ScriptedServer, retryable

__all__ = ["ScriptedServer", "Reply", "completion", "tool_call", "error"]

_ids = itertools.count(1)


def tool_call(name: str, arguments: dict | str, id: str | None = None) -> dict:
    """A function call; a str is sent as the arguments text as is (to send malformed JSON)."""
    return {"id": id or f"call_{next(_ids):04d}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


def completion(content: str | None = None, tool_calls: list[dict] = (), model: str = "qwen-coder",
               prompt_tokens: int = 900, completion_tokens: int = 200, cached_tokens: int = 0) -> Reply:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    return Reply(200, {
        "id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": 1_700_000_000, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": cached_tokens}},
    })


def error(status: int, detail: str) -> Reply:
    body = {"error": {"message": detail, "type": "invalid_request_error" if status < 500 else "server_error",
                      "param": None, "code": None}}
    return retryable(status, body) if status == 429 or status >= 500 else Reply(status, body)
