"""The per-query budget of partial matches (issue 36): a query whose state would grow
past it is stopped with one line while every other query goes on, on every path that
runs the native engine (dqcep run, the streaming service, a Spark task), and the stop
is part of the engine's state (a replay stops it again)."""
import json
import resource
import subprocess
import sys

import msgpack
import pytest

from dqcep.core.errors import UserError
from dqcep.core.events import event_from_mapping
from dqcep.lang import parse
from dqcep.plan import build_plan
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.runtime import Engine
from dqcep.runtime.program import Program
from tests.support.workloads import RUNAWAY_QUERIES, runaway_events

# the issue's: any-match Kleene over 10 min; 27 rising temperatures make 2^27 lists


def reference(text: str, evs: list[dict], names: set[str]) -> set[str]:
    """The reference matcher's matches of the queries named (only those run: the
    stopped one's result is 2^27 lists)."""
    queries = [q for q in parse(text).queries if q.name in names]
    return {json.dumps(m.to_json_obj()) for m in ReferenceMatcher(queries).run(
        [event_from_mapping(e) for e in evs])}


def lines(batch) -> set[str]:
    return {json.dumps(m.to_json_obj()) for m in batch.to_matches()}


def test_a_query_over_its_budget_stops_and_the_others_go_on():
    """Budget 4096: 'rising' (2^13 lists after 13 events of a room) stops with its
    line; 'hot' and 'dry' give exactly the reference's matches. Stopped queries stay
    stopped across a snapshot and restore, and nothing of theirs comes out after."""
    evs = runaway_events()
    plan = build_plan(parse(RUNAWAY_QUERIES).queries)
    engine = Engine(plan, budget=4096)
    got = set()
    for half in (evs[:20], evs[20:]):
        got |= lines(engine.process([event_from_mapping(e) for e in half]))
    [(query, why)] = engine.take_stopped()
    assert query == "rising" and why.startswith("query rising stopped: KLEENE Temperature+")
    assert "4,096 partial matches" in why and "skip-till-next-match" in why
    again = Engine(plan, budget=4096)
    again.restore(engine.snapshot())
    assert again.stopped == {"rising": why} and again.take_stopped() == []
    got |= lines(again.flush())
    assert got == reference(RUNAWAY_QUERIES, evs, {"hot", "dry"}) and got
    assert not any('"rising"' in m for m in got)


def test_under_its_budget_nothing_changes():
    """A budget the state never reaches: every query's matches, 'rising' included (a
    run of 12 events a room: 4095 lists), are the reference's."""
    evs = runaway_events(n=12)
    engine = Engine(build_plan(parse(RUNAWAY_QUERIES).queries), budget=1 << 14)
    got = lines(engine.process([event_from_mapping(e) for e in evs])) | lines(engine.flush())
    assert engine.take_stopped() == [] and engine.stopped == {}
    assert got == reference(RUNAWAY_QUERIES, evs, {"rising", "hot", "dry"})


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_join_over_its_budget_stops_its_query(pipeline):
    """Not only Kleene lists: a SEQ whose queue outgrows the budget (many A before a B
    in one window) stops its query; the negation-free other query goes on. The same
    with the slice run through the joins in one call (JoinPipeline) or vertex by
    vertex."""
    text = ("QUERY pairs PATTERN SEQ(A a, B b) WITHIN 1 min; "
            "QUERY bs PATTERN SEQ(B x, C y) WITHIN 1 min")
    evs = [{"id": i + 1, "type": "A", "ts": i} for i in range(300)] + \
        [{"id": 1000, "type": "B", "ts": 400}, {"id": 1001, "type": "C", "ts": 500}]
    program = Program(build_plan(parse(text).queries))
    assert program.pipeline is not None
    if not pipeline:
        program.pipeline = None
    engine = Engine(program, budget=128)
    got = lines(engine.process([event_from_mapping(e) for e in evs])) | lines(engine.flush())
    assert [q for q, _ in engine.take_stopped()] == ["pairs"]
    assert got == reference(text, evs, {"bs"}) and got


def test_without_stopping_the_batch_fails_with_the_line():
    """A Spark task's engine: one partition of a query stopped would be a wrong result,
    so the task fails with the line (a UserError, which the driver says)."""
    from dqcep.spark.executor import JobSpec
    from dqcep.spark.partitioning import plan_partitioning
    parsed = parse(RUNAWAY_QUERIES)
    spec = JobSpec(RUNAWAY_QUERIES, plan_partitioning(parsed.queries), 1, budget=4096)
    engine = spec.engine()
    with pytest.raises(UserError, match="query rising stopped: KLEENE Temperature"):
        engine.process([event_from_mapping(e) for e in runaway_events()])


@pytest.mark.integration
def test_dqcep_run_survives_the_issues_stream_in_4_gb(tmp_path):
    """The issue's query on 27 events of one room took a 4 GB address space down
    (MemoryError). With the default budget: one line, exit 1, and the other queries'
    matches, exactly the reference's."""
    (tmp_path / "q.cep").write_text(RUNAWAY_QUERIES)
    evs = runaway_events(rooms=("r1",))
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", "q.cep", "--input", "e.jsonl"],
                       cwd=tmp_path, capture_output=True, text=True, preexec_fn=limit,
                       timeout=300)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    stops = [x for x in r.stderr.splitlines() if "stopped:" in x]
    assert len(stops) == 1 and stops[0].startswith("dqcep run: query rising stopped"), r.stderr
    assert set(r.stdout.splitlines()) == reference(RUNAWAY_QUERIES, evs, {"hot", "dry"})


def test_the_service_stops_the_query_the_same_way_after_a_replay(tmp_path):
    """The streaming service: the query is stopped with a line and a dead letter, the
    service goes on; a restart from a checkpoint taken before the stop replays the
    journal and stops it at the same journal offset, with the same dead letter and the
    same output (it used to die at every restart)."""
    from tests.support.journal_service import config, journal_payloads, lines as jsonl
    from dqcep.service import StreamingService
    (tmp_path / "q.cep").write_text(RUNAWAY_QUERIES)
    evs = runaway_events(rooms=("r1", "r2", "r3"))
    payloads = [msgpack.packb({"events": evs[i:i + 8]}) for i in range(0, len(evs), 8)]
    journal_payloads(tmp_path, payloads[:2])
    cfg = config(tmp_path, queries=tmp_path / "q.cep", budget=4096)
    svc = StreamingService(cfg)
    while svc.step():
        pass
    svc.checkpoint()          # before the stop: 16 events, at most 2^8 lists a room
    assert svc.engine.stopped == {}
    svc.close()
    journal_payloads(tmp_path, payloads[2:])

    def run_to_end():
        svc = StreamingService(cfg)
        while svc.step():
            pass
        svc.end_stream()
        stats = {k: svc.stats()[k] for k in ("events_in", "matches_out", "stopped")}
        svc.close()           # a crash: no checkpoint after the stop
        return stats, (tmp_path / "out.jsonl").read_bytes(), jsonl(tmp_path / "dead.jsonl")
    first = run_to_end()
    second = run_to_end()     # the restart replays from the same checkpoint
    assert first == second
    stats, out, dead = first
    assert list(stats["stopped"]) == ["rising"]
    [letter] = dead
    assert letter["query"] == "rising" and letter["reason"].startswith("query rising stopped")
    assert set(out.decode().splitlines()) == reference(RUNAWAY_QUERIES, evs, {"hot", "dry"})


@pytest.mark.integration
def test_explain_and_run_warn_about_a_kleene_item_under_any_match(tmp_path):
    """At plan time: a Kleene item under skip-till-any-match whose window holds more
    than 20 of its events at the cost model's rates (1 event/s unless --rates says)
    gets a positioned warning naming the strategies that bound it; none under another
    strategy or over a short window."""
    from dqcep.plan.warnings import kleene_warnings
    (tmp_path / "q.cep").write_text(RUNAWAY_QUERIES)
    r = subprocess.run([sys.executable, "-m", "dqcep", "explain", "q.cep"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout
    [line] = r.stderr.splitlines()
    assert line.startswith("q.cep:2:26: warning: query rising: Temperature+ t[] under "
                           "skip-till-any-match") and "window of 10 min holds ~600" in line
    assert "USING skip-till-next-match, strict-contiguity or partition-contiguity" in line
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", "q.cep", "--input", "e.jsonl"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert "q.cep:2:26: warning: query rising" in r.stderr
    for text, warned in (
            ("QUERY a PATTERN SEQ(T+ t[], S s) WITHIN 10 min USING skip-till-next-match", 0),
            ("QUERY a PATTERN SEQ(T+ t[], S s) WITHIN 20 s", 0),
            ("QUERY a PATTERN SEQ(T+ t[], S s) WITHIN 21 s", 1),
            ("QUERY a PATTERN SEQ(S s, NOT T+ t[]) WITHIN 1 h", 0)):
        try:
            queries = parse(text).queries
        except UserError:
            continue  # a negated Kleene item is not in the language: nothing to warn
        assert len(kleene_warnings(queries)) == warned, text
    slow = kleene_warnings(parse("QUERY a PATTERN SEQ(T+ t[], S s) WITHIN 10 min").queries,
                           {"T": 0.01})
    assert slow == []  # 6 events a window at 0.01/s

