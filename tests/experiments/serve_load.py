"""`kloop serve` under load with the real evaluator (issue 11), not a test: --requests concurrent requests from a
loopback load generator, a `kill -9` of the service mid-load and a restart on the same database, then checks that
every acknowledged request was answered exactly once with the answer its candidate deserves.

    source tests/experiments/gpu_env.sh; python tests/experiments/serve_load.py --out "$OUT" --gpus all
                  # one worker per GPU; on one H100, 40 requests took 5.3 minutes (results/serve-load-h100/)
    python tests/experiments/serve_load.py --out /tmp/serve-load --workers 2 --requests 12 --kill-after 4 --queue 4
                                               # CPU smoke test (Triton interpreter, 2 cores): about 1.5 minutes

The requests (vector_add, cheap evaluation options): mostly the triton_block starter rendered at varying tunables
(verdict correct), every 10th adds 1 to the sum (incorrect), every 50th spins forever in forward under a small
per-request time limit (error kind time_limit). Each has its own idempotency key; a client retries its POST after a
429 (sleeping Retry-After) or a refused connection with the same key, and waits for its answer with
GET /v1/result/{id}?wait=true, across the restart. The queue is smaller than the load, so backpressure happens.

After --kill-after answers, the service is killed with SIGKILL; the script records which of its processes outlive
it (its workers must die with it) and which requests were running (the restart must run exactly those again), and
restarts it on the same port and database. Memory: the service's RSS, alone and with its workers, sampled each second.
The last lines are a table of goals with PASS/FAIL; the full report goes to OUT/serve_load.json, the service's logs to
OUT/serve-1.log and OUT/serve-2.log, its database to OUT/serve.db. Exit status 0 even when a goal fails.
"""
from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.kernels.catalog import STARTERS, render  # noqa: E402

# The cheapest evaluation the service allows: the load is about the service, not the timings.
QUICK = {"trials": 1, "variant_trials": 0, "timed_calls": 5, "warmup_calls": 1, "baselines": ["eager"]}
SPIN = "    def forward(self, a, b):\n        while True:  # never returns: only the service's time limit ends it\n" \
       "            pass\n"
GROWTH_LIMIT_MB = 64    # the service's own RSS, median of a life's second half over its first half


def say(*parts) -> None:
    print(*parts, flush=True)


def replace_once(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise RuntimeError(f"triton_block changed: {old!r} is not in it exactly once")
    return source.replace(old, new)


def request_mix(n: int, tag: str, spin_limit_s: float) -> list[dict]:
    starter = next(s for s in STARTERS["vector_add"] if s.name == "vector_add/triton_block")
    combos = list(itertools.product(*starter.tunables.values()))
    mix = []
    for i in range(n):
        # the comment makes every source unique, as an RL batch's are; the tunables vary what is compiled
        source = render(starter, dict(zip(starter.tunables, combos[i % len(combos)]))) + f"\n# serve_load {i}\n"
        options = dict(QUICK)
        if i % 50 == 7:
            expect = "time_limit"
            source = replace_once(source, "    def forward(self, a, b):\n", SPIN)
            options["time_limit_s"] = spin_limit_s
        elif i % 10 == 3:
            expect = "incorrect"
            source = replace_once(source, "a + b, mask=mask", "a + b + 1, mask=mask")
        else:
            expect = "correct"
        key = f"{tag}-{i}"
        mix.append({"index": i, "expect": expect, "key": key,
                    "body": {"target": "vector_add", "candidate": source, "options": options, "key": key}})
    return mix


def call(url: str, method: str, path: str, body: dict | None = None, timeout: float = 120.0):
    """(status, JSON body, Retry-After); (None, why, None) when the service cannot be reached or hung up."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), None
    except urllib.error.HTTPError as e:
        try:
            payload = json.loads(e.read() or b"{}")
        except ValueError:
            payload = {}
        return e.code, payload, e.headers.get("Retry-After")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}", None


class Service:
    """`kloop serve` as a child process; start() again restarts it on the same port and database."""

    def __init__(self, args, db: Path) -> None:
        self.args, self.db = args, db
        self.proc: subprocess.Popen | None = None
        self.port, self.life, self.url = 0, 0, ""
        self.env = dict(os.environ)
        if not args.gpus:
            self.env["TRITON_INTERPRET"] = "1"  # no GPU: the workers run Triton kernels on CPU tensors

    def start(self, timeout_s: float = 300) -> str:
        """The service's first line (listening on ..., and how many requests it requeued)."""
        self.life += 1
        log = self.args.out / f"serve-{self.life}.log"
        devices = ["--gpus", self.args.gpus] if self.args.gpus else ["--workers", str(self.args.workers)]
        with open(log, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "serve", "--port", str(self.port), "--db", str(self.db),
                 "--queue", str(self.args.queue), "--time-limit", str(self.args.time_limit), *devices],
                cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        deadline = time.monotonic() + timeout_s
        while True:
            text = log.read_text(errors="replace")
            line = next((x for x in text.splitlines() if "listening on" in x), None)
            if line:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the service did not start (exit {self.proc.returncode}): {text[-3000:]}")
            time.sleep(0.2)
        self.port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))  # a restart takes the same port
        self.url = f"http://127.0.0.1:{self.port}"
        return line

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(p: psutil.Process) -> dict:
    try:
        return {"pid": p.pid, "ppid": p.ppid(), "name": p.name(), "cmdline": " ".join(p.cmdline())[:300]}
    except psutil.Error:
        return {"pid": p.pid}


class Load:
    """The load generator's shared state: per-request records, and counters the kill waits on."""

    def __init__(self, service: Service, deadline_s: float) -> None:
        self.service, self.deadline_s = service, deadline_s
        self.answered = 0
        self.answered_changed = threading.Condition()
        self.started = time.monotonic()
        self.records: list[dict] = []
        self.seen: dict[tuple, psutil.Process] = {}   # every process of the service's tree seen by the sampler
        self.memory: list[dict] = []

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def client(self, req: dict) -> None:
        rec = {"index": req["index"], "key": req["key"], "expect": req["expect"], "fired_s": self.now(), "id": None,
               "acked_s": None, "answered_s": None, "answer": None, "busy_429": 0, "unreachable": 0, "error": None}
        self.records.append(rec)
        deadline = time.monotonic() + self.deadline_s
        while rec["id"] is None:   # the same body (and key) until the service acknowledges it
            status, body, retry_after = call(self.service.url, "POST", "/v1/evaluate", req["body"])
            if status in (200, 202):
                rec["id"], rec["acked_s"] = body["id"], self.now()
            elif status == 429:
                rec["busy_429"] += 1
                time.sleep(float(retry_after or 1))
            elif status is None:
                rec["unreachable"] += 1
                time.sleep(0.5)
            else:
                rec["error"] = f"POST: {status} {body}"
                return
            if time.monotonic() > deadline:
                rec["error"] = "no acknowledgement before the deadline"
                return
        while rec["answer"] is None:
            status, body, _ = call(self.service.url, "GET", f"/v1/result/{rec['id']}?wait=true&timeout=60",
                                   timeout=90)
            if status == 200 and body.get("status") == "done":
                rec["answer"], rec["answered_s"] = body, self.now()
                with self.answered_changed:
                    self.answered += 1
                    self.answered_changed.notify_all()
            elif status is None:
                rec["unreachable"] += 1
                time.sleep(0.5)
            elif status != 202:
                rec["error"] = f"GET result: {status} {body}"
                return
            if rec["answer"] is None and time.monotonic() > deadline:
                rec["error"] = "no answer before the deadline"
                return

    def sample(self, stop: threading.Event) -> None:
        """Each second: the service's RSS alone and with every process under it."""
        while not stop.wait(1.0):
            proc, life = self.service.proc, self.service.life
            try:
                root = psutil.Process(proc.pid)
                own = root.memory_info().rss
                tree = root.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            total = own
            for p in tree:
                try:
                    total += p.memory_info().rss
                    self.seen.setdefault((p.pid, p.create_time()), p)
                except psutil.NoSuchProcess:
                    pass
            self.memory.append({"t_s": self.now(), "life": life, "own_mb": round(own / 2**20, 1),
                                "with_children_mb": round(total / 2**20, 1), "processes": 1 + len(tree)})

    def progress(self, stop: threading.Event) -> None:
        while not stop.wait(10.0):
            recs = list(self.records)
            say(f"[{self.now():6.0f} s] life {self.service.life}: acknowledged {sum(r['id'] is not None for r in recs)}"
                f", answered {self.answered}/{len(recs)}, 429s {sum(r['busy_429'] for r in recs)}, connection "
                f"failures {sum(r['unreachable'] for r in recs)}")


def kill_9(service: Service, load: Load) -> dict:
    """SIGKILL the service mid-load, see which of its processes outlive it, and restart it on the same database."""
    root = psutil.Process(service.proc.pid)
    tree = root.children(recursive=True)
    before = [describe(p) for p in tree]
    at = load.now()
    service.proc.send_signal(signal.SIGKILL)
    service.proc.wait()
    # its workers get SIGKILL from PR_SET_PDEATHSIG, their jailed processes die with them: allow a moment
    grace = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < grace:
        time.sleep(0.2)
    survivors = [describe(p) for p in tree if alive(p)]
    for p in tree:  # report them, then end them, so the restarted service has the devices to itself
        if alive(p):
            p.kill()
    # read-only: a writer's close would checkpoint the WAL, and the restart should recover it as the kill left it
    conn = sqlite3.connect(f"file:{service.db}?mode=ro", uri=True)
    try:
        running = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE state = 'running'")]
        states = dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
    finally:
        conn.close()
    line = service.start()
    requeued = re.search(r"(\d+) request\(s\) requeued", line)
    recs = list(load.records)
    return {"at_s": at, "answered_before": load.answered, "processes_before": before, "survivors": survivors,
            "db_states_at_kill": states, "running_at_kill": running,
            "acknowledged_unanswered_at_kill": sum(r["acked_s"] is not None and r["acked_s"] <= at and
                                                   (r["answered_s"] is None or r["answered_s"] > at) for r in recs),
            "restart_s": round(load.now() - at, 2), "restart_line": line,
            "requeued": int(requeued.group(1)) if requeued else 0}


def observed(answer: dict) -> str:
    error = answer.get("error")
    return error["kind"] if error else (answer.get("result") or {}).get("verdict")


def memory_summary(samples: list[dict], limit_mb: float) -> dict:
    lives = {}
    for life in sorted({s["life"] for s in samples}):
        xs = [s for s in samples if s["life"] == life]
        if len(xs) < 4:
            continue
        half = len(xs) // 2
        row = {"samples": len(xs), "seconds": round(xs[-1]["t_s"] - xs[0]["t_s"], 1)}
        for k in ("own_mb", "with_children_mb"):
            values = [s[k] for s in xs]
            first, second = statistics.median(values[:half]), statistics.median(values[half:])
            row[k] = {"max": max(values), "first_half_median": first, "second_half_median": second,
                      "growth": round(second - first, 1)}
        lives[life] = row
    own_max = max((s["own_mb"] for s in samples), default=None)
    return {"lives": lives, "own_max_mb": own_max, "own_limit_mb": limit_mb,
            "with_children_max_mb": max((s["with_children_mb"] for s in samples), default=None),
            "max_processes": max((s["processes"] for s in samples), default=None)}


def check(report: dict, load: Load, db: Path) -> None:
    recs = sorted(load.records, key=lambda r: r["index"])
    n = len(recs)
    acked = [r for r in recs if r["id"]]
    answered = [r for r in recs if r["answer"]]
    wrong = [{"index": r["index"], "expect": r["expect"], "got": observed(r["answer"]),
              "reasons": ((r["answer"].get("result") or {}).get("reasons") or [])[:2], "error": r["answer"]["error"]}
             for r in answered if observed(r["answer"]) != r["expect"]]
    limits = [r["answer"]["error"]["message"] for r in answered if r["expect"] == "time_limit" and
              r["answer"].get("error")]
    # every acknowledged key sent once more: the service must hand back the id it gave, not queue a second request
    bodies = report.pop("bodies")
    same = 0
    for r in acked:
        status, body, _ = call(load.service.url, "POST", "/v1/evaluate", bodies[r["index"]])
        same += status in (200, 202) and body["id"] == r["id"]
    report["health_at_end"] = call(load.service.url, "GET", "/v1/health")[1]
    load.service.stop()
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, key, state, runs, response FROM jobs").fetchall()
    by_id = {row[0]: row for row in rows}
    kill = report.get("kill") or {}
    rerun = set(kill.get("running_at_kill", []))
    runs = {row[0]: row[3] for row in rows}
    stored_same = sum(r["id"] in by_id and json.loads(by_id[r["id"]][4] or "null") ==
                      {k: v for k, v in r["answer"].items() if k not in ("id", "status")} for r in answered)
    latencies = sorted(r["answered_s"] - r["fired_s"] for r in answered)
    times = sorted(r["answered_s"] for r in answered)
    wall = times[-1] if times else 0   # the clock starts as the load is fired
    report["results"] = {
        "requests": n, "acknowledged": len(acked), "answered": len(answered),
        "client_errors": [{"index": r["index"], "error": r["error"]} for r in recs if r["error"]],
        "expected": {k: sum(r["expect"] == k for r in recs) for k in ("correct", "incorrect", "time_limit")},
        "observed": {k: sum(observed(r["answer"]) == k for r in answered) for k in
                     sorted({observed(r["answer"]) for r in answered}, key=str)},
        "wrong_answers": wrong, "time_limit_messages": sorted(set(limits)),
        "distinct_ids": len({r["id"] for r in acked}), "same_id_when_resent": same,
        "db_rows": len(rows), "db_states": {s: sum(row[2] == s for row in rows) for s in {row[2] for row in rows}},
        "db_keys_match": all(r["id"] in by_id and by_id[r["id"]][1] == r["key"] for r in acked),
        "db_runs": {str(k): sum(v == k for v in runs.values()) for k in sorted(set(runs.values()))},
        "runs_2_exactly_the_requeued": {i for i, v in runs.items() if v == 2} == rerun and
                                       all(v == 1 for i, v in runs.items() if i not in rerun),
        "answer_is_the_stored_one": stored_same,
        "busy_429": sum(r["busy_429"] for r in recs), "requests_with_429": sum(r["busy_429"] > 0 for r in recs),
        "connection_failures": sum(r["unreachable"] for r in recs),
        "load_wall_s": round(wall, 1), "per_minute": round(len(answered) / wall * 60, 1) if wall else None,
        "first_answer_s": round(times[0], 1) if times else None,   # the workers' warm-up
        "per_minute_after_first": round((len(times) - 1) / (times[-1] - times[0]) * 60, 1)
                                  if len(times) > 1 and times[-1] > times[0] else None,
        "latency_s": {"median": round(statistics.median(latencies), 1),
                      "p95": round(latencies[int(0.95 * (len(latencies) - 1))], 1),
                      "max": round(latencies[-1], 1)} if latencies else None,
    }
    report["memory"] = memory_summary(load.memory, report["args"]["rss_limit_mb"])
    time.sleep(2)  # the stopped service's processes: none may be left running
    report["left_running_at_end"] = [describe(p) for p in load.seen.values() if alive(p)]


def goals(report: dict) -> list[dict]:
    res, kill, mem = report["results"], report.get("kill"), report["memory"]
    n = res["requests"]
    found = [
        {"goal": f"every request acknowledged and answered ({n} concurrent)",
         "passed": res["acknowledged"] == n and res["answered"] == n and not res["client_errors"],
         "detail": f"{res['acknowledged']} acknowledged, {res['answered']} answered, "
                   f"{len(res['client_errors'])} client errors; {res['per_minute']}/min over {res['load_wall_s']} s "
                   f"(first answer at {res['first_answer_s']} s, then {res['per_minute_after_first']}/min)"},
        {"goal": "each answer as its candidate deserves (correct / incorrect / time_limit)",
         "passed": not res["wrong_answers"] and res["answered"] == n,
         "detail": f"expected {res['expected']}, got {res['observed']}"},
        {"goal": "none duplicated: one id per key, the same id when sent again, one row each",
         "passed": res["distinct_ids"] == res["acknowledged"] == res["same_id_when_resent"] == res["db_rows"]
                   and res["db_keys_match"],
         "detail": f"{res['distinct_ids']} ids, {res['same_id_when_resent']} same when resent, {res['db_rows']} rows"},
        {"goal": "every request answered once (all done; runs 1, or 2 for those running at the kill)",
         "passed": res["db_states"] == {"done": n} and res["runs_2_exactly_the_requeued"]
                   and res["answer_is_the_stored_one"] == res["answered"],
         "detail": f"states {res['db_states']}, runs {res['db_runs']}, "
                   f"{res['answer_is_the_stored_one']} answers equal to the stored ones"},
        {"goal": "a request over its time limit gets a clear error",
         "passed": None if not res["expected"]["time_limit"] else
                   res["observed"].get("time_limit", 0) == res["expected"]["time_limit"]
                   and all("time limit" in m for m in res["time_limit_messages"]),
         "detail": "; ".join(res["time_limit_messages"])[:300] or "none (every 50th request, from the 8th, spins)"},
        {"goal": "backpressure: 429 + Retry-After, retried with the same key",
         "passed": (res["acknowledged"] == n) if res["busy_429"] else None,
         "detail": f"{res['busy_429']} 429s on {res['requests_with_429']} requests" if res["busy_429"] else
                   "the queue never filled (raise --requests or lower --queue)"},
    ]
    if kill:
        found.append({"goal": "kill -9 mid-load loses nothing acknowledged",
                      "passed": kill["requeued"] == len(kill["running_at_kill"]) and res["answered"] == n,
                      "detail": f"killed after {kill['answered_before']} answers with "
                                f"{kill['acknowledged_unanswered_at_kill']} acknowledged and unanswered "
                                f"({kill['db_states_at_kill']}); restart requeued {kill['requeued']}, answering "
                                f"again in {kill['restart_s']} s"})
        found.append({"goal": "the service's workers die with it (kill -9), nothing left at the end",
                      "passed": not kill["survivors"] and not report["left_running_at_end"],
                      "detail": f"{len(kill['processes_before'])} processes under it, {len(kill['survivors'])} "
                                f"survived the kill, {len(report['left_running_at_end'])} left at the end"})
    lives = mem["lives"].values()
    growth = max((life["own_mb"]["growth"] for life in lives), default=None)
    found.append({"goal": f"memory bounded: service RSS <= {mem['own_limit_mb']:g} MB, growth between halves "
                          f"<= {GROWTH_LIMIT_MB} MB",
                  "passed": None if growth is None else mem["own_max_mb"] <= mem["own_limit_mb"]
                  and growth <= GROWTH_LIMIT_MB,
                  "detail": f"own max {mem['own_max_mb']} MB, growth {growth} MB; with workers max "
                            f"{mem['with_children_max_mb']} MB, growth "
                            f"{[life['with_children_mb']['growth'] for life in lives]} MB per life"})
    return found


def table(report: dict) -> str:
    lines = []
    for goal in report.get("goals", []):
        mark = "PASS" if goal["passed"] else "FAIL" if goal["passed"] is False else "n/a "
        lines.append(f"{mark} {goal['goal']}: {goal['detail']}")
    if report.get("error"):
        lines.append(f"ERROR: {report['error'].strip().splitlines()[-1][:300]}")
    return "\n".join(lines)


def run(args, report: dict, service: Service, db: Path) -> None:
    mix = request_mix(args.requests, uuid.uuid4().hex[:8], args.spin_limit)
    report["bodies"] = [r["body"] for r in mix]   # for the resend check; not written out
    # fired as soon as the service listens, as a trainer would: its workers warm up under the load (first_answer_s)
    report["first_line"] = service.start()
    say(report["first_line"])
    load = Load(service, args.deadline_s)
    stop = threading.Event()
    helpers = [threading.Thread(target=load.sample, args=(stop,), daemon=True),
               threading.Thread(target=load.progress, args=(stop,), daemon=True)]
    clients = [threading.Thread(target=load.client, args=(req,), daemon=True) for req in mix]
    for t in helpers + clients:
        t.start()
    if 0 < args.kill_after < len(mix):
        with load.answered_changed:
            while load.answered < args.kill_after and any(t.is_alive() for t in clients):
                load.answered_changed.wait(1.0)
        report["kill"] = kill_9(service, load)
        say(f"kill -9 after {report['kill']['answered_before']} answers; {len(report['kill']['survivors'])} of its "
            f"processes survived; {report['kill']['restart_line']}")
    for t in clients:
        t.join()
    stop.set()
    check(report, load, db)
    report["requests"] = sorted(load.records, key=lambda r: r["index"])
    report["memory"]["samples"] = load.memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", default=None, help="all or indices (0,1): one worker per GPU; default CPU workers")
    parser.add_argument("--workers", type=int, default=2, help="CPU workers (without --gpus)")
    parser.add_argument("--requests", type=int, default=200, help="fired at once, each by its own thread")
    parser.add_argument("--kill-after", type=int, default=60, help="answers before the kill -9 (0: no kill)")
    parser.add_argument("--queue", type=int, default=50, help="the service's --queue: less than --requests gives 429s")
    parser.add_argument("--time-limit", type=float, default=300, help="the service's --time-limit in seconds")
    parser.add_argument("--spin-limit", type=float, default=3, help="time_limit_s of the requests that spin")
    parser.add_argument("--deadline-s", type=float, default=1800, help="a client gives up this long after firing")
    parser.add_argument("--rss-limit-mb", type=float, default=1024, help="the service process's own RSS goal")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "serve.db"
    for stale in (db, db.with_name("serve.db-wal"), db.with_name("serve.db-shm")):
        stale.unlink(missing_ok=True)
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "options": QUICK}
    service = Service(args, db)
    started = time.monotonic()
    # under `timeout` (a machine's command limit) the service is still stopped and the report so far written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"stopped by SIGTERM after {time.monotonic() - started:.0f} s"))
    try:
        run(args, report, service, db)
        report["goals"] = goals(report)
    except BaseException:
        report["error"] = traceback.format_exc()[-6000:]
        raise
    finally:
        service.stop()
        report["wall_s"] = round(time.monotonic() - started, 1)
        report.pop("bodies", None)
        (args.out / "serve_load.json").write_text(json.dumps(report, indent=1, default=str))
        say("")
        say(table(report))
        say(f"wrote {args.out / 'serve_load.json'} ({report['wall_s']} s in all)")


if __name__ == "__main__":
    main()
