"""Lookups (``table(v.attr).column``, the Select operator) on every engine.

The differential tests of issue 20: a query whose constants are read from a lookup
table (keyed by event id, a row for every id) finds what the same query with the
constants written out finds, on the native engine (both materializations), the SASE
baseline and the reference matcher; and with tables that lack rows and keys of
every kind, the engines agree with the reference's reading of the rule
(``dqcep.core.tables``)."""
from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dqcep.baseline import SaseEngine
from dqcep.core.events import Event
from dqcep.lang import QueryError, ast, file_to_source, parse
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.core.tables import StaticTables, snapshot_of
from tests.support.broker import free_port
from tests.support.strategies import ATTR_VALUES, outside_sase, small_event_streams, small_query_files
from tests.support.engines import CUTS, MATERIALIZE, as_set, engine_for, split
from tests.support.examples import examples
from tests.support.paths import ROOT

LITERALS = (ast.Number, ast.String, ast.Boolean)
TYPE_OF = {ast.Number: ast.DOUBLE, ast.String: ast.STRING, ast.Boolean: ast.BOOL}


def _and(parts):
    out = parts[0]
    for p in parts[1:]:
        out = ast.Binary("AND", out, p)
    return out


def read_from_table(draw, f: ast.QueryFile, key: str, key_type: str):
    """The file with some of its literals (in conjuncts naming a variable) replaced by
    lookups ``consts(v.<key>).cN``; returns the file, the table's declaration and the
    columns' values (column name -> the literal it stands for)."""
    values: dict[str, object] = {}
    columns: list[ast.SchemaAttr] = []

    def lookup(lit, var):
        name = f"c{len(columns)}"
        columns.append(ast.SchemaAttr(name, TYPE_OF[type(lit)]))
        values[name] = lit.value
        return ast.Lookup("consts", ast.AttrRef(var, key), name)

    def rewrite(e, vars_):
        if isinstance(e, LITERALS) and draw(st.booleans()):
            return lookup(e, draw(st.sampled_from(vars_)))
        if isinstance(e, ast.Unary):
            return dataclasses.replace(e, operand=rewrite(e.operand, vars_))
        if isinstance(e, ast.Binary):
            return dataclasses.replace(e, left=rewrite(e.left, vars_),
                                       right=rewrite(e.right, vars_))
        return e
    queries = []
    for q in f.queries:
        parts = []
        for c in ast.conjuncts(q.where):
            vars_ = sorted(ast.expr_vars(c))
            parts.append(rewrite(c, vars_) if vars_ else c)
        queries.append(dataclasses.replace(q, where=_and(parts)) if parts else q)
    assume(columns)
    table = ast.LookupTable("consts", (ast.SchemaAttr("k", key_type), *columns), "k",
                            "sqlite:///consts.db")
    return ast.QueryFile(f.source, tuple(queries), f.schemas, (table,)), table, values


def engines_agree(parsed, events, source, cuts):
    """Every engine's matches over the events (in batches), the reference's first."""
    queries, tables = parsed.queries, parsed.tables
    expected = as_set(ReferenceMatcher(queries, (), tables, source).run(events))
    batches = split(events, cuts)
    for materialize in MATERIALIZE:
        engine = engine_for(queries, 0, materialize, tables=tables, lookup_source=source)
        out = engine.process([])
        for b in batches:
            out += engine.process(b)
        out += engine.flush()
        assert as_set(out.to_matches()) == expected, materialize
    if not any(map(outside_sase, queries)):
        engine = SaseEngine(queries, tables=tables, lookup_source=source)
        out = engine.process([])
        for b in batches:
            out += engine.process(b)
        out += engine.flush()
        assert as_set(out.to_matches()) == expected, "sase"
    return expected


@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), small_query_files(), small_event_streams(), CUTS)
def test_constants_read_from_a_table_match_as_the_constants_do(data, f, events, cuts):
    with_table, table, values = read_from_table(data.draw, f, "id", ast.INT)
    try:
        parsed = parse(file_to_source(with_table))
    except QueryError as err:  # every literal's kind is its column's: it must parse
        raise AssertionError(f"{err}\n{file_to_source(with_table)}") from None
    rows = [(i, *values.values()) for i in range(1, len(events) + 1)]
    source = StaticTables({"consts": snapshot_of(table, rows)})
    with_constants = as_set(ReferenceMatcher(f.queries).run(events))
    assert engines_agree(parsed, events, source, cuts) == with_constants


@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), small_query_files(), small_event_streams(), CUTS,
       st.sampled_from(ast.ATTRIBUTE_TYPES))
def test_tables_with_missing_rows_and_odd_keys_are_read_alike(data, f, events, cuts,
                                                              key_type):
    """Keyed by the attribute p (numbers, fractions, booleans, strings, or absent), a
    row for only some keys, the cells sometimes NULL: every engine reads the rule as
    the reference does."""
    with_table, table, values = read_from_table(data.draw, f, "p", key_type)
    parsed = parse(file_to_source(with_table))
    keys = data.draw(st.lists(ATTR_VALUES, unique_by=repr, max_size=6))
    rows = [(k, *(data.draw(st.sampled_from([v, None])) for v in values.values()))
            for k in keys]
    engines_agree(parsed, events, StaticTables({"consts": snapshot_of(table, rows)}), cuts)


# what database drivers give for cells of other kinds: a BLOB / bytea, jsonb, a
# timestamptz, a lone surrogate, numbers no engine holds
ODD_CELLS = [b"x", memoryview(b"x"), {"a": 1}, [1], __import__("datetime").datetime(
    2026, 11, 27, 10, 0), "\ud800", 2**70, -2**70, math.nan, math.inf]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), small_query_files(), small_event_streams(), CUTS,
       st.sampled_from(ast.ATTRIBUTE_TYPES))
def test_cells_of_unexpected_kinds_read_as_missing_on_every_engine(data, f, events, cuts,
                                                                   key_type):
    """A cell that is not of its column's declared kind, whatever object the driver
    gives, reads as missing on every engine (a bytes cell declared STRING crashed the
    native engine, and the reference matched on it): the rule of dqcep.core.tables."""
    with_table, table, values = read_from_table(data.draw, f, "p", key_type)
    parsed = parse(file_to_source(with_table))
    keys = data.draw(st.lists(ATTR_VALUES, unique_by=repr, max_size=6))
    rows = [(data.draw(st.sampled_from([k, *ODD_CELLS])),
             *(data.draw(st.sampled_from([v, None, *ODD_CELLS])) for v in values.values()))
            for k in keys]
    engines_agree(parsed, events, StaticTables({"consts": snapshot_of(table, rows)}), cuts)


KEYS = [1, 1.0, 2, 0.5, True, False, "x", "1", None]  # p of events 1..9 (None: absent)


@pytest.mark.parametrize("key_type, rows, found", [
    (ast.INT, [(1, 1), (2, 5), (0.5, 1), ("1", 1)], {1, 2}),
    (ast.DOUBLE, [(0.5, 1), (1.0, 1), (True, 1)], {1, 2, 4}),
    (ast.STRING, [("x", 1), ("1", 1), (1, 1)], {7, 8}),
    (ast.BOOL, [(True, 1), (1, 1), (False, None)], {5}),
])
def test_a_key_finds_its_row_by_the_key_column_type(key_type, rows, found):
    """The rule, spelled out: a number is itself whatever its form (1 = 1.0), a key of
    another kind finds nothing (1 is no boolean, '1' no number), a NULL cell is
    missing; rows whose key does not fit the key type are never found."""
    parsed = parse(f"TABLE consts(k {key_type}, c0 INT) KEY k FROM 'sqlite:///x.db'; "
                   "QUERY q PATTERN A a WHERE consts(a.p).c0 = 1 WITHIN 10")
    events = [Event(i, "A", i, {} if p is None else {"p": p}) for i, p in enumerate(KEYS, 1)]
    source = StaticTables({"consts": snapshot_of(parsed.tables[0], rows)})
    got = engines_agree(parsed, events, source, cuts=(3, 6))
    assert {dict(events_)["a"] for _, events_, _ in got} == found


# ------------------------------------------------------ from real databases

EXAMPLES = ROOT / "examples"


def dqcep(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "dqcep", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env)


def load_rooms(database_url: str, cwd: Path) -> None:
    """examples/rooms.sql into SQLite (a file in cwd) or PostgreSQL."""
    script = (EXAMPLES / "rooms.sql").read_text()
    if database_url.startswith("sqlite:"):
        with sqlite3.connect(cwd / database_url[len("sqlite:///"):]) as db:
            db.executescript(script)
        return
    import psycopg
    from dqcep.io.database import postgres_target
    with psycopg.connect(**postgres_target(database_url)[0], autocommit=True) as db:
        db.execute(script)


@pytest.fixture(params=["sqlite", "postgresql"])
def rooms_url(request, tmp_path):
    url = "sqlite:///rooms.db" if request.param == "sqlite" else \
        request.getfixturevalue("postgres")
    load_rooms(url, tmp_path)
    return url


@pytest.mark.integration
def test_dqcep_run_reads_a_lookup_table_alike_on_every_engine(tmp_path, rooms_url):
    """examples/iot-thresholds.cep over a generated stream, the table in SQLite or
    PostgreSQL: the native engine, SASE and the reference give the same matches and
    RETURN values (a threshold per room, a NULL one and a room without a row find
    nothing)."""
    queries = tmp_path / "thresholds.cep"
    queries.write_text((EXAMPLES / "iot-thresholds.cep").read_text().replace(
        "sqlite:///rooms.db", rooms_url))
    assert dqcep("generate", "-n", 60_000, "--seed", 7, "--quiet", "-o",
                 tmp_path / "iot.jsonl", cwd=tmp_path).returncode == 0
    outputs = {}
    for engine in ("native", "sase", "reference"):
        r = dqcep("run", queries, "--input", "iot.jsonl", "--engine", engine, "--returns",
                  "--chunk-size", 5_000, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        outputs[engine] = sorted(r.stdout.splitlines())
    assert outputs["native"] == outputs["sase"] == outputs["reference"]
    found = [json.loads(x)["return"] for x in outputs["native"]]
    assert found and all(m["t.value"] > m["rooms(t.room).threshold"] for m in found)
    assert {m["t.room"] for m in found}.isdisjoint({"site2/room4", "site2/room5"})
    assert all(isinstance(m["rooms(t.room).floor"], int) for m in found)
    # the plan reads the lookup where it reads t.value: pushed down to the events
    r = dqcep("explain", queries, cwd=tmp_path)
    assert "Temperature: has room AND t.value > rooms(t.room).threshold" in r.stdout, r.stdout


@pytest.mark.integration
def test_a_lookup_table_that_is_not_there_is_one_line(tmp_path):
    queries = tmp_path / "q.cep"
    events = tmp_path / "e.jsonl"
    events.write_text('{"id": 1, "type": "Temperature", "ts": 1, "room": "r", "value": 1}\n')
    base = ("TABLE rooms(room STRING, threshold DOUBLE) KEY room FROM '{url}';\n"
            "QUERY q PATTERN Temperature t WHERE t.value > rooms(t.room).threshold WITHIN 1 s")
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE rooms (room TEXT, limit_ REAL)")
    for url, message, code in [
            ("sqlite:///missing.db", "no database file missing.db", 2),
            ("sqlite:///other.db", "table 'rooms' has no column threshold (it has room, "
                                   "limit_)", 2),
            ("sqlite:///other.db?table=nope", "table 'nope' has no column room, threshold "
                                              "(there is no such table)", 2),
            ("mysql://x/y", "a lookup table is read from sqlite:///FILE.db or postgresql", 2),
            (f"postgresql://u@127.0.0.1:{free_port()}/db", "cannot read or write postgresql", 1)]:
        queries.write_text(base.format(url=url))
        r = dqcep("run", queries, "--input", events, cwd=tmp_path)
        assert r.returncode == code and message in r.stderr, (url, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def two_tables(tmp_path, postgres: str, clock):
    """The rooms of tmp_path/rooms.db (REFRESH 1 h) and of a PostgreSQL database
    (REFRESH 30 s), read on the test's clock."""
    from dqcep.io.database import DatabaseTables
    parsed = parse(
        f"TABLE rooms(room STRING, threshold DOUBLE) KEY room FROM "
        f"'sqlite:///{tmp_path}/rooms.db' REFRESH 1 h;\n"
        f"TABLE pg(room STRING, threshold DOUBLE) KEY room FROM '{postgres}?table=rooms' "
        "REFRESH 30 s;\n"
        "QUERY q PATTERN Temperature t WHERE t.value > rooms(t.room).threshold AND "
        "t.value > pg(t.room).threshold WITHIN 1 s")
    return DatabaseTables(parsed.tables, clock=clock)


def test_tables_are_read_again_on_change_or_when_their_refresh_is_due(tmp_path, postgres):
    """SQLite: a commit by another connection is seen before a batch (its
    data_version) a second after the last read, not before; PostgreSQL: when REFRESH has
    passed (the clock is the test's). Reads are counted; a closed connection is opened
    again."""
    load_rooms("sqlite:///rooms.db", tmp_path)
    load_rooms(postgres, tmp_path)
    now = [0.0]
    tables = two_tables(tmp_path, postgres, lambda: now[0])
    assert tables.reads == 2
    assert tables.snapshot("rooms").value("site1/room1", "threshold") == 30.0
    tables.refresh()
    assert tables.reads == 2  # nothing changed, nothing due
    with sqlite3.connect(tmp_path / "rooms.db") as db:
        db.execute("UPDATE rooms SET threshold = 99 WHERE room = 'site1/room1'")
    tables.refresh()
    assert tables.reads == 2  # changed, but read at most every CHANGE_READS_S
    now[0] = 1.0
    import psycopg
    from dqcep.io.database import postgres_target
    with psycopg.connect(**postgres_target(postgres)[0], autocommit=True) as db:
        db.execute("UPDATE rooms SET threshold = 77 WHERE room = 'site1/room1'")
    tables.refresh()
    assert tables.snapshot("rooms").value("site1/room1", "threshold") == 99.0
    assert tables.snapshot("pg").value("site1/room1", "threshold") == 30.0  # not due
    now[0] = 31.0
    tables.refresh()
    assert tables.snapshot("pg").value("site1/room1", "threshold") == 77.0
    assert tables.reads == 4
    tables.readers["pg"].db.close()  # a closed connection is opened again
    now[0] = 62.0
    tables.refresh()
    assert tables.stale is None and tables.reads == 5
    tables.close()


@pytest.mark.integration  # a PostgreSQL server
def test_lookup_tables_do_not_go_stale(tmp_path):
    """A SQLite lookup file replaced by an atomic rename is read again (its
    data_version watched the old file for ever); a PostgreSQL server restarted under
    a lookup source: the reads fail meanwhile (the last snapshot stays, said once),
    then go on on a new connection (it stayed on its old snapshot for ever: 'the
    connection is closed'); a SQLite file committed to before every batch is read
    again at most every CHANGE_READS_S (it was read whole before every batch)."""
    import os
    import psycopg
    from dqcep.io.database import CHANGE_READS_S, postgres_target
    from tests.support.postgres import PostgresServer
    load_rooms("sqlite:///rooms.db", tmp_path)
    with PostgresServer() as server:
        pg = server.new_database()
        load_rooms(pg, tmp_path)
        now = [0.0]
        tables = two_tables(tmp_path, pg, lambda: now[0])
        # an atomic replace of the SQLite file
        new = tmp_path / "rooms.new.db"
        with sqlite3.connect(new) as db:
            db.execute("CREATE TABLE rooms (room TEXT, threshold REAL)")
            db.execute("INSERT INTO rooms VALUES ('site1/room1', 55)")
        os.replace(new, tmp_path / "rooms.db")
        now[0] = 2.0
        tables.refresh()
        assert tables.snapshot("rooms").value("site1/room1", "threshold") == 55.0
        # the PostgreSQL server restarts, with a change meanwhile
        server.stop()
        now[0] = 40.0
        assert tables.refresh() and tables.stale.startswith("table pg: ")
        assert tables.snapshot("pg").value("site1/room1", "threshold") == 30.0
        server.start()
        with psycopg.connect(**postgres_target(pg)[0], autocommit=True) as db:
            db.execute("UPDATE rooms SET threshold = 66 WHERE room = 'site1/room1'")
        now[0] = 80.0
        tables.refresh()
        assert tables.stale is None
        assert tables.snapshot("pg").value("site1/room1", "threshold") == 66.0
        # commits before every batch: one read per CHANGE_READS_S, not per batch
        reads = tables.reads
        with sqlite3.connect(tmp_path / "rooms.db") as db:
            for batch in range(100):
                db.execute("UPDATE rooms SET threshold = ? WHERE room = 'site1/room1'",
                           (batch,))
                db.commit()
                now[0] = 80.0 + batch * 0.1
                tables.refresh()
        assert tables.reads - reads == int(100 * 0.1 / CHANGE_READS_S)
        now[0] = 200.0
        tables.refresh()
        assert tables.snapshot("rooms").value("site1/room1", "threshold") == 99.0
        tables.close()


def test_the_streaming_service_reads_lookup_tables(mosquitto, tmp_path, postgres):
    """The service over a real broker, its thresholds in PostgreSQL, killed once
    mid-stream: exactly the reference matcher's matches over the same table."""
    from dqcep.core.events import event_from_mapping
    from dqcep.io.database import DatabaseTables
    from tests.support.service import Service, gen_args
    load_rooms(postgres, tmp_path)
    queries = tmp_path / "thresholds.cep"
    queries.write_text((EXAMPLES / "iot-thresholds.cep").read_text().replace(
        "sqlite:///rooms.db", postgres))
    stream = tmp_path / "stream.msgpack"
    subprocess.run(gen_args(30_000, str(stream)), check=True)  # planting iot.cep
    events = [event_from_mapping(e) for p in msgpack.Unpacker(open(stream, "rb"), raw=False)
              for e in p["events"]]
    parsed = parse(queries.read_text())
    tables = DatabaseTables(parsed.tables)
    want = {json.dumps(m.to_json_obj()) for m in ReferenceMatcher(
        parsed.queries, (), parsed.tables, tables).run(events)}
    tables.close()
    assert want
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/lookups"
    svc = Service(tmp_path, url, queries)
    svc.start()
    pub = subprocess.Popen(gen_args(30_000, url, ("--rate", "10000")))
    svc.wait_for(8_000)
    svc.kill_and_restart()
    assert pub.wait(60) == 0
    svc.wait_for(len(events))
    svc.finish()
    assert svc.output() == want
