"""The Anthropic Messages API on the wire: responses and requests as kloop logs them (the SDK's to_dict()).

    >>> reply = read_response({"content": [{"type": "text", "text": "..."}, {"type": "tool_use", "id": "t1",
    ...                        "name": "get_ptx", "input": {"attempt": 1}}], "stop_reason": "tool_use", ...})
    >>> reply.calls[0].name, reply.calls[0].input
    ('get_ptx', {'attempt': 1})
"""
from __future__ import annotations

import copy

from tools.records.wire import Reply, ToolCall, content_text


def read_blocks(blocks: list[dict], stop: str | None = None) -> Reply:
    """An assistant turn's content blocks (a response's, or one sent back in a request) as a Reply."""
    return Reply(texts=[b.get("text", "") for b in blocks if b.get("type") == "text"],
                 thinking="\n\n".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking"),
                 calls=[ToolCall(b.get("id", ""), b.get("name", ""), b.get("input") or {})
                        for b in blocks if b.get("type") == "tool_use"],
                 stop=stop)


def read_response(body: dict) -> Reply | None:
    """A response body as a Reply; None when it has no content blocks."""
    if not isinstance(body.get("content"), list):
        return None
    return read_blocks(body["content"], body.get("stop_reason"))


def assistant_turn(body: dict) -> dict:
    """The response sent back as the assistant's turn of a continued conversation: every block unchanged (thinking
    blocks keep their signatures, which the API requires during tool use)."""
    return {"role": "assistant", "content": copy.deepcopy(body.get("content") or [])}


def tokens(body: dict) -> dict:
    """The Message columns of a response's token counts."""
    usage = body.get("usage") or {}
    return dict(input_tokens=usage.get("input_tokens") or 0, output_tokens=usage.get("output_tokens") or 0,
                cache_write_tokens=usage.get("cache_creation_input_tokens") or 0,
                cache_read_tokens=usage.get("cache_read_input_tokens") or 0)


def read_request(body: dict) -> tuple[list[dict] | None, list[dict]]:
    """A request body as (messages, tools) in the conversation shape, the tools as chat-completions functions;
    (None, []) when it has no messages."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None, []
    messages = []
    if body.get("system"):
        messages.append({"role": "system", "content": content_text(body["system"])})
    names = {}  # tool_use id -> tool name, for the answers
    for m in body["messages"]:
        if isinstance(m.get("content"), str):
            messages.append({"role": m["role"], "content": m["content"]})
        elif m.get("role") == "assistant":
            reply = read_blocks(m["content"])
            names.update({c.id: c.name for c in reply.calls})
            messages.append(reply.as_message())
        else:
            texts = []
            for block in m.get("content") or []:
                if block.get("type") == "tool_result":
                    messages.append({"role": "tool", "name": names.get(block.get("tool_use_id"), ""),
                                     "tool_call_id": block.get("tool_use_id", ""),
                                     "content": content_text(block.get("content"))})
                elif block.get("type") == "text":
                    texts.append(block["text"])
            if texts:
                messages.append({"role": "user", "content": "\n\n".join(texts)})
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t["input_schema"]}}
             for t in body.get("tools") or [] if "input_schema" in t]
    return messages, tools
