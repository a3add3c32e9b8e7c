"""Each model provider's wire format, read in one module per provider: tools/records/wire/anthropic.py (the Messages API)
and tools/records/wire/openai.py (chat completions). The live policies read their answers here, the replay policy reads
logged answers here, and export reads logged requests and answers here.

    from tools.records.wire import anthropic, openai, read_response
    reply = anthropic.read_response(body)        # body: a response as logged (messages.content, role 'response')
    reply.text, reply.thinking, reply.calls, reply.submissions, reply.stop
    reply.as_message()                           # the same answer in the conversation shape below (export)
    messages, tools = openai.read_request(body)  # a logged request as a conversation in that shape

The conversation shape (TRL's, plus ids): {"role", "content": str, "tool_calls": [{"id", "type": "function",
"function": {"name", "arguments": dict}}], "name"/"tool_call_id" on tool answers, "reasoning_content" if any}.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SUBMIT = "submit_candidate"   # the tool call that carries a candidate (agent/inspect_tools.py defines the tools)
PROVIDERS = ("anthropic", "openai")


@dataclass
class ToolCall:
    id: str
    name: str
    input: Any                 # the arguments as JSON values; the raw text where they are not JSON (`parsed` False)
    parsed: bool = True

    def arguments(self) -> dict:
        """The arguments as an object, whatever the model sent: {"raw": text} for text that is not JSON,
        {"value": v} for JSON that is not an object."""
        if isinstance(self.input, dict):
            return self.input
        return {"value": self.input} if self.parsed else {"raw": self.input}


@dataclass
class Reply:
    """One model answer: its text blocks, its thinking, its tool calls and why it stopped."""
    texts: list[str] = field(default_factory=list)
    thinking: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    stop: str | None = None    # Anthropic's stop_reason, chat completions' finish_reason

    @property
    def text(self) -> str:
        return "\n".join(self.texts)

    @property
    def submissions(self) -> list[ToolCall]:
        return [c for c in self.calls if c.name == SUBMIT]

    def as_message(self) -> dict:
        """The answer as an assistant turn in the conversation shape (text blocks joined by a blank line)."""
        message = {"role": "assistant", "content": "\n\n".join(self.texts)}
        if self.thinking:
            message["reasoning_content"] = self.thinking
        if self.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments()}} for c in self.calls]
        return message


def content_text(content: Any) -> str:
    """Plain text of a string or a list of content blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") in
                           ("text", "input_text", "output_text"))
    return json.dumps(content)


def provider_of(row: dict) -> str:
    """The provider of a logged message row: its provider column, else guessed from the body's shape (chat
    completions have choices, or system/tool roles in their messages)."""
    provider = (row.get("provider") or "").lower()
    if provider in PROVIDERS:
        return provider
    content = row.get("content")
    if isinstance(content, dict) and ("choices" in content or any(
            isinstance(m, dict) and m.get("role") in ("system", "tool") for m in content.get("messages", []))):
        return "openai"
    return "anthropic"


def module(provider: str):
    """tools.records.wire.anthropic or tools.records.wire.openai; a KeyError for any other name."""
    from tools.records.wire import anthropic, openai

    return {"anthropic": anthropic, "openai": openai}[provider]


def read_response(provider: str, body: Any) -> Reply | None:
    """A logged response of `provider` as a Reply; None when it is not one (no body, no choices, unknown provider)."""
    if provider not in PROVIDERS or not isinstance(body, dict):
        return None
    return module(provider).read_response(body)
