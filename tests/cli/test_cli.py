"""The dqcep command line, run as a user runs it (a subprocess of the installed package)."""
import json
import re
import subprocess
import sys

import msgpack
import pytest

from tests.support.workloads import (FORCED_DOOR_EVENTS, FORCED_DOOR_MATCHES, MISDECLARED_EVENTS,
                                     MISDECLARED_QUERY)
from tests.support.paths import ROOT

# Each test here runs dqcep as a command (a process): the quick run leaves them out.
pytestmark = pytest.mark.integration

EXAMPLES = ROOT / "examples"


def dqcep(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "dqcep", *map(str, args)], input=stdin,
                          capture_output=True, text=True, cwd=ROOT)


def test_run_example_prints_the_spec_matches():
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    expected = (EXAMPLES / "fire-expected.jsonl").read_text().splitlines()
    assert sorted(lines) == sorted(expected)
    # exactly the spec's form: query, detected_at, events; nothing else
    assert all(list(json.loads(x)) == ["query", "detected_at", "events"] for x in lines)


def test_run_from_stdin_to_file_with_returns(tmp_path):
    out = tmp_path / "m.jsonl"
    events = (EXAMPLES / "fire-events.jsonl").read_text()
    r = dqcep("run", EXAMPLES / "fire.cep", "-i", "-", "-o", out, "--returns", stdin=events)
    assert r.returncode == 0, r.stderr
    first = json.loads(out.read_text().splitlines()[0])
    assert first["return"] == {"t": first["events"]["t"], "s.density": 7.0}


def test_run_msgpack_and_csv_inputs_agree(tmp_path):
    rows = [json.loads(x) for x in (EXAMPLES / "fire-events.jsonl").read_text().splitlines()]
    mp = tmp_path / "e.msgpack"
    mp.write_bytes(msgpack.packb({"events": rows[:5]}) +
                   b"".join(msgpack.packb(r) for r in rows[5:]))
    cols = sorted({k for r in rows for k in r} - {"id", "type", "ts"})
    csv_path = tmp_path / "e.csv"
    csv_path.write_text("id,type,ts," + ",".join(cols) + "\n" + "".join(
        f"{r['id']},{r['type']},{r['ts']}," + ",".join(str(r.get(c, "")) for c in cols) + "\n"
        for r in rows))
    outputs = [dqcep("run", EXAMPLES / "fire.cep", "--input", p).stdout
               for p in (EXAMPLES / "fire-events.jsonl", mp, csv_path)]
    assert outputs[0] and outputs[0] == outputs[1] == outputs[2]


def test_bad_query_exit_2_with_position(tmp_path):
    q = tmp_path / "bad.cep"
    q.write_text("QUERY x\nPATTERN SEQ(A a, B b)\nWHERE z.v > 1 WITHIN 5 s\n")
    r = dqcep("run", q, "--input", EXAMPLES / "fire-events.jsonl")
    assert r.returncode == 2
    assert r.stderr.startswith(f"{q}:3:7: unknown variable 'z'")
    assert "Traceback" not in r.stderr


def test_bad_event_file_exit_2_names_the_line(tmp_path):
    e = tmp_path / "bad.jsonl"
    e.write_text('{"id": 1, "type": "A", "ts": 1}\n{"id": 2, "type": "A", "ts": "x"}\n')
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", e)
    assert r.returncode == 2
    assert r.stderr.strip() == f"{e}:2:1: event 'ts' must be an integer, got 'x'"


@pytest.mark.parametrize("engine", ["native", "sase", "reference"])
def test_repeated_ids_are_dropped_and_counted_not_bad(tmp_path, engine):
    """One rule on every path (dqcep.runtime.duplicates): the later copy of an id is
    dropped and counted, also under --on-bad-event fail; the first copy wins."""
    lines = (EXAMPLES / "fire-events.jsonl").read_text().splitlines(keepends=True)
    twice = tmp_path / "twice.jsonl"
    # every event again right after itself, and the first one once more with other content
    again = lines[0].replace('"ts": ', '"ts": 1').replace('"type": "', '"type": "X')
    twice.write_text("".join(line + line for line in lines) + again)
    queries = tmp_path / "q.cep"  # the SEQ queries of fire.cep (the baseline runs those)
    queries.write_text(";".join((EXAMPLES / "fire.cep").read_text().split(";")[1:]))
    args = ("run", queries, "--engine", engine)
    r = dqcep(*args, "--input", twice)
    assert r.returncode == 0, r.stderr
    assert r.stdout == dqcep(*args, "--input", EXAMPLES / "fire-events.jsonl").stdout
    assert r.stdout
    assert (f"dropped {len(lines) + 1} event(s) repeating the id of an earlier event"
            in r.stderr)


def test_skip_bad_events_counts_them(tmp_path):
    e = tmp_path / "bad.jsonl"
    good = (EXAMPLES / "fire-events.jsonl").read_text()
    e.write_text("garbage\n" + good + '{"id": 1, "type": "A", "ts": 1}\n')
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", e, "--on-bad-event", "skip")
    assert r.returncode == 0
    assert r.stdout == dqcep("run", EXAMPLES / "fire.cep", "--input",
                             EXAMPLES / "fire-events.jsonl").stdout
    assert "skipped 1 bad event record(s)" in r.stderr
    assert "dropped 1 event(s) repeating the id" in r.stderr


def test_engines_print_the_same_matches(tmp_path):
    args = ("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl")
    native = dqcep(*args, "--chunk-size", 3)          # many small batches
    reference = dqcep(*args, "--engine", "reference")
    assert native.returncode == reference.returncode == 0
    assert sorted(native.stdout.splitlines()) == sorted(reference.stdout.splitlines())
    with_returns = dqcep(*args, "--returns").stdout.splitlines()
    assert sorted(with_returns) == sorted(dqcep(*args, "--returns", "--engine",
                                               "reference").stdout.splitlines())


def test_every_engine_leaves_out_the_same_late_events(tmp_path):
    """--lateness on every engine, the reference matcher too (it ignored it): event 5
    (ts 250 after 400, lateness 100) is late; the same matches and the same count."""
    events = tmp_path / "late.jsonl"
    events.write_text("".join(f'{{"id": {i}, "type": "{t}", "ts": {ts}, "p": 1}}\n' for i, t, ts in
                              [(1, "A", 100), (2, "B", 200), (3, "A", 150), (4, "B", 400),
                               (5, "A", 250), (6, "B", 420)]))
    queries = tmp_path / "q.cep"
    queries.write_text("QUERY q PATTERN SEQ(A a, B b) WHERE b.p = a.p WITHIN 1 s")
    outputs = set()
    for engine in ("native", "sase", "reference"):
        r = dqcep("run", queries, "--input", events, "--engine", engine, "--lateness", 100)
        assert r.returncode == 0, r.stderr
        assert "1 event(s) arrived late and were left out: 1 more than --lateness 100 ms " \
            "behind the stream" in r.stderr, engine
        outputs.add(tuple(sorted(r.stdout.splitlines())))
    (out,) = outputs
    assert len(out) == 6 and not any('"a": 5' in line for line in out)


def test_every_engine_admits_by_timeline_and_skew(tmp_path):
    """--timeline and --skew on every engine (spec section 7): device d2's clock is 2 s
    behind d1's. One timeline: its in-order readings are late; --timeline device with
    --skew 3000 admits them; --skew 1500 leaves them out by the skew, said so."""
    events = tmp_path / "skewed.jsonl"
    rows = [(1, "A", 5000, "d1"), (2, "A", 3100, "d2"), (3, "B", 5100, "d1"),
            (4, "B", 3200, "d2"), (5, "A", 3300, "d2"), (6, "B", 5200, "d1")]
    events.write_text("".join(f'{{"id": {i}, "type": "{t}", "ts": {ts}, "device": "{d}"}}\n'
                              for i, t, ts, d in rows))
    queries = tmp_path / "q.cep"
    queries.write_text("QUERY q PATTERN SEQ(A a, B b) WHERE b.device = a.device WITHIN 1 s")
    for options, said, pairs in (
            (("--lateness", 100), "3 more than --lateness 100 ms behind the stream", 2),
            (("--lateness", 100, "--skew", 3000, "--timeline", "device"), None, 3),
            (("--lateness", 100, "--skew", 1500, "--timeline", "device"),
             "3 more than --skew 1500 ms behind the most advanced timeline", 2)):
        outputs = set()
        for engine in ("native", "sase", "reference"):
            r = dqcep("run", queries, "--input", events, "--engine", engine, *options)
            assert r.returncode == 0, r.stderr
            assert (said in r.stderr) if said else r.stderr == "", (engine, r.stderr)
            outputs.add(tuple(sorted(r.stdout.splitlines())))
        (out,) = outputs
        assert len(out) == pairs, (options, out)
    r = dqcep("run", queries, "--input", events, "--timeline", "device")
    assert r.returncode == 2 and "--timeline device needs --skew" in r.stderr


def test_stats_and_lateness(tmp_path):
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl",
              "--stats")
    assert r.returncode == 0
    lines = r.stderr.splitlines()
    assert lines[0].split() == ["vertex", "operator", "inputs", "outputs", "queue-hw",
                                "evictions", "ms"]
    assert any("OUTPUT fire" in x for x in lines)
    assert lines[-1].startswith("events: 13 in ") and "peak state" in lines[-1]
    # out of order by 1.5 s: lost without lateness, recovered with it
    rows = (EXAMPLES / "fire-events.jsonl").read_text().splitlines()
    shuffled = tmp_path / "late.jsonl"
    shuffled.write_text("\n".join([rows[3]] + rows[:3] + rows[4:]) + "\n")
    strict = dqcep("run", EXAMPLES / "fire.cep", "--input", shuffled, "--chunk-size", 1)
    assert "3 event(s) arrived late and were left out: 3 more than --lateness 0 ms behind " \
        "the stream" in strict.stderr
    slack = dqcep("run", EXAMPLES / "fire.cep", "--input", shuffled, "--lateness", 2000,
                  "--chunk-size", 1)
    assert slack.stderr == ""
    assert sorted(slack.stdout.splitlines()) == sorted(
        (EXAMPLES / "fire-expected.jsonl").read_text().splitlines())


def test_usage_errors_exit_2():
    r = dqcep("run")
    assert r.returncode == 2
    assert "required" in r.stderr
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", "nope.jsonl")
    assert r.returncode == 2 and "cannot read event file nope.jsonl" in r.stderr


def test_help_and_console_script():
    assert "run" in dqcep("--help").stdout
    r = subprocess.run(["dqcep", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("dqcep ")


def test_explain_marks_the_shared_vertex_with_its_parents():
    r = dqcep("explain", EXAMPLES / "fire.cep")
    assert r.returncode == 0, r.stderr
    shared = [x for x in r.stdout.splitlines() if "SHARED by" in x]
    seq = [x for x in shared if " SEQ " in x]
    assert len(seq) == 1 and "smoke_rising, no_ventilation" in seq[0]
    parents = seq[0].split("->")[1].split("[")[0].split(",")
    assert len(parents) == 2
    assert "estimated cost" in r.stdout and "pushdown filters" in r.stdout
    assert "Temperature: has room AND t.value > 50" in r.stdout


def test_explain_dot_and_rates(tmp_path):
    r = dqcep("explain", EXAMPLES / "fire.cep", "--dot")
    assert r.returncode == 0 and r.stdout.startswith("digraph dqcep_plan {")
    assert "peripheries=2" in r.stdout  # shared vertices are drawn double
    q = tmp_path / "q.cep"
    q.write_text("PATTERN SEQ(A a, B b, C c) WITHIN 1 s")
    rates = tmp_path / "rates.json"
    rates.write_text('{"A": 1000, "B": 1, "C": 1}')
    r = dqcep("explain", q, "--rates", rates)
    assert r.returncode == 0 and "SEQ                    (v0 |" in r.stdout
    rates.write_text('{"A": "fast"}')
    r = dqcep("explain", q, "--rates", rates)
    assert r.returncode == 2 and "rates must be a JSON object" in r.stderr


def test_materialize_plans_and_runs_the_same_matches(tmp_path):
    """--materialize: explain shows the choice, run gives the same matches either way,
    and the engines without joins refuse it."""
    events = tmp_path / "stock.jsonl"
    assert dqcep("generate", "--scenario", EXAMPLES / "sase-stock.toml", "-n", 20_000,
                 "--quiet", "-o", events).returncode == 0
    q = tmp_path / "q.cep"
    q.write_text("QUERY p3 PATTERN SEQ(stock1 a, stock2 b, stock3 c) WHERE [price] "
                 "WITHIN 3000")
    r = dqcep("explain", q, "--materialize", "on-demand")
    assert r.returncode == 0 and "records: on demand (forced; est." in r.stdout
    assert "records: on demand" not in dqcep("explain", q).stdout
    kept = dqcep("run", q, "--input", events, "--materialize", "always")
    built = dqcep("run", q, "--input", events, "--materialize", "on-demand",
                  "--adapt", "off", "--chunk-size", 1000, "--stats")  # (adapt may move it)
    assert kept.returncode == built.returncode == 0, built.stderr
    assert "SEQ (on demand)" in built.stderr  # the engine ran the plan it was given
    assert len(kept.stdout.splitlines()) > 100
    assert sorted(built.stdout.splitlines()) == sorted(kept.stdout.splitlines())
    rates = tmp_path / "rates.json"
    rates.write_text('{"stock1": 333, "stock2": 333, "stock3": 333}')
    auto = dqcep("run", q, "--input", events, "--materialize", "auto", "--rates", rates)
    assert sorted(auto.stdout.splitlines()) == sorted(kept.stdout.splitlines())
    r = dqcep("run", q, "--input", events, "--engine", "sase", "--materialize", "on-demand")
    assert r.returncode == 2 and "--engine sase has none" in r.stderr
    r = dqcep("run", q, "--input", events, "--engine", "reference", "--adapt", "on")
    assert r.returncode == 2 and "--engine reference has none" in r.stderr
    # the streaming service takes --adapt as a file run does (what stops it here is
    # the output it lacks)
    r = dqcep("run", q, "--input", "mqtt://127.0.0.1:1/x", "--adapt", "off")
    assert r.returncode == 2 and "--adapt" not in r.stderr and "--output" in r.stderr


def test_auto_measures_the_rates_on_the_input_and_runs_a_chain(tmp_path):
    """dqcep run --materialize auto without --rates: the cost model gets the rates of
    the input's first events (io.readers.sample_rates), which make a list tied to its
    neighbours a chain (--stats names the RUN vertex); the same matches as the joins."""
    from dqcep.io.readers import sample_rates
    events = tmp_path / "u.jsonl"
    assert dqcep("generate", "--profile", "uniform", "-n", 3000, "--seed", 2, "--quiet",
                 "-o", events).returncode == 0  # 5 types, 1000 events/s of event time
    rates = sample_rates(str(events))
    assert set(rates) == {f"T{i}" for i in range(5)}
    assert 1000 * 0.9 < sum(rates.values()) < 1000 * 1.1
    assert sample_rates("-") is None
    q = tmp_path / "q.cep"
    q.write_text("QUERY t PATTERN SEQ(T0 a, T1+ b[], T2 c) WHERE b.a0 > a.a0 AND "
                 "c.a0 < a.a0 WITHIN 20 ms")
    joins = dqcep("run", q, "--input", events, "--materialize", "always", "--adapt", "off")
    auto = dqcep("run", q, "--input", events, "--materialize", "auto", "--adapt", "off",
                 "--stats")
    default = dqcep("run", q, "--input", events, "--adapt", "off", "--stats")
    assert joins.returncode == auto.returncode == default.returncode == 0, auto.stderr
    for r in (auto, default):  # auto is dqcep run's plan of an event file
        assert "RUN SEQ(T0, T1+, T2)" in r.stderr and "KLEENE" not in r.stderr
    assert default.stdout == auto.stdout
    assert len(joins.stdout.splitlines()) > 10
    assert sorted(auto.stdout.splitlines()) == sorted(joins.stdout.splitlines())
    # the default (--adapt on): whatever it measures and moves (said under --stats),
    # the same matches
    adapted = dqcep("run", q, "--input", events, "--chunk-size", 300, "--stats")
    assert adapted.returncode == 0, adapted.stderr
    assert sorted(adapted.stdout.splitlines()) == sorted(joins.stdout.splitlines())


def test_kleene_queries_explain_and_run_natively(tmp_path):
    """The example's plan and its one match on the native and reference engines (on
    the Spark batch job: tests/spark/test_spark.py, in the Spark tests' JVM)."""
    kleene = EXAMPLES / "iot-kleene.cep"
    r = dqcep("explain", kleene)
    assert r.returncode == 0, r.stderr
    assert "RUN SEQ(Door+, Door) USING skip-till-next-match" in r.stdout
    assert "on each match (whole lists): count(f) >= 3" in r.stdout
    assert "forced_door: OUTPUT" in r.stdout and "USING skip-till-next-match" in r.stdout
    events = tmp_path / "e.jsonl"
    events.write_text(FORCED_DOOR_EVENTS)
    for engine in ("native", "reference"):
        r = dqcep("run", kleene, "--input", events, "--engine", engine)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == FORCED_DOOR_MATCHES, engine


def test_explain_bad_query_exit_2(tmp_path):
    q = tmp_path / "bad.cep"
    q.write_text("PATTERN OR(A a, NOT B b)\nWITHIN 1 s")
    r = dqcep("explain", q)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"{q}:1:17: NOT is allowed only as an item of SEQ or AND, not of OR",
        "    PATTERN OR(A a, NOT B b)", "                    ^"]


def test_unwritable_output_exit_2(tmp_path):
    (tmp_path / "a-file").write_text("")
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl",
              "--output", tmp_path / "a-file" / "m.jsonl")
    assert r.returncode == 2
    assert "cannot write matches to" in r.stderr and "Traceback" not in r.stderr


def test_output_directories_are_made(tmp_path):
    """dqcep run and dqcep generate make a missing directory of their output files."""
    out = tmp_path / "new" / "dir"
    r = dqcep("generate", "--profile", "iot", "-n", 20_000, "--plant", ROOT / "dqcep/data/iot.cep",
              "--quiet", "-o", out / "events.jsonl", "--truth", out / "t" / "truth.jsonl")
    assert r.returncode == 0, r.stderr
    assert (out / "t" / "truth.jsonl").read_text()
    r = dqcep("run", ROOT / "dqcep/data/iot.cep", "--input", out / "events.jsonl",
              "--output", out / "m" / "matches.jsonl")
    assert r.returncode == 0, r.stderr
    assert (out / "m" / "matches.jsonl").read_text()


def test_demo_runs_in_process_and_finds_every_planted_occurrence():
    r = dqcep("demo", "--events", 60_000, "--show", 3)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "first 3 matches:" in out and out.count('{"query": ') == 3
    found, planted = re.search(r"planted occurrences found: (\d+) of (\d+)", out).groups()
    assert found == planted and int(planted) > 5
    assert "events/s" in out


def test_hostile_event_file_lines_are_skipped_one_by_one(tmp_path):
    """A 5,000-deep line, a line that is no UTF-8 and a lone surrogate under --returns:
    each is one positioned bad record (they once ended the run with a traceback or
    stopped the whole file under skip)."""
    good = (EXAMPLES / "fire-events.jsonl").read_bytes()
    hostile = [b'{"id": 900, "type": "T", "ts": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
               b'{"id": 901, "type": "Smoke", "ts": 2, "room": "\xff\xfe"}',
               b'{"id": 902, "type": "Temperature", "ts": 3, "room": "\\ud800", "value": 60}']
    e = tmp_path / "hostile.jsonl"
    e.write_bytes(b"\n".join(hostile) + b"\n" + good)
    args = ("run", EXAMPLES / "fire.cep", "--input", e, "--returns")
    r = dqcep(*args, "--on-bad-event", "skip")
    assert r.returncode == 0, r.stderr
    assert r.stdout == dqcep("run", EXAMPLES / "fire.cep", "--input",
                             EXAMPLES / "fire-events.jsonl", "--returns").stdout
    assert f"{e}:1:1: invalid JSON: nested too deeply" in r.stderr
    assert f"{e}:2:48: not UTF-8 text (byte 0xff)" in r.stderr
    assert f"{e}:3:1: attribute 'room' is not valid Unicode" in r.stderr
    assert "skipped 3 bad event record(s)" in r.stderr and "Traceback" not in r.stderr
    r = dqcep(*args)
    assert r.returncode == 2 and r.stderr.startswith(f"{e}:1:1: invalid JSON")
    csv = tmp_path / "hostile.csv"
    csv.write_bytes(b"id,type,ts,room\n1,Smoke,1,\xff\n2,Smoke,2,r\n")
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", csv, "--on-bad-event", "skip")
    assert r.returncode == 0 and f"{csv}:2:" in r.stderr and "not UTF-8" in r.stderr


def test_a_ca_file_that_cannot_be_used_is_one_line(tmp_path):
    import os
    for ca in (tmp_path / "missing.pem", EXAMPLES / "fire.cep"):
        r = subprocess.run([sys.executable, "-m", "dqcep", "generate", "-n", "5", "-o",
                            "mqtts://127.0.0.1:1/t"], capture_output=True, text=True,
                           env={**os.environ, "DQCEP_MQTT_CA": str(ca)})
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.startswith(f"cannot use DQCEP_MQTT_CA={ca} for mqtts://")


def test_a_full_output_disk_is_one_line(tmp_path):
    """A file-size limit stands in for a full disk (it was an OSError traceback)."""
    import resource
    out = tmp_path / "matches.jsonl"
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", EXAMPLES / "fire.cep", "--input",
                        EXAMPLES / "fire-events.jsonl", "-o", out], capture_output=True,
                       text=True, preexec_fn=lambda: resource.setrlimit(
                           resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY)))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr == f"dqcep: cannot read or write {out}: File too large\n"


def test_output_to_a_file_that_is_no_regular_file():
    """--output /dev/null once crashed with an fsync traceback (issue 15, item 1)."""
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl",
              "--output", "/dev/null")
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""


def test_a_missing_query_file_is_named_without_a_position(tmp_path):
    r = dqcep("run", tmp_path / "nope.cep", "--input", EXAMPLES / "fire-events.jsonl")
    assert r.returncode == 2
    missing = tmp_path / "nope.cep"
    assert r.stderr == f"cannot read query file {missing}: No such file or directory\n"


def test_a_plain_install_has_mqtt_and_parquet_and_names_the_extras():
    """MQTT and Parquet are plain dependencies (they were extras: a plain install gave
    ModuleNotFoundError tracebacks); Spark and the plots stay extras, named in one line
    when missing."""
    import importlib.metadata as md
    plain = [r.split(">")[0].split("=")[0].strip() for r in md.requires("dqcep")
             if "extra ==" not in r]
    assert "paho-mqtt" in plain and "pyarrow" in plain
    blocked = ("import sys; sys.modules['pyspark'] = None; sys.modules['matplotlib'] = None; "
               "from dqcep.cli import main; sys.exit(main(sys.argv[1:]))")
    for args, extra in ((["spark", "run", str(EXAMPLES / "fire.cep"), "--input",
                          str(EXAMPLES / "fire-events.jsonl"), "--output", "/tmp/x"], "spark"),
                        (["experiment", "fig3", "--out", "/tmp/x", "--quick"], "experiments")):
        r = subprocess.run([sys.executable, "-c", blocked, *args], capture_output=True,
                           text=True, cwd=ROOT)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and f"pip install 'dqcep[{extra}]'" in r.stderr


def test_a_missing_java_is_one_line_before_spark_starts(tmp_path):
    import os
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java here
    r = subprocess.run([sys.executable, "-m", "dqcep", "spark", "run", EXAMPLES / "fire.cep",
                        "--input", EXAMPLES / "fire-events.jsonl", "--output", tmp_path / "o"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("Spark needs Java 17 (no java on PATH)")
    assert not (tmp_path / "o").exists()


def test_explain_dot_renders_with_graphviz(tmp_path):
    """scripts/system-deps.sh installs Graphviz (the README's test command runs it
    first): the documented `dqcep explain --dot | dot -Tpng` works. A missing dot
    fails this test, it never skips."""
    import shutil
    assert shutil.which("dot"), "Graphviz is not installed: sh scripts/system-deps.sh"
    dot_text = dqcep("explain", EXAMPLES / "fire.cep", "--dot").stdout
    r = subprocess.run(["dot", "-Tpng", "-o", tmp_path / "plan.png"], input=dot_text,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_typo_in_a_type_or_attribute_is_a_positioned_warning(tmp_path):
    """It was a silent empty result (issue 15, item 6)."""
    q = tmp_path / "typo.cep"
    q.write_text("QUERY hot\nPATTERN SEQ(Temprature t, Smoke s)\n"
                 "WHERE [room] AND t.vlaue > 50 AND s.density > 1\nWITHIN 30 s\n")
    for engine in ("native", "sase", "reference"):
        r = dqcep("run", q, "--input", EXAMPLES / "fire-events.jsonl", "--engine", engine)
        assert r.returncode == 0 and r.stdout == ""
        assert r.stderr.splitlines() == [
            f"{q}:2:13: type 'Temprature' never appeared in the input",
            f"{q}:3:18: attribute 'vlaue' never appeared in the input"], (engine, r.stderr)
    r = dqcep("run", EXAMPLES / "fire.cep", "--input", EXAMPLES / "fire-events.jsonl")
    assert r.stderr == ""


def test_spark_paths_are_checked_before_spark_starts(tmp_path):
    """A missing input and a non-empty output are refused before the JVM (here: with no
    Java at all, so the check must come first; issue 15, item 8)."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    for args, message in (
            (["--input", tmp_path / "missing.jsonl", "--output", tmp_path / "o"],
             f"no such input file or directory: {tmp_path / 'missing.jsonl'}"),
            (["--input", EXAMPLES / "fire-events.jsonl", "--output", full],
             f"output directory {full} is not empty (use --overwrite)")):
        r = subprocess.run([sys.executable, "-m", "dqcep", "spark", "run", EXAMPLES / "fire.cep",
                            *args], capture_output=True, text=True, cwd=ROOT, env=env)
        assert r.returncode == 2 and r.stderr == message + "\n", r.stderr


def test_a_terminal_sees_a_progress_bar_and_a_summary(tmp_path):
    """On a terminal dqcep run shows a progress bar of the input's bytes and ends with one
    summary line; piped (every other test here), stderr stays as it was."""
    import os
    import pty
    events = tmp_path / "e.msgpack"
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                    "200000", "--seed", "3", "--plant", ROOT / "dqcep/data/iot.cep", "--quiet",
                    "--duplicates", "0.01", "-o", events], check=True)
    main, terminal = pty.openpty()
    import fcntl
    import struct
    import termios
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 cols
    proc = subprocess.Popen([sys.executable, "-m", "dqcep", "run", ROOT / "dqcep/data/iot.cep",
                             "--input", events, "-o", tmp_path / "m.jsonl", "--chunk-size",
                             "5000"], stderr=terminal, cwd=ROOT)
    os.close(terminal)
    seen = b""
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        seen += data
    assert proc.wait() == 0
    text = seen.decode()
    assert "e.msgpack:" in text and "events/s" in text  # the bar: file name, rate
    last = [x for x in text.replace("\r", "\n").splitlines() if x.strip()][-1]
    matches = len((tmp_path / "m.jsonl").read_text().splitlines())
    assert re.fullmatch(rf"dqcep run: 200,000 events, {matches:,} matches \((\w+ [\d,]+(, )?)+\), "
                        r"0 late, 0 bad, [1-9][\d,]* duplicates in [\d.]+ s \([\d,]+ events/s\)",
                        last), last


def test_events_a_declared_schema_refuses_are_bad_events(tmp_path):
    """EVENT A(x INT): an A whose x has a fraction or is a string is a bad event on
    every engine, named by its id (the Spark batch job: tests/spark/test_spark.py; the
    streaming paths: tests/service/test_feeds.py)."""
    q = tmp_path / "q.cep"
    q.write_text(MISDECLARED_QUERY)
    events = tmp_path / "e.jsonl"
    events.write_text(MISDECLARED_EVENTS)
    r = dqcep("run", q, "--input", events)
    assert r.returncode == 2 and r.stderr.strip() == \
        f"{events}: event 2: A.x is declared INT, got a number with a fraction"
    for engine in ("native", "sase", "reference"):
        r = dqcep("run", q, "--input", events, "--engine", engine, "--on-bad-event", "skip")
        assert r.returncode == 0, r.stderr
        assert [json.loads(x)["events"] for x in r.stdout.splitlines()] == [{"a": 1, "b": 5}]
        assert f"skipped: {events}: event 3: A.s is declared STRING, got a boolean" in r.stderr
        assert "skipped 2 bad event record(s)" in r.stderr


def test_csv_cells_of_declared_strings_stay_text(tmp_path):
    """A CSV cell is typed by its look (101 a number, true a boolean) except where the
    row's type declares the attribute STRING: room 101 of a Door is the string '101'.
    The fast CSV path and the validator (the reference, --returns) read it alike."""
    q = tmp_path / "q.cep"
    q.write_text("EVENT Door(room STRING, code STRING);\n"
                 "QUERY q PATTERN SEQ(Door d, Motion m) WHERE d.room = '101' AND "
                 "m.room = 101 AND d.code = 'true' WITHIN 10 RETURN d.room, d.code, m.room")
    events = tmp_path / "e.csv"
    rows = ["id,type,ts,room,code"] + [
        f"{i},{'Door' if i % 2 else 'Motion'},{i},101,true" for i in range(1, 9)]
    events.write_text("\n".join(rows) + "\n")
    outputs = []
    for args in ([], ["--engine", "sase"], ["--engine", "reference"], ["--returns"]):
        r = dqcep("run", q, "--input", events, *args)
        assert r.returncode == 0, r.stderr
        outputs.append(sorted(json.dumps(json.loads(x)["events"]) for x in r.stdout.splitlines()))
    assert outputs[0] and all(o == outputs[0] for o in outputs)
    r = dqcep("run", q, "--input", events, "--returns")
    assert json.loads(r.stdout.splitlines()[0])["return"] == {
        "d.room": "101", "d.code": "true", "m.room": 101}


def test_after_match_runs_on_every_engine():
    """Spec section 6 on an event file: the native engine and the SASE baseline give
    the reference's matches (the service: test_service.py; Spark: test_spark.py)."""
    q = ROOT / "examples" / "incidents.cep"
    events = ROOT / "examples" / "incidents.jsonl"
    r = dqcep("run", q, "--input", events, "--engine", "reference")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    for engine in ("native", "sase"):
        got = dqcep("run", q, "--input", events, "--engine", engine)
        assert got.returncode == 0 and sorted(got.stdout.splitlines()) == \
            sorted(r.stdout.splitlines()), (engine, got.stderr)
