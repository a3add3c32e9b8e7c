"""The OpenAI-compatible policy: any chat-completions server (vLLM, SGLang, llama.cpp, OpenAI itself).

Same turn structure and tools as the Anthropic policy, through function calling. A server that does not do tools
(a 400 that mentions tools, or tools=False) switches the policy to text mode for the rest of the run: the model
answers with a fenced ```python block, parsed by prompting.candidate_from_text. Servers cache prompt prefixes on their
own, so the stable part (system + target) always comes first.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import openai

from agent import prompting
from agent.inspect_tools import SUBMIT, TOOLS, openai_tools
from agent.policy import AttemptView, Message, PolicyError, Proposal, ProposeContext, RunDigest
from tools.records.wire import openai as wire

log = logging.getLogger(__name__)

PROVIDER = "openai"


@dataclass
class _Turn:
    messages: list[dict]
    rounds: int = 0
    pending_ids: list[str] = field(default_factory=list)


class OpenAIPolicy:
    """`--policy openai --base-url URL --model NAME`. Settings: tools (False: text mode from the start), max_tokens,
    max_retries and timeout (the SDK's retries with backoff on 408/409/429/5xx), keep_full, max_tool_rounds,
    price ($/MTok input, output; without it the cost is counted as 0, right for a local server)."""

    name = "openai"

    def __init__(self, model: str = "", *, base_url: str | None = None, api_key: str | None = None, tools: bool = True,
                 max_tokens: int = 16_384, max_retries: int = 4, timeout: float = 900.0, keep_full: int = 4,
                 max_tool_rounds: int = 4, price: tuple[float, float] | None = None):
        if not model:
            raise PolicyError("--policy openai needs --model (the name the server serves)")
        # Local servers accept any key; api.openai.com needs a real one.
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if base_url else None)
        if not api_key:
            raise PolicyError("no OpenAI API key: set OPENAI_API_KEY, or pass --base-url for a local server")
        self.model = model
        self.base_url = base_url or "https://api.openai.com/v1"
        self.use_tools = tools
        self.max_tokens = max_tokens
        self.keep_full = keep_full
        self.max_tool_rounds = max_tool_rounds
        self.price = price
        if price is None:
            log.info("no price given for model %s: its cost is counted as $0", model)
        self.client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout)
        self._turns: dict[int, _Turn] = {}

    # -- Policy ----------------------------------------------------------------------------------------------------
    def propose(self, ctx: ProposeContext) -> Proposal:
        turn = self._turns.get(ctx.branch)
        if turn is not None and ctx.tool_results:
            turn.messages += self._tool_messages(turn, ctx.tool_results)
        else:
            turn = self._turns[ctx.branch] = _Turn(messages=self._first_messages(ctx))
        logged: list[Message] = []
        had_tools = self.use_tools
        response = self._call(ctx, turn, logged)
        if response is None and had_tools and not self.use_tools:
            # The server just refused tools: this turn starts over in text mode.
            turn = self._turns[ctx.branch] = _Turn(messages=self._first_messages(ctx))
            response = self._call(ctx, turn, logged)
        if response is None:
            self._turns.pop(ctx.branch, None)
            return Proposal("", "", "", messages=logged, format_error=logged[-1].content["error"])
        return self._read(ctx, turn, response, logged)

    def reflect(self, ctx: ProposeContext, attempt: AttemptView) -> tuple[str, list[Message]]:
        return "", []  # the model reflects in its next turn, with the evidence in front of it

    def distill(self, digest: RunDigest) -> tuple[list[dict], list[dict], list[Message]]:
        """After a run: one extra call (agent/prompts/lessons.md.j2) for lessons and judgements of the lessons the
        run was shown (agent/learn.py stores them). A failed call gives no lessons, only its log."""
        params = {"model": self.model, "max_completion_tokens": 2048,
                  "messages": [{"role": "user", "content": prompting.lessons_prompt(digest)}]}
        logged = [Message("request", json.loads(json.dumps(params)), provider=PROVIDER, model=self.model)]
        started = time.monotonic()
        try:
            response = self.client.chat.completions.create(**params)
        except openai.APIError as e:
            logged.append(Message("error", {"error": f"lesson call failed: {_describe(e)}", "type": type(e).__name__},
                                  provider=PROVIDER, model=self.model, latency_s=time.monotonic() - started))
            return [], [], logged
        body = response.to_dict()
        logged.append(self._response_message(body, time.monotonic() - started))
        reply = wire.read_response(body)
        return (*prompting.lessons_from_text(reply.text if reply else ""), logged)

    # -- requests --------------------------------------------------------------------------------------------------
    def _first_messages(self, ctx: ProposeContext) -> list[dict]:
        return [{"role": "system", "content": prompting.system_prompt(ctx.language, tools=self.use_tools)},
                {"role": "user", "content": prompting.target_prompt(ctx) + "\n" +
                 prompting.turn_prompt(ctx, self.keep_full)}]

    def _tool_messages(self, turn: _Turn, results: list[dict]) -> list[dict]:
        answered = {r.get("tool_use_id") for r in results}
        messages = [{"role": "tool", "tool_call_id": r.get("tool_use_id", ""), "content": str(r.get("content", ""))}
                    for r in results]
        messages += [{"role": "tool", "tool_call_id": i, "content": "no result (the tool was not run)"}
                     for i in turn.pending_ids if i not in answered]
        if turn.rounds >= self.max_tool_rounds:
            messages.append({"role": "user", "content": f"That was the last inspection round: call {SUBMIT} now."})
        return messages

    def _call(self, ctx: ProposeContext, turn: _Turn, logged: list[Message]) -> dict | None:
        """One request; its response body (logged last), or None when it failed (an error message is logged), after
        switching to text mode if the server refused tools."""
        params = {"model": self.model, "messages": turn.messages, "max_completion_tokens": self.max_tokens}
        if self.use_tools:
            params["tools"] = openai_tools(TOOLS)
        logged.append(Message("request", json.loads(json.dumps(params)), provider=PROVIDER, model=self.model))
        started = time.monotonic()
        try:
            response = self.client.chat.completions.create(**params)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise PolicyError(f"{self.base_url} rejected the API key ({e.status_code}): check OPENAI_API_KEY") \
                from None
        except openai.NotFoundError:
            raise PolicyError(f"{self.base_url} does not serve model {self.model!r} (404): check --model and "
                              "--base-url") from None
        except openai.APIError as e:
            problem = f"model call failed: {_describe(e)}"
            # Only the opening request of a turn tells "no tools here" apart from a bad tool exchange mid-turn.
            if (isinstance(e, openai.BadRequestError) and self.use_tools and not turn.rounds
                    and "tool" in str(e.message).lower()):
                self.use_tools = False
                problem = f"the server does not support tools, switching to text answers: {_describe(e)}"
                log.warning("%s", problem)
            logged.append(Message("error", {"error": problem, "type": type(e).__name__}, provider=PROVIDER,
                                  model=self.model, latency_s=time.monotonic() - started))
            return None
        body = response.to_dict()
        logged.append(self._response_message(body, time.monotonic() - started))
        return body

    def _response_message(self, body: dict, latency: float) -> Message:
        tokens = wire.tokens(body)
        prompt = tokens["input_tokens"] + tokens["cache_read_tokens"]
        cost = (prompt * self.price[0] + tokens["output_tokens"] * self.price[1]) / 1e6 if self.price else 0.0
        return Message("response", body, provider=PROVIDER, model=self.model, latency_s=latency, cost_usd=cost,
                       **tokens)

    # -- answers ---------------------------------------------------------------------------------------------------
    def _read(self, ctx: ProposeContext, turn: _Turn, body: dict, logged: list[Message]) -> Proposal:
        reply = wire.read_response(body)
        if reply is None:
            self._turns.pop(ctx.branch, None)
            return Proposal("", "", "", messages=logged, format_error="the server returned no choices")
        text = reply.text.strip()
        calls, submissions = reply.calls, reply.submissions
        if calls and not submissions and turn.rounds < self.max_tool_rounds:
            turn.messages.append(wire.assistant_turn(body))
            turn.rounds += 1
            turn.pending_ids = [c.id for c in calls]
            # Arguments that are not JSON go to the tool node as text; run_tool answers with a clear error.
            return Proposal("", "", text, messages=logged, tool_calls=[
                {"id": c.id, "name": c.name, "input": c.input} for c in calls])
        self._turns.pop(ctx.branch, None)
        if submissions:
            arguments = submissions[-1].input
            if isinstance(arguments, str):
                candidate, problem = None, f"{SUBMIT} arguments are not valid JSON"
            else:
                candidate, problem = prompting.candidate_from_submission(arguments)
        elif calls:
            candidate, problem = None, f"still inspecting after {self.max_tool_rounds} rounds, no submission"
        else:
            candidate, problem = prompting.candidate_from_text(text)
            if reply.stop == "length":
                problem = "the answer was cut off at max_tokens before a candidate"
        if candidate is None:
            return Proposal("", "", text, messages=logged, format_error=problem)
        return Proposal(candidate.language, candidate.source, candidate.rationale or text, messages=logged)


def _describe(error: openai.APIError) -> str:
    status = getattr(error, "status_code", None)
    message = " ".join(str(getattr(error, "message", error)).split())[:300]
    return f"{type(error).__name__}{f' {status}' if status else ''}: {message}"
