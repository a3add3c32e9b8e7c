"""The replay policy: re-drive a logged run from its recorded model responses, with no network.

Each recorded response that carried a candidate (a submit_candidate call, or a fenced block in a text answer) is
proposed again, branch by branch, in the order it was logged; inspection-only responses and unusable answers were
not candidates then and are skipped now. When a branch has nothing left the policy says it is done.
"""
from __future__ import annotations

import json
from collections import defaultdict, deque

from agent import prompting
from agent.inspect_tools import SUBMIT
from agent.policy import AttemptView, Message, PolicyError, Proposal, ProposeContext
from tools.store import StoreError


class ReplayPolicy:
    """`--policy replay --from RUN_ID`: the source run must be in the same database as the new run."""

    name = "replay"

    def __init__(self, store, source_run_id: str):
        try:
            source = store.get_run(source_run_id)
            rows = store.messages(source_run_id)
        except StoreError as e:
            raise PolicyError(f"cannot replay: {e}") from None
        self.model = source.get("model") or ""
        self.source_run_id = source_run_id
        self._queues: dict[int, deque[prompting.Candidate]] = defaultdict(deque)
        for row in rows:
            if row["role"] != "response":
                continue
            candidate = candidate_from_response(row.get("provider") or "", row.get("content"))
            if candidate is not None:
                self._queues[row.get("branch") or 0].append(candidate)
        if not self._queues:
            raise PolicyError(f"cannot replay run {source_run_id}: it has no recorded model responses with candidates")

    def propose(self, ctx: ProposeContext) -> Proposal:
        queue = self._queues.get(ctx.branch)
        if not queue:
            return Proposal("", "", "", done=True)
        candidate = queue.popleft()
        return Proposal(candidate.language, candidate.source, candidate.rationale)

    def reflect(self, ctx: ProposeContext, attempt: AttemptView) -> tuple[str, list[Message]]:
        return "", []


def candidate_from_response(provider: str, body) -> prompting.Candidate | None:
    """The candidate a logged response body carried, or None (inspection only, unusable, or an unknown provider)."""
    if not isinstance(body, dict):
        return None
    if provider == "anthropic":
        blocks = body.get("content") or []
        calls = [b for b in blocks if b.get("type") == "tool_use"]
        submissions = [b for b in calls if b.get("name") == SUBMIT]
        if submissions:
            return prompting.candidate_from_submission(submissions[-1].get("input"))[0]
        if calls:
            return None
        return prompting.candidate_from_text("\n".join(b.get("text", "") for b in blocks if b.get("type") == "text"))[0]
    if provider == "openai":
        choices = body.get("choices") or []
        if not choices:
            return None
        message = choices[0].get("message") or {}
        calls = [c.get("function") or {} for c in message.get("tool_calls") or []]
        submissions = [c for c in calls if c.get("name") == SUBMIT]
        if submissions:
            try:
                arguments = json.loads(submissions[-1].get("arguments") or "{}")
            except json.JSONDecodeError:
                return None
            return prompting.candidate_from_submission(arguments)[0]
        if calls:
            return None
        return prompting.candidate_from_text(message.get("content") or "")[0]
    return None
