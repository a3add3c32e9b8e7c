"""Chat completions on the wire (OpenAI, vLLM, SGLang, ...): responses and requests as kloop logs them.

    >>> reply = read_response({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
    ...     {"id": "c1", "type": "function", "function": {"name": "diff", "arguments": "{\\"attempt_a\\": 1}"}}]},
    ...     "finish_reason": "tool_calls"}], ...})
    >>> reply.calls[0].input
    {'attempt_a': 1}
"""
from __future__ import annotations

import json
from typing import Any

from tools.records.wire import Reply, ToolCall, content_text


def parse_arguments(arguments: Any) -> tuple[Any, bool]:
    """A tool call's arguments (JSON text) as (value, True), or (the text, False) where it is not JSON."""
    if isinstance(arguments, dict):
        return arguments, True
    try:
        return json.loads(arguments or "{}"), True
    except (json.JSONDecodeError, TypeError):
        return arguments, False


def read_message(message: dict, stop: str | None = None) -> Reply:
    """An assistant message (a response's choice, one sent back in a request, or a trainer's completion in the
    conversation shape) as a Reply; tool calls that are not objects are left out."""
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict) or (call.get("type") or "function") != "function":
            continue
        function = call.get("function") or {}
        value, parsed = parse_arguments(function.get("arguments"))
        calls.append(ToolCall(call.get("id", ""), function.get("name", ""), value, parsed))
    return Reply(texts=[content_text(message.get("content"))], thinking=message.get("reasoning_content") or "",
                 calls=calls, stop=stop)


def read_response(body: dict) -> Reply | None:
    """A response body's first choice as a Reply; None when it has no choices."""
    choices = body.get("choices") or []
    if not choices:
        return None
    return read_message(choices[0].get("message") or {}, choices[0].get("finish_reason"))


def assistant_turn(body: dict) -> dict:
    """The response sent back as the assistant's turn of a continued conversation (its function calls only)."""
    message = body["choices"][0]["message"]
    calls = [c for c in message.get("tool_calls") or [] if (c.get("type") or "function") == "function"]
    return {"role": "assistant", "content": message.get("content"), "tool_calls": calls}


def tokens(body: dict) -> dict:
    """The Message columns of a response's token counts (cached prompt tokens apart from the rest)."""
    usage = body.get("usage") or {}
    prompt = usage.get("prompt_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return dict(input_tokens=prompt - cached, cache_read_tokens=cached, output_tokens=usage.get("completion_tokens") or 0)


def chat_message(m: dict) -> dict:
    """One request message in the conversation shape (a developer message is a system message)."""
    if m.get("role") == "assistant":
        return read_message(m).as_message()
    role = "system" if m.get("role") == "developer" else m.get("role")
    message = {"role": role, "content": content_text(m.get("content"))}
    if role == "tool":
        message.update(tool_call_id=m.get("tool_call_id", ""), name=m.get("name", ""))
    return message


def read_request(body: dict) -> tuple[list[dict] | None, list[dict]]:
    """A request body as (messages, tools) in the conversation shape; (None, []) when it has no messages."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None, []
    return [chat_message(m) for m in body["messages"]], [t for t in body.get("tools") or [] if t.get("type") == "function"]
