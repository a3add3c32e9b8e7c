"""One logged exchange with a model or tool: the record the policies produce and the store keeps (messages table).

It lives at the bottom (tools/) because the store writes it and agent/ fills it; agent.policy re-exports it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Message:
    """One logged exchange with a model or tool (stored in the messages table)."""
    role: str                      # request, response, tool_call, tool_result, error
    content: Any                   # full JSON-able body
    provider: str = ""
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
