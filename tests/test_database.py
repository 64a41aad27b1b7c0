"""Database outputs (the Insert operator): `dqcep run --output sqlite:///FILE.db` as a
user runs it, rows against the JSON output of the same run."""
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def test_kleene_lists_are_json_arrays_in_the_events_column(tmp_path):
    events = tmp_path / "iot.jsonl"
    assert dqcep("generate", "-n", 3000, "--seed", 3, "--quiet", "-o", events).returncode == 0
    q = EXAMPLES / "iot-kleene.cep"
    plain = dqcep("run", q, "--input", events)
    db = tmp_path / "k.db"
    r = dqcep("run", q, "--input", events, "--output", f"sqlite:///{db}")
    assert r.returncode == 0, r.stderr
    assert plain.stdout and sorted(rows(db)) == as_rows(plain.stdout)
    assert any(isinstance(v, list) for _, _, ev in rows(db) for v in json.loads(ev).values())


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
            ("postgresql://u@127.0.0.1:1/db", "postgresql outputs are not supported yet"),
            (f"sqlite:///{tmp_path}", "cannot open the database")]:
        r = dqcep(*args, target)
        assert r.returncode == 2 and message in r.stderr, (target, r.stderr)
        assert "Traceback" not in r.stderr
    assert rows(db) == []  # the table it refused is untouched
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", "mqtt://127.0.0.1:1/t",
              "--output", f"sqlite:///{db}")
    assert r.returncode == 2 and "a database output (sqlite:///...) is for dqcep run" in r.stderr


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
