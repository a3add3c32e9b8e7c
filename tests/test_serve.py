"""`kloop serve` (agent/serve.py) and its client and reward adapters (agent/serve_client.py), on loopback only.

Most tests run the service as `python -m agent.cli serve` with a stub evaluator (tests/fakes/serve_stub.py: the
candidate's text says how long to take and what to answer); one goes through the real evaluator (interpreter).
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from agent import serve  # noqa: E402
from agent.serve_client import ServeClient, ServeError, compute_score, trl_reward_func  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STUB = "tests.fakes.serve_stub:evaluate"


class Server:
    def __init__(self, tmp_path: Path, *args: str, db: Path | None = None, env: dict | None = None) -> None:
        self.db = db or tmp_path / "serve.db"
        self.args = ["--port", "0", "--db", str(self.db), *args]
        self.env = {**os.environ, **(env or {})}
        self.proc = None
        self.port = None

    def start(self, timeout_s: float = 60) -> "Server":
        self.proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "serve", *self.args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise AssertionError(f"no start: {line!r} {self.proc.stderr.read()}")
        self.port = int(line.split("http://127.0.0.1:")[1].split()[0])
        self.url = f"http://127.0.0.1:{self.port}"
        self.line = line
        return self

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def call(self, method: str, path: str, body=None, token: str | None = None, raw: bytes | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, json.loads(r.read()), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), dict(e.headers)


@pytest.fixture
def server(tmp_path):
    started = []

    def make(*args, **kwargs) -> Server:
        s = Server(tmp_path, *args, **kwargs).start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop(signal.SIGKILL)


def wait_state(s: Server, job_id: str, state: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if s.call("GET", f"/v1/result/{job_id}")[1]["status"] == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"{job_id} never {state}")


def fenced(body: str) -> str:
    return f"Here it is.\n```python\n{body}\nclass ModelNew:\n    pass\n```\n"


def test_api_with_a_stub(server):
    s = server("--evaluator", STUB, "--workers", "1")
    status, health, _ = s.call("GET", "/v1/health")
    assert status == 200 and health["status"] == "ok" and health["workers"] == 1 and health["device"] == "cpu"

    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "speedup=2"})
    assert status == 200 and answer["status"] == "done" and answer["error"] is None
    assert answer["result"]["verdict"] == "correct" and answer["components"]["correct"] is True
    assert answer["reward"] == pytest.approx(1.5)  # 1 + 0.5 * log2(2)
    status, again, _ = s.call("GET", f"/v1/result/{answer['id']}")
    assert status == 200 and again["reward"] == answer["reward"]

    status, queued, _ = s.call("POST", "/v1/evaluate", {"target": "vector_add", "candidate": "verdict=incorrect"})
    assert status == 202 and queued["status"] == "queued"
    status, done, _ = s.call("GET", f"/v1/result/{queued['id']}?wait=true")
    assert status == 200 and done["result"]["verdict"] == "incorrect" and done["reward"] == pytest.approx(0.1)

    bad = [(b"{not json", "the body is not JSON"), (b"[1, 2]", "must be a JSON object"),
           (json.dumps({"target": "no_such_op", "candidate": "x"}).encode(), "unknown target 'no_such_op'"),
           (json.dumps({"target": "vector_add"}).encode(), "candidate must be"),
           (json.dumps({"target": "vector_add", "candidate": "x", "options": {"trails": 3}}).encode(),
            "unknown option 'trails'"),
           (json.dumps({"target": "import torch\nx = 1\n", "candidate": "x"}).encode(), "defines no Model")]
    for raw, words in bad:
        status, answer, _ = s.call("POST", "/v1/evaluate", raw=raw)
        assert status == 400 and words in answer["error"] and "\n" not in answer["error"], (raw, answer)
    assert s.call("GET", "/v1/result/nope")[0] == 404
    assert s.call("GET", "/v1/other")[0] == 404

    # a target the worker cannot use, and a worker that dies twice: answers with an error and no reward
    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "target-error"})
    assert answer["error"]["kind"] == "target" and answer["reward"] is None
    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "crash"})
    assert answer["error"]["kind"] == "internal" and "died" in answer["error"]["message"]
    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "fine"})
    assert answer["result"]["verdict"] == "correct"  # a fresh worker took over


def test_auth(server, tmp_path):
    # anything but loopback needs a token: one line, exit 2, nothing listening
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "serve", "--host", "0.0.0.0", "--db",
                           str(tmp_path / "x.db")], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "KLOOP_SERVE_TOKEN"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "--token" in proc.stderr
    assert not (tmp_path / "x.db").exists()
    serve.check_config("10.1.2.3", serve.ServiceConfig(token="a-long-token"))   # accepted with a token
    serve.check_config("::1", serve.ServiceConfig())                           # loopback needs none
    with pytest.raises(serve.ServeError):
        serve.check_config("example.org", serve.ServiceConfig())

    s = server("--evaluator", STUB, "--workers", "1", "--token", "sesame-1234")
    body = {"target": "vector_add", "candidate": "x"}
    assert s.call("POST", "/v1/evaluate", body)[0] == 401
    status, answer, headers = s.call("POST", "/v1/evaluate", body, token="wrong-token")
    assert status == 401 and "bearer" in answer["error"] and headers.get("www-authenticate", "").startswith("Bearer")
    status, answer, _ = s.call("POST", "/v1/evaluate", body, token="sesame-1234")
    assert status == 202
    assert s.call("GET", f"/v1/result/{answer['id']}")[0] == 401
    assert s.call("GET", f"/v1/result/{answer['id']}?wait=true", token="sesame-1234")[0] == 200
    assert s.call("GET", "/v1/health")[0] == 200  # liveness probes carry no token
    with pytest.raises(ServeError) as e:
        ServeClient(s.url, token="nope").evaluate("vector_add", "x")
    assert e.value.status == 401
    assert ServeClient(s.url, token="sesame-1234").evaluate("vector_add", "x")["reward"] == 1.0


def test_a_full_queue_asks_clients_back_when_half_of_it_is_answered(tmp_path):
    service = serve.Service(serve.ServiceConfig(db=str(tmp_path / "serve.db"), workers=2, max_queue=50))
    service._mean_eval_s = 4.0                # 2 workers: an answer every 2 s
    assert service._retry_after(50) == 50     # 25 answers, not the whole queue's 100 s (the workers would idle)
    assert service._retry_after(30) == 10     # a queue shrunk since (a smaller --queue at a restart)
    assert service._retry_after(10) == 2      # at least one answer's time
    service._mean_eval_s = 1000.0
    assert service._retry_after(50) == 300    # capped
    service.store.close()


def test_backpressure_and_time_limit(server):
    s = server("--evaluator", STUB, "--workers", "1", "--queue", "1", "--time-limit", "30")
    status, a, _ = s.call("POST", "/v1/evaluate", {"target": "vector_add", "candidate": "sleep=3"})
    assert status == 202
    wait_state(s, a["id"], "running")
    status, b, _ = s.call("POST", "/v1/evaluate", {"target": "vector_add", "candidate": "sleep=0"})
    assert status == 202  # one may wait
    status, c, headers = s.call("POST", "/v1/evaluate", {"target": "vector_add", "candidate": "sleep=0"})
    assert status == 429 and "queue is full" in c["error"] and int(headers["retry-after"]) >= 1
    for job in (a, b):
        assert s.call("GET", f"/v1/result/{job['id']}?wait=true")[1]["result"]["verdict"] == "correct"

    # over the time limit: a clear error result, the worker is replaced, the next request is answered
    started = time.monotonic()
    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "sleep=60",
                                                                  "options": {"time_limit_s": 1}})
    assert time.monotonic() - started < 20
    assert answer["result"]["verdict"] == "timeout" and answer["error"]["kind"] == "time_limit"
    assert "time limit of 1 s" in answer["error"]["message"] and answer["reward"] == pytest.approx(0.1)
    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "quick"})
    assert answer["result"]["verdict"] == "correct"
    # a request may not ask for more than the service's limit
    status, answer, _ = s.call("POST", "/v1/evaluate?wait=true", {"target": "vector_add", "candidate": "x",
                                                                  "options": {"time_limit_s": 10000}})
    assert status == 200


def test_kill_9_loses_nothing_acknowledged(tmp_path):
    log = tmp_path / "calls.log"
    first = Server(tmp_path, "--evaluator", STUB, "--workers", "1", env={"KLOOP_STUB_LOG": str(log)}).start()
    try:
        ids = {}
        for name, sleep in (("a", 3), ("b", 0.1), ("c", 0.1)):
            status, answer, _ = first.call("POST", "/v1/evaluate", {"target": "vector_add", "key": f"key-{name}",
                                                                    "candidate": f"{name}\nsleep={sleep}"})
            assert status == 202
            ids[name] = answer["id"]
        wait_state(first, ids["a"], "running")
        first.proc.send_signal(signal.SIGKILL)  # mid-queue: a running, b and c waiting
        first.proc.wait(10)
    finally:
        first.stop(signal.SIGKILL)
    time.sleep(0.5)
    assert log.read_text().split() == ["a"]  # the old worker died with the service, mid-evaluation

    second = Server(tmp_path, "--evaluator", STUB, "--workers", "1", db=first.db,
                    env={"KLOOP_STUB_LOG": str(log)}).start()
    try:
        assert "3 request(s) requeued" not in second.line and "1 request(s) requeued" in second.line
        for name, job_id in ids.items():
            status, answer, _ = second.call("GET", f"/v1/result/{job_id}?wait=true")
            assert status == 200 and answer["result"]["verdict"] == "correct", name
        # a client retrying an acknowledged request with its key gets the same id, not a second evaluation
        status, answer, _ = second.call("POST", "/v1/evaluate", {"target": "vector_add", "key": "key-b",
                                                                 "candidate": "b\nsleep=0.1"})
        assert answer["id"] == ids["b"]
    finally:
        second.stop()
    assert sorted(log.read_text().split()) == ["a", "a", "b", "c"]  # a re-run once, the others once each
    with sqlite3.connect(first.db) as conn:
        rows = conn.execute("SELECT id, state, runs FROM jobs ORDER BY seq").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(ids[n], "done") for n in "abc"]
    assert [r[2] for r in rows] == [2, 1, 1]


def test_trainer_adapters(server, monkeypatch):
    s = server("--evaluator", STUB, "--workers", "2")
    reward = trl_reward_func(s.url)
    completions = [fenced("# speedup=4"),                                       # 1 + 0.5 * 2
                   [{"role": "user", "content": "write it"},
                    {"role": "assistant", "content": fenced("# verdict=incorrect")}],  # conversational
                   "no code at all",                                            # format_error: 0, no request
                   fenced("# verdict=compile_error")]
    scores = reward(prompts=["p"] * 4, completions=completions, target=["vector_add"] * 4)
    assert scores == pytest.approx([2.0, 0.1, 0.0, 0.0])
    assert reward.__name__ == "kloop_reward"
    assert s.call("GET", "/v1/health")[1]["answered"] == 3
    # TRL hands dataset columns over as lists; kloop's rl export names the column reference_source
    source = (REPO / "tests/targets/tiny_add.py").read_text()
    assert trl_reward_func(s.url)(prompts=["p"], completions=[fenced("# speedup=1")],
                                  reference_source=[source]) == [1.0]

    monkeypatch.setattr("agent.serve_client._verl_client", None)
    monkeypatch.setenv("KLOOP_SERVE_URL", s.url)
    assert compute_score("kloop/vector_add", fenced("# speedup=0.5"), "vector_add", {}) == pytest.approx(0.5)
    assert compute_score("kloop/vector_add", fenced("# x"), "vector_add", {"language": "ptx"}) == 0.0
    with pytest.raises(ServeError):
        compute_score("kloop/vector_add", fenced("# target-error"), "vector_add", None)


def test_real_evaluator_on_tiny_add(server, tmp_path):
    """Through the real evaluator (a worker with its own Session; Triton interpreter at CPU sizes); one log line per
    answered request; SIGTERM leaves nothing in the scratch root."""
    scratch = tmp_path / "scratch"
    s = server("--workers", "1", "--time-limit", "280", env={"KLOOP_SCRATCH": str(scratch)})
    target = (REPO / "tests/targets/tiny_add.py").read_text()
    client = ServeClient(s.url, timeout_s=280)
    answer = client.evaluate(target, (REPO / "tests/candidates/honest_add.py").read_text(),
                             options={"trials": 2, "variant_trials": 1})
    assert answer["error"] is None, answer["error"]
    result = answer["result"]
    assert result["verdict"] == "correct", result["reasons"]
    assert result["executed_on"] == "cpu-interpreter" and result["correctness"]["trials"] >= 2
    assert answer["reward"] == 1.0 and answer["components"]["correct"] is True
    wrong = client.evaluate("vector_add", (REPO / "tests/candidates/torch_compute.py").read_text())
    assert wrong["result"]["verdict"] != "correct" and wrong["reward"] < 1.0
    assert any(p.name.startswith("kloop-session-") for p in scratch.iterdir())
    s.stop(signal.SIGTERM)
    assert s.proc.returncode == 0
    assert sorted(p.name for p in scratch.iterdir() if p.name != "kloop-gpu-users") == []
    logged = s.proc.stdout.read().splitlines()
    assert logged[0].startswith(f"kloop serve: {answer['id']} target source '") and ": correct, reward 1," in logged[0]
    assert logged[1].startswith(f"kloop serve: {wrong['id']} target vector_add: ") and "on cpu-0" in logged[1]
