"""The replay policy: re-drive a logged run from its recorded model responses, with no network.

Each recorded response that carried a candidate (a submit_candidate call, or a fenced block in a text answer) is
proposed again, branch by branch, in the order it was logged; inspection-only responses and unusable answers were
not candidates then and are skipped now. When a branch has nothing left the policy says it is done.
"""
from __future__ import annotations

from collections import defaultdict, deque

from agent import prompting
from agent.policy import AttemptView, Message, PolicyError, Proposal, ProposeContext
from tools.records import wire
from tools.records.store import StoreError


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
    reply = wire.read_response(provider, body)
    if reply is None:
        return None
    if reply.submissions:
        call = reply.submissions[-1]
        return prompting.candidate_from_submission(call.input)[0] if call.parsed else None
    if reply.calls:
        return None
    return prompting.candidate_from_text(reply.text)[0]
