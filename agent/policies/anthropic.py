"""The Anthropic policy: Claude proposes candidates through tool use, with extended thinking and prompt caching.

One turn is one conversation: [stable prefix: system + target (cached)] [this turn's evidence] and then as many
inspection rounds as the model asks for (returned to the graph as Proposal.tool_calls, answered by its tool node, then
continued here with ctx.tool_results) until it calls submit_candidate. The next turn starts a fresh conversation
whose evidence message summarises the history, so the context stays bounded however long the run.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field

import anthropic
import httpx2

from agent import prompting
from agent.inspect_tools import SUBMIT, TOOLS
from agent.policy import AttemptView, Message, PolicyError, Proposal, ProposeContext, RunDigest
from tools.records.wire import anthropic as wire

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-opus-4-8"
PROVIDER = "anthropic"
# $ per million tokens: input, output, cache write (5-minute TTL), cache read. Matched by prefix, so dated ids work.
PRICES = {
    "claude-opus-4-8": (5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-7": (5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-6": (5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-5": (5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-1": (15.00, 75.00, 18.75, 1.50),
    "claude-sonnet-4-6": (3.00, 15.00, 3.75, 0.30),
    "claude-sonnet-4-5": (3.00, 15.00, 3.75, 0.30),
    "claude-haiku-4-5": (1.00, 5.00, 1.25, 0.10),
}
CACHE = {"type": "ephemeral"}


def price(model: str) -> tuple[float, float, float, float] | None:
    for prefix in sorted(PRICES, key=len, reverse=True):
        if model.startswith(prefix):
            return PRICES[prefix]
    return None


def cost_usd(model: str, input_tokens: int, output_tokens: int, cache_write: int, cache_read: int) -> float:
    """Dollars for one response; 0 for a model with no known price (warned once per model)."""
    rates = price(model)
    if rates is None:
        if model not in _unpriced:
            _unpriced.add(model)
            log.warning("no price known for model %s: its cost is counted as $0 (--max-cost cannot stop it)", model)
        return 0.0
    tokens = (input_tokens, output_tokens, cache_write, cache_read)
    return sum(n * rate for n, rate in zip(tokens, rates)) / 1e6


_unpriced: set[str] = set()


@dataclass
class _Turn:
    """One turn's conversation while the model is still inspecting."""
    messages: list[dict]
    rounds: int = 0              # inspection rounds answered so far
    pending_ids: list[str] = field(default_factory=list)


class AnthropicPolicy:
    """`--policy anthropic`. Settings: model, max_tokens, thinking ("adaptive", "off" or a budget in tokens),
    effort (low/medium/high or None), max_retries and timeout (the SDK's own retries with backoff on 408/409/429/5xx),
    keep_full (attempts shown in full), max_tool_rounds (inspection rounds per turn)."""

    name = "anthropic"

    def __init__(self, model: str = DEFAULT_MODEL, *, api_key: str | None = None, base_url: str | None = None,
                 max_tokens: int = 32_000, thinking: str | int = "adaptive", effort: str | None = None,
                 max_retries: int = 4, timeout: float = 900.0, keep_full: int = 4, max_tool_rounds: int = 4):
        api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise PolicyError("no Anthropic API key: set ANTHROPIC_API_KEY (or use --policy offline)")
        self.model = model
        self.max_tokens = max_tokens
        self.thinking = _thinking_param(thinking)
        if self.thinking and self.thinking.get("budget_tokens", 0) >= max_tokens:
            raise PolicyError(f"the thinking budget ({thinking} tokens) must be below max_tokens ({max_tokens})")
        self.effort = effort
        self.keep_full = keep_full
        self.max_tool_rounds = max_tool_rounds
        # timeout bounds the wait for the response to start and each silence within the stream.
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=max_retries,
                                          timeout=timeout)
        self._turns: dict[int, _Turn] = {}      # by branch: parallel branches keep separate conversations

    # -- Policy ----------------------------------------------------------------------------------------------------
    def propose(self, ctx: ProposeContext) -> Proposal:
        turn = self._turns.get(ctx.branch)
        if turn is not None and ctx.tool_results:
            turn.messages.append({"role": "user", "content": self._tool_result_blocks(turn, ctx.tool_results)})
        else:
            turn = self._turns[ctx.branch] = _Turn(messages=[self._first_message(ctx)])
        params = self._request(ctx, turn.messages)
        logged = [Message("request", params, provider=PROVIDER, model=self.model)]
        started = time.monotonic()
        try:
            # Streaming: a long thinking answer can take many minutes, and a silent connection that long is
            # what proxies drop (the SDK refuses such non-streaming requests for that reason).
            with self.client.messages.stream(**params) as stream:
                response = stream.get_final_message()
        except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as e:
            raise PolicyError(f"the Anthropic API rejected the key ({e.status_code}): check ANTHROPIC_API_KEY") \
                from None
        except anthropic.NotFoundError:
            raise PolicyError(f"the Anthropic API does not know model {self.model!r} (404): check --model") from None
        except (anthropic.APIError, httpx2.HTTPError, ValueError) as e:
            # Retries are spent (rate limit, overload, timeout, ...), or the stream broke off or carried tool input
            # that is not JSON (neither is retried by the SDK): log it and let the run go on with a new turn.
            self._turns.pop(ctx.branch, None)
            problem = f"model call failed: {_describe(e)}"
            logged.append(Message("error", {"error": problem, "type": type(e).__name__}, provider=PROVIDER,
                                  model=self.model, latency_s=time.monotonic() - started))
            return Proposal("", "", "", messages=logged, format_error=problem)
        body = response.to_dict()
        logged.append(self._response_message(body, time.monotonic() - started))
        return self._read(ctx, turn, body, logged)

    def reflect(self, ctx: ProposeContext, attempt: AttemptView) -> tuple[str, list[Message]]:
        # The model reflects in its next turn, where the evidence is in front of it; a separate call would only cost.
        return "", []

    def distill(self, digest: RunDigest) -> tuple[list[dict], list[dict], list[Message]]:
        """After a run: one extra call (agent/prompts/lessons.md.j2, no thinking) for lessons and judgements of the
        lessons the run was shown (agent/learn.py stores them). A failed call gives no lessons, only its log."""
        params = {"model": self.model, "max_tokens": 2048,
                  "messages": [{"role": "user", "content": prompting.lessons_prompt(digest)}]}
        logged = [Message("request", params, provider=PROVIDER, model=self.model)]
        started = time.monotonic()
        try:
            with self.client.messages.stream(**params) as stream:
                response = stream.get_final_message()
        except (anthropic.APIError, httpx2.HTTPError, ValueError) as e:
            logged.append(Message("error", {"error": f"lesson call failed: {_describe(e)}", "type": type(e).__name__},
                                  provider=PROVIDER, model=self.model, latency_s=time.monotonic() - started))
            return [], [], logged
        body = response.to_dict()
        logged.append(self._response_message(body, time.monotonic() - started))
        reply = wire.read_response(body)
        return (*prompting.lessons_from_text(reply.text if reply else ""), logged)

    # -- requests --------------------------------------------------------------------------------------------------
    def _first_message(self, ctx: ProposeContext) -> dict:
        return {"role": "user", "content": [
            {"type": "text", "text": prompting.target_prompt(ctx), "cache_control": CACHE},
            {"type": "text", "text": prompting.turn_prompt(ctx, self.keep_full)},
        ]}

    def _tool_result_blocks(self, turn: _Turn, results: list[dict]) -> list[dict]:
        answered = {r.get("tool_use_id") for r in results}
        blocks = [{"type": "tool_result", "tool_use_id": r.get("tool_use_id", ""), "content": str(r.get("content", "")),
                   "is_error": bool(r.get("is_error"))} for r in results]
        # The API refuses a conversation with an unanswered tool_use; say so rather than fail the turn.
        blocks += [{"type": "tool_result", "tool_use_id": i, "content": "no result (the tool was not run)",
                    "is_error": True} for i in turn.pending_ids if i not in answered]
        if turn.rounds >= self.max_tool_rounds:
            blocks.append({"type": "text", "text": "That was the last inspection round of this turn: "
                                                   f"call {SUBMIT} now."})
        return blocks

    def _request(self, ctx: ProposeContext, messages: list[dict]) -> dict:
        messages = copy.deepcopy(messages)
        # A second cache breakpoint on the newest block lets each inspection round reuse the previous one's prefix.
        messages[-1]["content"][-1]["cache_control"] = CACHE
        params = {"model": self.model, "max_tokens": self.max_tokens,
                  "system": prompting.system_prompt(ctx.language, tools=True), "tools": TOOLS, "messages": messages}
        if self.thinking:
            params["thinking"] = self.thinking
        if self.effort:
            params["output_config"] = {"effort": self.effort}
        return params

    def _response_message(self, body: dict, latency: float) -> Message:
        tokens = wire.tokens(body)
        cost = cost_usd(self.model, tokens["input_tokens"], tokens["output_tokens"], tokens["cache_write_tokens"],
                        tokens["cache_read_tokens"])
        return Message("response", body, provider=PROVIDER, model=self.model, latency_s=latency, cost_usd=cost,
                       **tokens)

    # -- answers ---------------------------------------------------------------------------------------------------
    def _read(self, ctx: ProposeContext, turn: _Turn, body: dict, logged: list[Message]) -> Proposal:
        reply = wire.read_response(body) or wire.read_blocks([], body.get("stop_reason"))
        text = reply.text.strip()
        calls, submissions = reply.calls, reply.submissions
        if calls and not submissions and turn.rounds < self.max_tool_rounds:
            turn.messages.append(wire.assistant_turn(body))  # thinking blocks go back unchanged, as the API requires
            turn.rounds += 1
            turn.pending_ids = [c.id for c in calls]
            return Proposal("", "", text, messages=logged,
                            tool_calls=[{"id": c.id, "name": c.name, "input": c.input} for c in calls])
        self._turns.pop(ctx.branch, None)
        if submissions:
            candidate, problem = prompting.candidate_from_submission(submissions[-1].input)
        elif calls:
            candidate, problem = None, f"still inspecting after {self.max_tool_rounds} rounds, no submission"
        else:
            candidate, problem = prompting.candidate_from_text(text)
            if candidate is None:
                problem = _why_no_candidate(reply.stop, problem)
        if candidate is None:  # the graph logs it as a rejected attempt, so the next turn's history shows why
            return Proposal("", "", text, messages=logged, format_error=problem)
        return Proposal(candidate.language, candidate.source, candidate.rationale or text, messages=logged)


def _why_no_candidate(stop_reason: str | None, problem: str) -> str:
    if stop_reason == "max_tokens":
        return f"the answer was cut off at max_tokens before a {SUBMIT} call"
    if stop_reason == "refusal":
        return "the model refused to answer"
    return f"no {SUBMIT} call and {problem.removeprefix('the answer has ')}"


def _thinking_param(thinking: str | int) -> dict | None:
    if thinking in ("off", "none", 0, None):
        return None
    if thinking == "adaptive":
        return {"type": "adaptive"}
    if isinstance(thinking, int) or (isinstance(thinking, str) and thinking.isdigit()):
        if int(thinking) < 1024:
            raise PolicyError(f"a thinking budget must be at least 1024 tokens, not {thinking}")
        return {"type": "enabled", "budget_tokens": int(thinking)}
    raise PolicyError(f"thinking must be 'adaptive', 'off' or a token budget, not {thinking!r}")


def _describe(error: Exception) -> str:
    status = getattr(error, "status_code", None)
    message = " ".join(str(getattr(error, "message", error)).split())[:300]
    return f"{type(error).__name__}{f' {status}' if status else ''}: {message}"
