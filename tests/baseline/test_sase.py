"""The SASE baseline (dqcep.baseline, kernel dqcep/_kernels/sase.pyx) against the
reference matcher, match for match, and its rejection of queries outside SASE."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.baseline import SaseEngine
from dqcep.core.errors import UserError
from dqcep.core.events import Event
from dqcep.lang import ast, file_to_source, parse
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.strategies import (outside_sase, sase_queries,
                              small_event_streams, small_query_files)
from tests.support.engines import CUTS, as_set, bursty_streams, sase, split
from tests.support.examples import examples
from tests.support.paths import ROOT



def one(q: ast.Query):
    return parse(file_to_source(ast.QueryFile("<t>", (q,)))).queries


def check(queries, events, cuts=()):
    assert sase(queries, split(events, cuts)) == as_set(ReferenceMatcher(queries).run(events))


@settings(max_examples=examples(600), deadline=None, suppress_health_check=list(HealthCheck))
@given(sase_queries(), small_event_streams(), CUTS)
def test_sase_matches_reference(q, events, cuts):
    check(one(q), events, cuts)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(sase_queries(), bursty_streams(), CUTS)
def test_sase_matches_reference_on_bursts_and_gaps(q, events, cuts):
    check(one(q), events, cuts)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(sase_queries(), min_size=1, max_size=3), small_event_streams(),
       st.randoms(use_true_random=False))
def test_sase_reorders_like_the_native_engine(qs, events, rnd):
    """Several queries at once, fed in any order with a lateness covering it."""
    queries = parse(file_to_source(ast.QueryFile("<t>", tuple(
        ast.Query(f"q{i}", q.pattern, q.where, q.within, ()) for i, q in enumerate(qs))))).queries
    shuffled = list(events)
    rnd.shuffle(shuffled)
    batches = [shuffled[i:i + 3] for i in range(0, len(shuffled), 3)]
    assert sase(queries, batches, lateness=100) == as_set(ReferenceMatcher(queries).run(events))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(small_query_files(), small_event_streams())
def test_sase_runs_what_it_supports_and_rejects_the_rest(f, events):
    queries = parse(file_to_source(f)).queries
    outside = [w for w in map(outside_sase, queries) if w]
    if outside:
        with pytest.raises(UserError, match=f"{outside[0].split()[0]}.*not supported"):
            SaseEngine(queries)
    else:
        check(queries, events)


def test_rejection_names_the_query_and_the_position():
    text = "QUERY ok PATTERN SEQ(A a, B b) WITHIN 5;\nQUERY bad\nPATTERN SEQ(A a, AND(B b, C c))\nWITHIN 5"
    with pytest.raises(UserError) as err:
        SaseEngine(parse(text, "q.cep").queries, source="q.cep")
    assert "q.cep:3:18: query 'bad'" in str(err.value)
    assert "AND inside SEQ is not supported (use --engine native)" in str(err.value)
    with pytest.raises(UserError, match="NOT \\(pattern\\) is not supported"):
        SaseEngine(parse("PATTERN SEQ(A a, NOT (SEQ(B b, C c)), A d) WITHIN 5").queries)
    with pytest.raises(UserError, match="OR is not supported"):
        SaseEngine(parse("PATTERN OR(A a, B b) WITHIN 5").queries)


def test_equivalence_partitions_the_stacks():
    q = parse("PATTERN SEQ(A a, B b, C c) WHERE [room] WITHIN 100").queries
    engine = SaseEngine(q)
    rooms = ["r1", "r2", "r3", "r1", "r2"]
    events = [Event(i, t, i, {"room": rooms[i % 5]})
              for i, t in enumerate(["A", "A", "A", "B", "B", "B", "C", "C", "C", "A"])]
    events.append(Event(99, "A", 20, {}))  # no room: no partition takes it
    out = engine.process(events)
    out += engine.flush()
    assert engine.nfas[0].partitions == 3
    assert as_set(out.to_matches()) == as_set(ReferenceMatcher(q).run(events))


def _stream(n, seed=0):
    rnd = np.random.default_rng(seed)
    types = rnd.choice(["A", "B", "C"], n)
    rooms = rnd.integers(0, 8, n)
    return [Event(i, str(types[i]), i, {"room": int(rooms[i]), "p": int(i % 5)})
            for i in range(n)]


def test_window_pruning_bounds_the_stacks():
    """State follows the window, not the stream: 10x the events, about the same peak,
    and the stacks hold only instances inside the window at the end."""
    q = parse("PATTERN SEQ(A a, NOT C n, B b, C c) WHERE [room] AND a.p < c.p WITHIN 50").queries
    peaks = []
    for n in (20_000, 200_000):
        engine = SaseEngine(q)
        events = _stream(n)
        for i in range(0, n, 4096):
            engine.process(events[i:i + 4096])
        engine.flush()
        nfa = engine.nfas[0]
        assert nfa.pruned > n // 10
        assert nfa.instances <= 2 * 51  # live A and B instances all within the last W
        peaks.append(engine.peak_state_bytes)
    assert peaks[1] < 1.5 * peaks[0]


@pytest.mark.integration
def test_cli_engine_sase_agrees_with_native(tmp_path):
    """dqcep run --engine sase over a generated IoT stream with the SEQ queries of
    iot.cep: the same matches as the native engine; an AND query: exit code 2."""
    seq_queries = tmp_path / "seq.cep"
    text = (ROOT / "dqcep" / "data" / "iot.cep").read_text()
    seq_queries.write_text(text[:text.index("-- Humid")])
    events = tmp_path / "events.jsonl"
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                    "20000", "--plant", str(seq_queries), "--plant-every", "130000",
                    "--quiet", "-o", str(events)], check=True)
    outs = {}
    for engine in ("native", "sase"):
        out = tmp_path / f"{engine}.jsonl"
        subprocess.run([sys.executable, "-m", "dqcep", "run", str(seq_queries), "-i",
                        str(events), "--engine", engine, "-o", str(out)], check=True)
        outs[engine] = sorted(out.read_text().splitlines())
    assert len(outs["native"]) > 10
    assert outs["sase"] == outs["native"]
    bad = subprocess.run([sys.executable, "-m", "dqcep", "run",
                          str(ROOT / "dqcep" / "data" / "iot.cep"), "-i", str(events),
                          "--engine", "sase"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "query 'stuffy'" in bad.stderr and "AND is not supported" in bad.stderr


@pytest.mark.parametrize("strategy, lists", [
    # A0 T1 T2 B3: every non-empty list of the Ts (2^2 - 1) ...
    ("skip-till-any-match", {(1,), (2,), (1, 2)}),
    # ... a run must take each T it fits
    ("skip-till-next-match", {(1, 2)}),
    ("strict-contiguity", {(1, 2)}),
    ("partition-contiguity", {(1, 2)}),
])
def test_sase_runs_kleene_items_under_each_strategy(strategy, lists):
    q = parse(f"PATTERN SEQ(A a, T+ t[], B b) WHERE [room] WITHIN 5 USING {strategy}").queries
    events = [Event(0, "A", 0, {"room": 1}), Event(1, "T", 1, {"room": 1}),
              Event(2, "T", 2, {"room": 1}), Event(3, "B", 3, {"room": 1})]
    got = sase(q, [events])
    assert {dict(m[1])["t"] for m in got} == lists
    assert got == as_set(ReferenceMatcher(q).run(events))
    # an event between: contiguity ends the run (partition-contiguity: in the room only)
    for room, ended in ((1, strategy in ("strict-contiguity", "partition-contiguity")),
                        (2, strategy == "strict-contiguity")):
        between = events[:2] + [Event(9, "Z", 1, {"room": room})] + events[2:]
        got = sase(q, [between])
        assert got == as_set(ReferenceMatcher(q).run(between))
        assert (got == set()) == ended


def test_sase_rejects_section5_outside_its_subset_with_the_position():
    with pytest.raises(UserError, match="1:9: query 'q1'.*AND is not supported"):
        SaseEngine(parse("PATTERN AND(SEQ(A a, T+ t[]), B b) WITHIN 5").queries)
    with pytest.raises(UserError, match="NOT \\(pattern\\) is not supported"):
        SaseEngine(parse("PATTERN SEQ(T+ t[], NOT (SEQ(B b, C c)), A d) WITHIN 5 "
                         "USING skip-till-next-match").queries)


@pytest.mark.parametrize("strategy", ["skip-till-any-match", "skip-till-next-match",
                                      "strict-contiguity", "partition-contiguity"])
def test_sase_runs_stay_bounded_over_a_long_stream(strategy):
    """Runs, their lists and the events waiting for them follow the window, not the
    stream, under every strategy (10x the events: about the same peak)."""
    q = parse("PATTERN SEQ(T+ t[], S s) WHERE [room] AND t[i].v > t[i-1].v WITHIN 5 "
              f"USING {strategy}").queries
    peaks = []
    for n in (20, 200):
        engine = SaseEngine(q)
        for b in range(n):
            engine.process([Event(b * 100 + i, "T" if i % 7 else "S", b * 50 + i,
                                  {"room": f"r{i % 3}", "v": (i * 7) % 11})
                            for i in range(50)])
        peaks.append(engine.peak_state_bytes)
        assert engine.nfas[0].runs <= 3 * 6  # per room, at most the runs of one window
    assert peaks[1] <= 1.5 * peaks[0]
