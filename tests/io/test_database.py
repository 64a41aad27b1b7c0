"""Database outputs (the Insert operator): `dqcep run --output sqlite:///FILE.db` as a
user runs it, rows against the JSON output of the same run."""
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest

from tests.support.broker import free_port
from tests.support.service import Service, expected_matches, gen_args
from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples"


def dqcep(*args):
    return subprocess.run([sys.executable, "-m", "dqcep", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


def rows(db: Path, table: str = "matches"):
    with sqlite3.connect(db) as conn:
        return conn.execute(f'SELECT * FROM "{table}"').fetchall()


def as_rows(json_lines: str, with_returns: bool = False):
    out = []
    for line in json_lines.splitlines():
        m = json.loads(line)
        row = (m["query"], m["detected_at"], json.dumps(m["events"]))
        out.append(row + (json.dumps(m.get("return", {})),) if with_returns else row)
    return sorted(out)


@pytest.mark.integration
def test_matches_land_in_a_sqlite_table_as_the_json_output_has_them(tmp_path):
    args = ("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl")
    expected = as_rows((EXAMPLES / "fire-expected.jsonl").read_text())
    db = tmp_path / "out" / "alerts.db"  # directories are made
    r = dqcep(*args, "--output", f"sqlite:///{db}", "--chunk-size", 2)
    assert r.returncode == 0, r.stderr
    assert sorted(rows(db)) == expected and len(expected) == 9
    with sqlite3.connect(db) as conn:
        columns = [(c[1], c[2]) for c in conn.execute("PRAGMA table_info(matches)")]
    assert columns == [("query", "TEXT"), ("detected_at", "BIGINT"), ("events", "TEXT")]
    # the reference matcher and a second run append to the same table
    assert dqcep(*args, "--engine", "reference", "--output", f"sqlite:///{db}").returncode == 0
    assert sorted(rows(db)) == sorted(expected * 2)
    # RETURN values, into a table of their own
    with_returns = dqcep(*args, "--returns")
    r = dqcep(*args, "--returns", "--output", f"sqlite:///{db}?table=alerts")
    assert r.returncode == 0, r.stderr
    assert sorted(rows(db, "alerts")) == as_rows(with_returns.stdout, True)


def test_matches_land_in_a_postgresql_table_as_the_json_output_has_them(postgres):
    """The same through a real PostgreSQL server (COPY into the table, one
    transaction per batch), with the password from the environment."""
    args = ("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl")
    expected = as_rows((EXAMPLES / "fire-expected.jsonl").read_text())
    r = dqcep(*args, "--output", postgres, "--chunk-size", 2)
    assert r.returncode == 0, r.stderr
    assert sorted(table_rows(postgres)) == expected and len(expected) == 9
    with_returns = dqcep(*args, "--returns")
    r = dqcep(*args, "--returns", "--engine", "reference", "--output",
              f"{postgres}?table=alerts")
    assert r.returncode == 0, r.stderr
    assert sorted(table_rows(postgres, "alerts")) == as_rows(with_returns.stdout, True)
    r = dqcep(*args, "--output", f"{postgres}?table=alerts")  # no returns column wanted
    assert r.returncode == 2 and "table 'alerts' has the columns query, detected_at, " \
        "events, returns; matches need query, detected_at, events" in r.stderr, r.stderr


def test_the_postgresql_password_comes_from_the_environment(postgres_server):
    url = postgres_server.password_user("s3cret")
    args = ("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl",
            "--output", url)
    for password, message in [(None, "no password supplied"),
                              ("wrong", "password authentication failed")]:
        env = {k: v for k, v in os.environ.items() if k != "DQCEP_DB_PASSWORD"}
        r = subprocess.run([sys.executable, "-m", "dqcep", *map(str, args)],
                           capture_output=True, text=True, cwd=ROOT,
                           env=env if password is None else {**env, "DQCEP_DB_PASSWORD": password})
        assert r.returncode == 1 and message in r.stderr, r.stderr
        assert "read from DQCEP_DB_PASSWORD" in r.stderr and len(r.stderr.splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "dqcep", *map(str, args)], capture_output=True,
                       text=True, cwd=ROOT, env={**os.environ, "DQCEP_DB_PASSWORD": "s3cret"})
    assert r.returncode == 0, r.stderr
    assert len(table_rows(url.replace("alice@", "dqcep@"))) == 9


@pytest.mark.integration
def test_kleene_lists_are_json_arrays_in_the_events_column(tmp_path, database_url):
    events = tmp_path / "iot.jsonl"
    assert dqcep("generate", "-n", 3000, "--seed", 3, "--quiet", "-o", events).returncode == 0
    q = EXAMPLES / "iot-kleene.cep"
    plain = dqcep("run", q, "--input", events)
    r = dqcep("run", q, "--input", events, "--output", database_url, "--chunk-size", 500)
    assert r.returncode == 0, r.stderr
    got = table_rows(database_url)
    assert plain.stdout and sorted(got) == as_rows(plain.stdout)
    assert any(isinstance(v, list) for _, _, ev in got for v in json.loads(ev).values())


@pytest.mark.integration
def test_bad_database_outputs_are_one_line_errors(tmp_path):
    args = ("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl",
            "--output")
    db = tmp_path / "x.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE matches (id INTEGER, note TEXT)")
    for target, message in [
            (f"sqlite:///{db}", "table 'matches' has the columns id, note; matches need "
                                "query, detected_at, events"),
            ("sqlite://host/x.db", "a SQLite URL names a file"),
            (f"sqlite:///{db}?table=a;drop", "must be a plain identifier"),
            (f"sqlite:///{db}?tabel=a", "unknown parameter(s) tabel"),
            (f"sqlite:///{tmp_path}", "cannot open the database")]:
        r = dqcep(*args, target)
        assert r.returncode == 2 and message in r.stderr, (target, r.stderr)
        assert "Traceback" not in r.stderr
    assert rows(db) == []  # the table it refused is untouched
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", "mqtt://127.0.0.1:1/t",
              "--output", f"sqlite:///{db}")
    assert r.returncode == 2 and "say where the service keeps its state: --state DIR" \
        in r.stderr
    # a server that is not there: one line naming it (exit 1, an I/O failure)
    r = dqcep(*args, f"postgresql://u@127.0.0.1:{free_port()}/db")
    assert r.returncode == 1 and r.stderr.startswith(
        "dqcep: cannot read or write postgresql://u@127.0.0.1:") and \
        len(r.stderr.splitlines()) == 1, r.stderr
    for target, message in [
            ("postgresql://u:secret@127.0.0.1:5432/db", "put no password in a database URL"),
            ("postgresql://127.0.0.1:5432", "names a server and a database")]:
        r = dqcep(*args, target)
        assert r.returncode == 2 and message in r.stderr and "secret" not in r.stderr, \
            (target, r.stderr)


def test_each_batch_is_one_transaction(tmp_path):
    """What docs/cli.md says: a batch's matches commit together, one transaction per
    engine batch (counted on the connection's statement trace)."""
    from dqcep.io.database import SqliteMatchSink
    from dqcep.lang import parse_file
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    from dqcep.io.readers import read_events
    queries = parse_file(EXAMPLES / "fire.cep").queries
    events = [e for _, e in read_events(str(EXAMPLES / "fire-events.jsonl"))]
    engine = Engine(build_plan(queries))
    first = engine.process(events[:7])
    second = engine.process(events[7:])
    second += engine.flush()
    batches = [first, second]
    assert all(len(b) for b in batches)
    sink = SqliteMatchSink(f"sqlite:///{tmp_path / 'm.db'}")
    statements = []
    sink.db.set_trace_callback(statements.append)
    for b in batches:
        sink.write_batch(b)
    sink.close()
    assert [s.split()[0] for s in statements] == [
        w for b in batches for w in ["BEGIN"] + ["INSERT"] * len(b) + ["COMMIT"]]
    assert len(rows(tmp_path / "m.db")) == sum(len(b) for b in batches)


def table_rows(url: str, table: str = "matches") -> list[tuple]:
    """Every row of a table, SQLite or PostgreSQL."""
    if url.startswith("sqlite:"):
        return rows(Path(url.split("?")[0][len("sqlite:///"):]), table)
    import psycopg
    from dqcep.io.database import postgres_target
    params, _ = postgres_target(url)
    with psycopg.connect(**params) as conn:
        return conn.execute(f'SELECT * FROM "{table}"').fetchall()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'alerts.db'}"
    return request.getfixturevalue("postgres")


def test_service_sigkill_mid_stream_writes_each_match_once(mosquitto, tmp_path, database_url):
    """The streaming service into a database, SIGKILLed twice mid-stream: the table
    holds exactly the reference matcher's matches, each once (the rows and the journal
    offset they cover commit together; a restart replays up to it without writing)."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/db-{uuid.uuid4().hex[:8]}"
    extra = ("--duplicates", "0.01")
    want, n_events = expected_matches(40_000, tmp_path, extra)
    want_rows = sorted(as_rows("\n".join(want)))
    svc = Service(tmp_path, url)
    svc.args[svc.args.index("-o") + 1] = database_url
    svc.args += ["--state", str(tmp_path / "state")]
    svc.start()
    pub = subprocess.Popen(gen_args(40_000, url, extra + ("--rate", "15000")))
    for seen in (6_000, 20_000):
        svc.wait_for(seen)
        svc.kill_and_restart(  # rows were committed before the kill
            while_down=lambda: table_rows(database_url) or pytest.fail("no row yet"))
    assert pub.wait(60) == 0
    svc.wait_for(n_events)
    svc.finish()
    got = table_rows(database_url)
    assert len(got) == len(set(got)), "a match was written twice"
    assert sorted(got) == want_rows and len(want_rows) > 50
    # one progress row, the table's
    assert [row[0] for row in table_rows(database_url, "dqcep_progress")] == ["matches"]


def test_a_table_another_service_wrote_is_refused(mosquitto, tmp_path):
    """A second service (a state of its own) into a table the first one writes would
    skip or repeat rows by the first one's journal offsets: refused, in one line."""
    host, port = mosquitto
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    url = f"mqtt://{host}:{port}/dqcep/shared"

    def service(state):
        svc = Service(tmp_path, url)
        args = svc.args
        svc.args = args[:args.index("--journal")] + args[args.index("-o"):] + \
            ["--state", str(tmp_path / state)]  # journal and checkpoint of its own
        svc.args[svc.args.index("-o") + 1] = db
        return svc
    first = service("one")
    first.start()
    subprocess.run(gen_args(5_000, url), check=True)
    first.wait_for(4_000)
    first.finish()
    assert table_rows(db)
    r = subprocess.run(service("two").args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "holds the matches of another service" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_crash_after_the_end_of_stream_was_written_repeats_no_held_match(tmp_path):
    """In-process: the matches held for a trailing NOT are written at the end of the
    stream, then the service dies before its checkpoint. The restart replays the
    journal and the end of the stream without writing: each match once."""
    from tests.support.journal_service import config, iot_payloads, journal_payloads
    from dqcep.core.events import event_from_mapping
    from dqcep.lang import parse_file
    from dqcep.baseline.reference import ReferenceMatcher
    from dqcep.service import StreamingService
    queries = tmp_path / "held.cep"
    queries.write_text("QUERY dry PATTERN SEQ(Temperature t, NOT Humidity h) WHERE [room] "
                       "WITHIN 5 s")
    payloads = iot_payloads(30_000)
    journal_payloads(tmp_path, payloads)
    cfg = config(tmp_path, queries=queries)
    cfg.output = f"sqlite:///{tmp_path / 'alerts.db'}"
    svc = StreamingService(cfg)
    while svc.step():
        pass
    svc.checkpoint()
    before = len(table_rows(cfg.output))
    svc.end_stream()
    svc.out.sync()
    held = len(table_rows(cfg.output)) - before
    assert held > 0                    # the stream's end released matches
    svc.close()                        # dies here: no checkpoint after the end of stream
    again = StreamingService(cfg)      # catches up, the end of the stream included
    while again.step():
        pass
    again.end_stream()
    again.checkpoint()
    again.close()
    got = table_rows(cfg.output)
    events = [event_from_mapping(e) for p in payloads for e in msgpack.unpackb(p)["events"]]
    want = sorted(as_rows("\n".join(json.dumps(m.to_json_obj()) for m in ReferenceMatcher(
        parse_file(queries).queries).run(events))))
    assert len(got) == len(set(got)) and sorted(got) == want
    assert again.counts["matches_out"] == len(want)


def test_the_service_waits_out_a_postgresql_outage(mosquitto, tmp_path):
    """The server goes away mid-stream: the service says so, goes back to its
    checkpoint and retries; when the server is back the table ends with exactly the
    reference matcher's matches, each once."""
    from tests.support.postgres import PostgresServer
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/outage"
    want, n_events = expected_matches(30_000, tmp_path)
    with PostgresServer() as server:
        db = server.new_database()
        svc = Service(tmp_path, url)
        svc.args[svc.args.index("-o") + 1] = db
        svc.args += ["--state", str(tmp_path / "state")]
        svc.start()
        pub = subprocess.Popen(gen_args(30_000, url, ("--rate", "10000")))
        svc.wait_for(5_000)
        server.stop()
        deadline = time.monotonic() + 30
        while not svc.events_in("error") and time.monotonic() < deadline:
            time.sleep(0.1)
        error = svc.events_in("error")
        assert error and error.startswith(f"cannot write {db}: "), error
        server.start()
        assert pub.wait(60) == 0
        svc.wait_for(n_events)
        svc.finish()
        got = table_rows(db)
    assert len(got) == len(set(got)) and sorted(got) == sorted(as_rows("\n".join(want)))
    log = svc.log()
    assert "going back to the last checkpoint" in log and "Traceback" not in log


def test_a_match_held_at_a_pause_after_an_end_of_stream_is_written(tmp_path, database_url):
    """The stream ended once (its held matches written, the progress row says
    flushed), then went on; a pause (SIGTERM) checkpoints a match held for a trailing
    NOT, no row written since. The restart used to end the stream again while
    catching up, without writing: the held match was counted and lost. It is the
    checkpoint's own state (past the recorded end of stream), nothing to catch up."""
    from tests.support.journal_service import config, finish, journal_payloads, run_once
    queries = tmp_path / "held.cep"
    queries.write_text("QUERY dry PATTERN SEQ(Temperature t, NOT Humidity h) WHERE [room] "
                       "WITHIN 5 s")
    cfg = config(tmp_path, fmt="json", queries=queries)
    cfg.output = database_url

    def publish(event_id: int, ts: int) -> None:  # as the service's MQTT source would
        journal_payloads(tmp_path, [json.dumps({"events": [
            {"id": event_id, "type": "Temperature", "ts": ts, "room": "r1"}]}).encode()])
    publish(1, 1_000)
    finish(cfg)                             # --until-idle / SIGUSR1: t=1 written
    assert [json.loads(r[2]) for r in table_rows(database_url)] == [{"t": 1}]
    publish(2, 20_000)
    run_once(cfg)                           # SIGTERM: t=2 held, in the checkpoint
    assert len(table_rows(database_url)) == 1
    finish(cfg)                             # restart, then the end of the stream
    assert sorted(json.loads(r[2])["t"] for r in table_rows(database_url)) == [1, 2]


def test_a_locked_sqlite_output_is_waited_out(mosquitto, tmp_path):
    """Another program holds the output database locked (an exclusive transaction) for
    longer than SQLite's busy timeout: the service says so (stats `error`, FAILING),
    goes back to its checkpoint and retries, and once the lock is gone the table holds
    exactly the reference's matches, each once. It used to exit 2 on the retry's
    reopen ('database is locked' read as a bad database URL)."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/locked"
    db = tmp_path / "alerts.db"
    want, n_events = expected_matches(20_000, tmp_path)
    svc = Service(tmp_path, url)
    svc.args[svc.args.index("-o") + 1] = f"sqlite:///{db}"
    svc.args += ["--state", str(tmp_path / "state")]
    svc.start()
    pub = subprocess.Popen(gen_args(20_000, url, ("--rate", "4000")))
    svc.wait_for(2_000)
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    deadline = time.monotonic() + 30
    while not svc.events_in("error") and time.monotonic() < deadline:
        assert svc.proc.poll() is None, svc.log()
        time.sleep(0.1)
    assert "locked" in (svc.events_in("error") or ""), svc.events_in("error")
    time.sleep(6)   # past the busy timeout again: retried, still up
    assert svc.proc.poll() is None, svc.log()
    lock.execute("ROLLBACK")
    lock.close()
    assert pub.wait(60) == 0
    svc.wait_for(n_events)
    svc.finish()
    got = table_rows(f"sqlite:///{db}")
    assert len(got) == len(set(got)) and sorted(got) == sorted(as_rows("\n".join(want)))


def test_a_deleted_or_older_output_database_is_refused_with_how_to_recover(tmp_path):
    """The checkpoint says rows up to some journal offset were written; the database
    file is then deleted, or replaced by an older copy of itself: the service refuses
    to start (it went on, and the rows before the checkpoint were lost), and following
    the message (drop the table, delete the checkpoint) writes the table again from the
    journal: exactly the reference's rows."""
    import re
    import shutil
    from tests.support.journal_service import (config, finish, iot_payloads, journal_payloads,
                                           run_once)
    from dqcep.io.checkpoint import CheckpointError
    from dqcep.core.events import event_from_mapping
    from dqcep.lang import parse_file
    from dqcep.baseline.reference import ReferenceMatcher
    from dqcep.service import StreamingService
    payloads = iot_payloads(20_000)
    journal_payloads(tmp_path, payloads[:50])
    db = tmp_path / "alerts.db"
    cfg = config(tmp_path, journal_retention=1 << 40)
    cfg.output = f"sqlite:///{db}"
    run_once(cfg)
    older = tmp_path / "older.db"
    shutil.copy(db, older)
    journal_payloads(tmp_path, payloads[50:])
    run_once(cfg)
    assert table_rows(cfg.output)
    for damage in ("older copy", "deleted"):
        db.unlink()
        if damage == "older copy":
            shutil.copy(older, db)
        with pytest.raises(CheckpointError) as err:
            StreamingService(cfg)
        message = str(err.value)
        assert "the database was deleted, replaced or restored from an older copy" in message
    # follow it: drop the table (the file holds nothing else), delete the checkpoints
    for path in re.search(r"delete (\S+?)( and (\S+))? to write it", message).group(1, 3):
        if path:
            Path(path).unlink()
    finish(cfg)
    events = [event_from_mapping(e) for p in payloads for e in msgpack.unpackb(p)["events"]]
    want = as_rows("\n".join(json.dumps(m.to_json_obj()) for m in ReferenceMatcher(
        parse_file(cfg.queries).queries).run(events)))
    got = table_rows(cfg.output)
    assert len(got) == len(set(got)) and sorted(got) == sorted(want)


def test_names_of_one_table_are_compared_as_the_database_does(tmp_path, postgres):
    """SQLite: `matches` and `MATCHES` are one table; PostgreSQL: two names sharing their
    first 63 bytes are one table. A second service (a stream of its own) into the other
    spelling is refused as into the same spelling (both used to write: 90 rows for 45
    matches); ?table=DQCEP_PROGRESS is refused as dqcep_progress is (it exited 1)."""
    from dqcep.core.errors import UserError
    from dqcep.io.database import Progress, open_database_sink
    long = "m" * 63
    for first, second in ((f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'a.db'}"
                                                             "?table=MATCHES"),
                          (f"{postgres}?table={long}x", f"{postgres}?table={long}y")):
        a = open_database_sink(first)
        a.claim("stream-one")
        a._insert([], Progress(5, False))
        a.close()
        b = open_database_sink(second)
        with pytest.raises(UserError, match="holds the matches of another service"):
            b.claim("stream-two")
        b.close()
    for url in (f"sqlite:///{tmp_path / 'b.db'}?table=DQCEP_PROGRESS",
                f"{postgres}?table=Dqcep_Progress"):
        r = dqcep("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl",
                  "--output", url)
        assert r.returncode == 2 and "other than dqcep_progress" in r.stderr, r.stderr

