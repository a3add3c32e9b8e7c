import ast
import json
import sqlite3
import threading
from pathlib import Path

import pytest

import evaluated
from agent.policy import Message
from tools.result import EvalResult
from tools.records.store import (ATTEMPT_COLUMNS, FASTEST_ORDER, SCHEMA_VERSION, StoreError, attempt_columns, fastest_key,
                         open_db, source_hash)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def db(tmp_path):
    store = open_db(tmp_path / "runs" / "kloop.db")
    yield store
    store.close()


def test_round_trip_decodes_json_and_links_messages(db):
    run_id = db.create_run(target_name="softmax", policy="offline", settings={"max_attempts": 3, "hours": None})
    first = db.add_attempt(run_id, [Message(role="request", content={"prompt": "go"}, input_tokens=100, cost_usd=0.5),
                                    Message(role="response", content={"text": "ok"}, output_tokens=20)],
                           language="triton", source="x = 1\n", verdict="correct", reasons=[],
                           speedup_eager=1.5, time_us={"median": 3.0}, result={"verdict": "correct"})
    second = db.add_attempt(run_id, language="triton", source="x = 2", verdict="correct", speedup_eager=2.5)
    db.add_attempt(run_id, language="ptx", source="x = 3", verdict="compile_error", reasons=["line 4: bad"])

    run = db.get_run(run_id)
    assert run["settings"] == {"max_attempts": 3, "hours": None} and run["status"] == "running"
    attempts = db.attempts(run_id)
    assert [a.number for a in attempts] == [1, 2, 3]
    assert attempts[0].to_dict()["time_us"] == {"median": 3.0} and attempts[0].to_dict()["result"] == {"verdict": "correct"}
    assert attempts[0].median_us == 3.0 and attempts[0].timed and attempts[0].result == EvalResult(verdict="correct")
    assert attempts[2].reasons == ["line 4: bad"] and attempts[2].median_us is None and not attempts[2].timed
    assert attempts[0].source_hash == source_hash("x = 1")
    assert db.best_attempt(run_id) is None  # the best is what the loop names, never a guess from the columns
    db.update_run(run_id, best_attempt_id=second)
    assert db.best_attempt(run_id).id == second and db.progress(run_id)["best_speedup"] == 2.5
    messages = db.messages(run_id)
    assert [(m["seq"], m["role"], m["attempt_id"]) for m in messages] == [(1, "request", first), (2, "response", first)]
    assert messages[0]["content"] == {"prompt": "go"}
    assert db.usage(run_id) == {"tokens": 120, "cost_usd": 0.5}
    progress = db.progress(run_id)
    assert (progress["attempts"], progress["best_number"], progress["last_number"]) == (3, 2, 3)
    listed = db.list_runs()
    assert listed[0]["attempts_count"] == 3 and listed[0]["best_speedup_eager"] == 2.5


def test_attempt_numbers_are_per_run_and_survive_reopening(tmp_path):
    path = tmp_path / "k.db"
    db = open_db(path)
    a, b = db.create_run(target_name="a"), db.create_run(target_name="b")
    for run_id in (a, b, a):
        db.add_attempt(run_id, source="s", verdict="correct")
    db.close()
    db = open_db(path, create=False)
    assert db.next_attempt_number(a) == 3 and db.next_attempt_number(b) == 2
    assert [x.number for x in db.attempts(a)] == [1, 2]


def test_a_failed_transaction_leaves_nothing(db):
    run_id = db.create_run(target_name="t")
    with pytest.raises(RuntimeError):
        with db.transaction():
            db.add_attempt(run_id, [Message(role="response", content="half")], source="s", verdict="correct")
            raise RuntimeError("crash between the attempt and the run update")
    with pytest.raises(sqlite3.IntegrityError):  # foreign keys are on: no attempt of a run that does not exist
        db.add_attempt("nope", source="s")
    assert db.attempts(run_id) == [] and db.messages(run_id) == []
    assert db.next_attempt_number(run_id) == 1


def test_unknown_run_column_and_status_are_one_line_errors(db):
    with pytest.raises(StoreError, match=r"no run zzz in .*kloop.db"):
        db.get_run("zzz")
    run_id = db.create_run(target_name="t")
    with pytest.raises(StoreError, match="unknown column"):
        db.update_run(run_id, colour="blue")
    with pytest.raises(StoreError, match="unknown run status"):
        db.update_run(run_id, status="sleeping")


@pytest.mark.parametrize("version, message", [(SCHEMA_VERSION + 1, "newer than this kloop"), (0, "older than any")])
def test_other_schema_versions_are_refused(tmp_path, version, message):
    path = tmp_path / "k.db"
    open_db(path).db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)]).connection.commit()
    with pytest.raises(StoreError, match=message):
        open_db(path)


def test_files_that_are_not_kloop_databases(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"certainly not sqlite" * 100)
    with pytest.raises(StoreError, match="is not a SQLite database"):
        open_db(junk)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE notes (text)").connection.commit()
    with pytest.raises(StoreError, match="not a kloop run database"):
        open_db(other)
    with pytest.raises(StoreError, match="no run database at"):
        open_db(tmp_path / "missing.db", create=False)


def test_unwritable_and_locked_paths(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(StoreError, match="cannot create"):
        open_db(blocker / "kloop.db")

    path = tmp_path / "k.db"
    open_db(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write
    try:
        with pytest.raises(StoreError, match="locked by another process"):
            open_db(path, timeout=0.1)
    finally:
        holder.execute("ROLLBACK")


def test_read_only_open_reads_without_the_write_lock_and_refuses_writes(tmp_path):
    path = tmp_path / "k.db"
    writer = open_db(path)
    run_id = writer.create_run(target_name="t", gpu={"name": "NVIDIA H200", "sms": 132})
    writer.add_attempt(run_id, source="s", verdict="correct")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write: readers go on (WAL)
    try:
        reader = open_db(path, create=False, readonly=True, timeout=0.1)
        assert reader.get_run(run_id)["gpu"] == {"name": "NVIDIA H200", "sms": 132}
        assert [a.number for a in reader.attempts(run_id)] == [1]
    finally:
        holder.execute("ROLLBACK")
    with pytest.raises(StoreError, match="opened read-only"):
        reader.add_attempt(run_id, source="t", verdict="correct")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.db.execute("DELETE FROM attempts")  # the connection itself is read-only: no raw write gets through
    assert len(writer.attempts(run_id)) == 1
    with pytest.raises(StoreError, match="cannot create"):
        open_db(tmp_path / "new.db", readonly=True)
    with pytest.raises(StoreError, match="no run database at"):
        open_db(tmp_path / "new.db", create=False, readonly=True)
    (tmp_path / "new.db").touch()  # what a reader sees while a run is creating the database: read, not written
    with pytest.raises(StoreError, match="no kloop tables yet"):
        open_db(tmp_path / "new.db", create=False, readonly=True)
    assert (tmp_path / "new.db").stat().st_size == 0


def test_a_v1_file_from_before_runs_gpu_gains_the_column_on_a_writable_open(tmp_path):
    path = tmp_path / "old.db"
    db = open_db(path)
    run_id = db.create_run(target_name="t", gpu_name="NVIDIA H100")
    db.db.execute("ALTER TABLE runs DROP COLUMN gpu")
    db.close()
    old = open_db(path, create=False, readonly=True)   # read as it is: the column is simply absent
    assert "gpu" not in old.get_run(run_id) and old.get_run(run_id)["gpu_name"] == "NVIDIA H100"
    old.close()
    db = open_db(path, create=False)
    db.update_run(run_id, gpu={"name": "NVIDIA H100"})
    assert db.get_run(run_id)["gpu"] == {"name": "NVIDIA H100"}
    assert db.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_attempt_columns_maps_an_evaluator_result():
    result = evaluated.result("correct", 3.0, eager_us=6.0, compile_us=4.5, gpu=evaluated.H200,
                              nbytes=int(0.7 * 3.0 * 4800e3), durations_s={"total": 1.2}, stdout="hi")
    columns = attempt_columns(result)
    assert (columns["speedup_eager"], columns["speedup_compile"], columns["sol_fraction"]) == pytest.approx(
        (2.0, 1.5, 0.7))
    assert columns["durations"] == {"total": 1.2} and columns["stdout"] == "hi"
    assert columns["result"]["gpu"]["name"] == "NVIDIA H200" and columns["result"]["time_us"]["median"] == 3.0
    assert EvalResult.from_dict(columns["result"]) == result
    assert set(columns) <= set(ATTEMPT_COLUMNS)
    assert attempt_columns(EvalResult(verdict="format_error", reasons=["no code"]))["speedup_eager"] is None


def test_ptx_and_sass_are_stored_once_and_read_back_in_the_result(db):
    result = evaluated.result("correct", 3.0, eager_us=6.0)
    result.ptx, result.sass = {"k": ".visible .entry k()"}, {"k": "HMMA.16816.F32 R0, R4, R8, R0 ;" * 1000}
    columns = attempt_columns(result)
    assert "ptx" not in columns["result"] and "sass" not in columns["result"]   # in their own columns only
    run_id = db.create_run(target_name="matmul", policy="offline", settings={})
    db.add_attempt(run_id, source="x = 1", **columns)
    stored = db.db.execute("SELECT length(result), length(sass) FROM attempts").fetchone()
    assert stored[0] < 2_000 < 30_000 < stored[1]
    (row,) = db.attempts(run_id)
    assert row.result == result   # the result reads back whole
    assert row.to_dict()["result"]["sass"] == row.to_dict()["sass"] == result.sass


def test_history_reads_each_attempt_once_without_its_sass(db):
    # The loop reads a run's attempts before every proposal: re-reading thousands of rows each time made a proposal
    # cost seconds late in a long run. history() reads only the rows logged since its last call.
    result = evaluated.result("correct", 3.0, eager_us=6.0)
    result.ptx, result.sass = {"k": ".visible .entry k()"}, {"k": "HMMA.16816.F32 R0, R4, R8, R0 ;"}
    run_id, other = db.create_run(target_name="t"), db.create_run(target_name="u")
    db.add_attempt(run_id, source="a", branch=0, **attempt_columns(result))
    db.add_attempt(other, source="elsewhere")
    assert [a.source for a in db.history(run_id)] == ["a"]
    first = db.history(run_id)[0]
    assert "sass" not in first.to_dict() and not first.result.sass and first.result.ptx == result.ptx
    db.add_attempt(run_id, source="b", branch=1, verdict="correct")
    assert [a.source for a in db.history(run_id)] == ["a", "b"] and db.history(run_id)[0] is first   # read once
    with pytest.raises(RuntimeError):   # rolled back: read inside the transaction, then gone
        with db.transaction():
            db.add_attempt(run_id, source="lost", branch=0)
            assert [a.source for a in db.history(run_id)] == ["a", "b", "lost"]
            raise RuntimeError("crash before the commit")
    db.add_attempt(run_id, source="c", branch=0)
    assert [(a.number, a.source) for a in db.history(run_id)] == [(1, "a"), (2, "b"), (3, "c")]
    assert [a.source for a in db.history(run_id, 0)] == ["a", "c"]
    assert [a.source for a in db.attempts(run_id)] == ["a", "b", "c"]


def test_why_a_hidden_variant_failed_is_kept_for_the_operator_alone(db):
    result = EvalResult(verdict="runtime_error", reasons=["hidden variant 2: runtime_error"],
                        withheld=["hidden variant 2: runtime_error: ValueError: shape (7, 13)"])
    columns = attempt_columns(result)
    assert "withheld" not in columns["result"] and "(7, 13)" not in json.dumps(result.to_dict())
    run_id = db.create_run(target_name="t")
    db.add_attempt(run_id, source="a", **columns)
    assert db.attempts(run_id)[0].withheld == result.withheld          # kloop show's view
    assert db.attempts(run_id)[0].reasons == ["hidden variant 2: runtime_error"]
    assert db.history(run_id)[0].withheld is None                        # what the loop and its policy read
    assert "(7, 13)" not in json.dumps(db.history(run_id)[0].to_dict(), default=str)


def test_fastest_is_one_order_in_sql_and_in_python(tmp_path):
    """FASTEST_ORDER (SQL) and fastest_key (Python, rows in number order) rank verified attempts the same way:
    faster first, untimed last, the earlier of equals first."""
    db = open_db(tmp_path / "kloop.db")
    run_id = db.create_run(target_name="t")
    for speedup in (1.5, None, 2.0, 1.5, None, 0.5):
        db.add_attempt(run_id, verdict="correct", speedup_eager=speedup)
    in_sql = [row["number"] for row in db.db.query(
        f"SELECT number FROM attempts WHERE run_id = ? ORDER BY {FASTEST_ORDER}", [run_id])]
    in_python = [row.number for row in sorted(db.attempts(run_id), key=fastest_key)]
    assert in_sql == in_python == [3, 1, 4, 6, 2, 5]
    assert min(db.attempts(run_id), key=fastest_key).number == 3


def test_attempts_record_the_gpu_that_ran_them_and_older_files_gain_the_column(tmp_path):
    gpu = {"name": "NVIDIA H100 80GB HBM3", "index": 3, "uuid": "GPU-1234", "sms": 132}
    on_gpu = attempt_columns(EvalResult(verdict="correct", executed_on="cuda", gpu=gpu))
    assert on_gpu["gpu"] == {"index": 3, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234"}
    # planned for that GPU but never run on one (a compile error), or run by the CPU interpreter: no GPU
    assert attempt_columns(EvalResult(verdict="compile_error", gpu=gpu))["gpu"] is None
    assert attempt_columns(EvalResult(verdict="correct", executed_on="cpu-interpreter"))["gpu"] is None
    path = tmp_path / "old.db"
    db = open_db(path)
    run_id = db.create_run(target_name="t")
    db.add_attempt(run_id, source="a", verdict="correct")
    db.db.execute("ALTER TABLE attempts DROP COLUMN gpu")
    db.close()
    old = open_db(path, create=False, readonly=True)
    assert "gpu" not in old.attempts(run_id)[0].to_dict()
    old.close()
    db = open_db(path, create=False)
    db.add_attempt(run_id, source="b", **on_gpu)
    assert [a.gpu for a in db.attempts(run_id)] == [None, on_gpu["gpu"]]


def test_active_seconds_count_the_wall_time_each_attempt_added(tmp_path):
    db = open_db(tmp_path / "k.db")
    run_id = db.create_run(target_name="t")
    db.add_attempt(run_id, source="a", durations={"attempt": 5.0})               # logged before overlap existed
    db.add_attempt(run_id, source="b", durations={"attempt": 9.0, "wall": 1.5})  # in flight beside others
    assert db.progress(run_id)["seconds"] == 6.5


def test_two_connections_writing_one_database_wait_for_each_other(tmp_path):
    # a suite's lanes (one connection each) or two runs on one file: a transaction that reads, then writes after the
    # other connection wrote, failed at once as "locked" when it began deferred
    a, b = open_db(tmp_path / "k.db"), open_db(tmp_path / "k.db")
    run_id = a.create_run(target_name="t", policy="offline")
    inside, b_done = threading.Event(), threading.Event()

    def other_writer():
        inside.wait()
        b.update_run(run_id, notes="b")
        b_done.set()

    thread = threading.Thread(target=other_writer)
    thread.start()
    with a.transaction():
        assert a.get_run(run_id)["notes"] is None
        inside.set()
        assert not b_done.wait(0.5)   # b waits for this transaction's write lock
        a.update_run(run_id, notes="a")
    thread.join(20)
    assert b_done.is_set() and a.get_run(run_id)["notes"] == "b"   # then its write went through


def test_the_offline_marker_is_read_from_the_first_line_only_and_only_as_an_object():
    from tools.records.store import OFFLINE_MARK, offline_marker

    marked = OFFLINE_MARK + '{"template": "softmax/triton_row", "values": {"BLOCK": 1024}}\nx = 1\n'
    assert offline_marker(marked) == {"template": "softmax/triton_row", "values": {"BLOCK": 1024}}
    # a model may write the same words: anything but a JSON object after them is no marker
    assert [offline_marker(s) for s in (OFFLINE_MARK + "[1, 2]\n", OFFLINE_MARK + "{not json\n", "x = 1\n" + marked,
                                        None)] == [None, None, None, None]


# The keys "time_us" and "result" are read off a dict only by the store (its rows) and, elsewhere, off these dicts,
# none of them an attempt: (module, the dict as written) -> what it is.
ATTEMPT_KEYS = {"time_us", "result"}
STORE_MODULE = "tools/records/store.py"
NOT_ATTEMPTS = {
    ("tools/result.py", "data"): "EvalResult.from_dict reads an evaluator result's own JSON",
    ("agent/serve.py", "response"): "the HTTP service's reply: the evaluator's result under 'result'",
    ("agent/serve.py", "reply"): "the evaluator worker's reply, the same",
    ("agent/serve_client.py", "answer"): "the client reads the service's reply",
    ("agent/cmd_bench.py", "best"): "a bench table cell (tools.records.bench.fastest_by_language): its median 'time_us'",
    ("agent/cmd_loop.py", "r"): "a leaderboard row (tools.records.report.leaderboard): its median 'time_us'",
}


def attempt_key_reads(path) -> list[tuple[str, str, int, str]]:
    """(module, the dict as written, line, key) wherever a module reads "time_us" or "result" off a dict:
    d["time_us"], d.get("result")."""
    module = path.relative_to(REPO).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Subscript):
            read, key = node.value, node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args):
            read, key = node.func.value, node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and key.value in ATTEMPT_KEYS:
            found.append((module, ast.unparse(read), node.lineno, key.value))
    return found


def test_only_the_store_reads_attempts_by_column_name():
    paths = sorted(p for package in ("agent", "tools") for p in (REPO / package).rglob("*.py"))
    reads = [f"{module}:{line} reads {key!r} off {read}" for path in paths
             for module, read, line, key in attempt_key_reads(path)
             if module != STORE_MODULE and (module, read) not in NOT_ATTEMPTS]
    assert not reads, "read an attempt through tools.records.store.Attempt's fields:\n" + "\n".join(reads)


def test_the_column_name_check_sees_subscripts_and_gets(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    module = tmp_path / "m.py"
    module.write_text('a = row["time_us"]\nb = (row.get("result") or {}).get("gpu")\nc = row["speedup_eager"]\n'
                      'd = {"time_us": 1}\n')
    assert attempt_key_reads(module) == [("m.py", "row", 1, "time_us"), ("m.py", "row", 2, "result")]
