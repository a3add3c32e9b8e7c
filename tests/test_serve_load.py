"""`kloop serve` under load (issue 11): 200 concurrent requests from a loopback load generator, twice, against a stub
evaluator. Every request is answered, none lost or duplicated, and the service's memory stays bounded."""
from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
psutil = pytest.importorskip("psutil")

from agent.serve_client import ServeClient  # noqa: E402
from test_serve import STUB, Server  # noqa: E402  (tests/ is on sys.path under pytest, like fakes/)

CONCURRENT = 200


def rss_mb(pid: int) -> tuple[float, float]:
    """(the service's own RSS, the service with its workers) in MB."""
    proc = psutil.Process(pid)
    own = proc.memory_info().rss
    children = sum(c.memory_info().rss for c in proc.children(recursive=True))
    return own / 2**20, (own + children) / 2**20


@pytest.mark.slow
def test_200_concurrent_requests(tmp_path):
    log = tmp_path / "calls.log"
    s = Server(tmp_path, "--evaluator", STUB, "--workers", "2", "--queue", "50",
               env={"KLOOP_STUB_LOG": str(log)}).start()
    try:
        client = ServeClient(s.url, timeout_s=300)
        client.evaluate("vector_add", "warm-up")  # workers started
        log.write_text("")
        rss = [rss_mb(s.proc.pid)]
        rates = []
        for wave in range(2):
            names = [f"w{wave}-r{i}" for i in range(CONCURRENT)]
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
                answers = list(pool.map(lambda n: client.evaluate("vector_add", f"{n}\nsleep=0.01"), names))
            rates.append(CONCURRENT / (time.perf_counter() - started))
            rss.append(rss_mb(s.proc.pid))
            assert all(a["status"] == "done" and a["result"]["verdict"] == "correct" for a in answers)
            assert len({a["id"] for a in answers}) == CONCURRENT
        health = client.health()
    finally:
        s.stop()
    calls = log.read_text().split()
    assert len(calls) == 2 * CONCURRENT and len(set(calls)) == 2 * CONCURRENT  # each evaluated exactly once
    with sqlite3.connect(s.db) as conn:
        rows = conn.execute("SELECT state, runs, count(*) FROM jobs GROUP BY state, runs").fetchall()
    assert rows == [("done", 1, 2 * CONCURRENT + 1)]
    assert health["queued"] == 0 and health["running"] == 0
    # memory: the second wave must not grow the service like the first one did (nothing kept per request in memory)
    growth_second = rss[2][0] - rss[1][0]
    print(f"\nkloop serve load: {CONCURRENT} concurrent x 2 waves, 2 stub workers, queue 50: "
          f"{rates[0]:.0f} and {rates[1]:.0f} requests/s; service RSS {rss[0][0]:.0f} -> {rss[1][0]:.0f} -> "
          f"{rss[2][0]:.0f} MB (with workers {rss[0][1]:.0f} -> {rss[2][1]:.0f} MB)")
    assert growth_second < 40, rss
