"""A client of `kloop serve` (standard library only: urllib), and reward functions for trainers that call it.

    from agent.serve_client import ServeClient, trl_reward_func
    client = ServeClient("http://127.0.0.1:8765", token=None)
    answer = client.evaluate("vector_add", candidate_source)      # {"status": "done", "result", "reward", ...}

    trainer = GRPOTrainer(model=..., reward_funcs=[trl_reward_func("http://127.0.0.1:8765")], train_dataset=ds)
    # ds has a column `target` (or `reference_source`): a built-in name or KernelBench-style source

    # verl: custom_reward_function.path=agent/serve_client.py custom_reward_function.name=compute_score
    #       (ground_truth = the reference source, as `kloop export --format verl` writes; KLOOP_SERVE_URL and
    #        KLOOP_SERVE_TOKEN say where the service is)

The candidate is taken out of a completion as agent/reward.py does (a submit_candidate call, structured or in any chat
template's text: Qwen/Hermes, Llama 3, Mistral, plain JSON; else a fenced ```python block); a completion without one
scores 0 (format_error) without a request. Which device judged each reward is logged ("kloop.reward").
The reward is the service's (tools/records/reward.py). A request the service refuses as full (429) is sent again
after its Retry-After, with the same idempotency key, so a retried request is never evaluated twice.
"""
from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

DEFAULT_URL = "http://127.0.0.1:8765"
log = logging.getLogger("kloop.reward")


class ServeError(Exception):
    """The service refused or failed a request (status is the HTTP status, 0 when it could not be reached)."""

    def __init__(self, message: str, status: int = 0, answer: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.answer = status, answer


class ServeClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 3600.0,
                 busy_retries: int = 1000, connect_retries: int = 5) -> None:
        self.url = (url or os.environ.get("KLOOP_SERVE_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("KLOOP_SERVE_TOKEN")
        self.timeout_s, self.busy_retries, self.connect_retries = timeout_s, busy_retries, connect_retries

    # -- the API -----------------------------------------------------------------------------------------------------
    def health(self) -> dict:
        return self._request("GET", "/v1/health")[1]

    def submit(self, target: str, candidate: str, options: dict | None = None, key: str | None = None) -> str:
        """Queue one evaluation; its id. Waits out 429s (Retry-After) with the same key."""
        body = self._body(target, candidate, options, key)
        return self._request("POST", "/v1/evaluate", body, retry_busy=True)[1]["id"]

    def result(self, job_id: str, wait: bool = False, timeout_s: float | None = None) -> dict:
        query = {"wait": "true", "timeout": str(timeout_s or self.timeout_s)} if wait else {}
        path = f"/v1/result/{urllib.parse.quote(job_id)}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        return self._request("GET", path)[1]

    def evaluate(self, target: str, candidate: str, options: dict | None = None, key: str | None = None) -> dict:
        """One evaluation, waited for: the service's answer (status done, result, components, reward, error)."""
        body = self._body(target, candidate, options, key)
        deadline = time.monotonic() + self.timeout_s
        query = urllib.parse.urlencode({"wait": "true", "timeout": str(self.timeout_s)})
        answer = self._request("POST", f"/v1/evaluate?{query}", body, retry_busy=True)[1]
        while answer.get("status") != "done":
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServeError(f"no answer to request {answer.get('id')} within {self.timeout_s:g} s", 0, answer)
            answer = self.result(answer["id"], wait=True, timeout_s=left)
        return answer

    def evaluate_many(self, requests: list[dict], concurrency: int = 8) -> list[dict]:
        """evaluate(**r) for each r, `concurrency` at a time; answers in the order of the requests."""
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(lambda r: self.evaluate(**r), requests))

    # -- plumbing ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _body(target, candidate, options, key) -> dict:
        return {"target": target, "candidate": candidate, "options": options or {}, "key": key or uuid.uuid4().hex}

    def _request(self, method: str, path: str, body: dict | None = None, retry_busy: bool = False) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        busy = unreachable = 0
        while True:
            request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s + 60) as response:
                    return response.status, json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as e:
                try:
                    answer = json.loads(e.read() or b"{}")
                except ValueError:
                    answer = {}
                if e.code == 429 and retry_busy and busy < self.busy_retries:
                    busy += 1
                    time.sleep(_retry_after(e.headers.get("Retry-After")))
                    continue
                raise ServeError(f"{method} {path.split('?')[0]}: {e.code} {answer.get('error') or e.reason}",
                                 e.code, answer) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                # the service restarting: the same body (and key) again, so nothing is evaluated twice
                if unreachable < self.connect_retries:
                    unreachable += 1
                    time.sleep(min(2.0 ** unreachable * 0.25, 10.0))
                    continue
                raise ServeError(f"cannot reach {self.url}: {getattr(e, 'reason', e)}") from None


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value), 0.05), 300.0)
    except (TypeError, ValueError):
        return 1.0


# -- reward functions ---------------------------------------------------------------------------------------------------

def completion_reward(client: ServeClient, completion: Any, target: str, language: str | None = None,
                      options: dict | None = None) -> float:
    """The reward of one completion: 0 without a candidate (format_error), else the service's reward. ServeError
    when the service answers with no reward (a target it cannot use, an internal error)."""
    from agent.reward import candidate_of

    candidate, _ = candidate_of(completion)
    if candidate is None or (language and candidate.language != language):
        return 0.0
    answer = client.evaluate(target, candidate.source, options)
    if answer.get("reward") is None:
        error = answer.get("error") or {}
        raise ServeError(f"no reward for request {answer.get('id')}: {error.get('kind')}: {error.get('message')}",
                         200, answer)
    result = answer.get("result") or {}
    log.info("kloop reward %s (%s) judged on %s by %s", answer["reward"], result.get("verdict"),
             result.get("executed_on"), client.url)
    return float(answer["reward"])


def trl_reward_func(url: str | None = None, token: str | None = None, target_column: str | None = None,
                    language: str | None = None, options: dict | None = None, concurrency: int = 16) -> Callable:
    """A reward function for TRL's GRPOTrainer(reward_funcs=[...]): (prompts, completions, **columns) ->
    list[float]. The target of each completion comes from the dataset column `target_column` (default: `target`,
    else `reference_source`), a built-in name or KernelBench-style source."""
    client = ServeClient(url, token)

    def kloop_reward(prompts=None, completions=None, **kwargs) -> list[float]:
        column = target_column or ("target" if "target" in kwargs else "reference_source")
        targets = kwargs.get(column)
        if targets is None:
            raise ServeError(f"the dataset has no column {column!r} with each prompt's target")
        if isinstance(targets, str):
            targets = [targets] * len(completions)
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(completions) or 1))) as pool:
            return list(pool.map(lambda pair: completion_reward(client, pair[0], pair[1], language, options),
                                 zip(completions, targets)))

    return kloop_reward


_verl_client: ServeClient | None = None


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl's custom reward function: ground_truth is the target (reference source or built-in name); the
    service is at KLOOP_SERVE_URL (default http://127.0.0.1:8765) with KLOOP_SERVE_TOKEN."""
    global _verl_client
    if _verl_client is None:
        _verl_client = ServeClient()
    language = (extra_info or {}).get("language") if isinstance(extra_info, dict) else None
    return completion_reward(_verl_client, solution_str, ground_truth,
                             None if language in (None, "", "auto") else language)
