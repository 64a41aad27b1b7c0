"""Adaptive plans (dqcep.runtime.adapt): a query moved between joins and a chain while
the engine runs. The differential tests of test_native, test_policies and
test_lookups run every query through random moves (``RandomSwitches``); here: what
may move and when, the state a move hands over, and the decisions, with the
measurements given (no test reads a clock)."""
import random

import numpy as np
import pytest

from dqcep._kernels.store import EventStore
from dqcep.events import Event
from dqcep.lang import parse
from dqcep.plan import switchable
from dqcep.reference import ReferenceMatcher
from dqcep.runtime import MatchBatch
from dqcep.runtime import adapt
from dqcep.runtime.adapt import AdaptiveEngine, Trial
from tests.test_native import as_set

KLEENE = "QUERY k PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].p > a.p AND c.p < a.p WITHIN 30 ms"


def stream(n=300, seed=1, types="ABCD"):
    rnd = random.Random(seed)
    return [Event(i + 1, rnd.choice(types), i, {"p": rnd.randint(0, 9)}) for i in range(n)]


def test_the_store_keeps_each_events_type_code_through_dump_and_load():
    store = EventStore(1)
    first = store.append(np.array([1, 2, 3]), np.array([7, 8, 9]), np.zeros((3, 1)),
                         np.ones((3, 1), np.int8), np.array([2, 0, 1], np.int32))
    store.append(np.array([4]), np.array([10]), np.zeros((1, 1)), np.ones((1, 1), np.int8))
    seqs = np.arange(first, first + 4)
    assert store.types_of(seqs).tolist() == [2, 0, 1, -1]  # -1: appended without types
    again = EventStore(1)
    again.load(store.base, *store.dump()[1:])
    assert again.types_of(seqs).tolist() == [2, 0, 1, -1]
    with pytest.raises(IndexError):
        store.types_of(np.array([first + 4]))


def test_queries_sharing_an_operator_or_not_chains_are_not_switchable():
    qs = parse("""
        QUERY s1 PATTERN SEQ(A a, B b, C c) WITHIN 10 ms;
        QUERY s2 PATTERN SEQ(A a, B b, D d) WITHIN 10 ms;
        QUERY alone PATTERN SEQ(C c, D d) WHERE d.p > c.p WITHIN 10 ms;
        QUERY next PATTERN SEQ(A a, B+ b[]) WITHIN 10 ms USING skip-till-next-match;
        QUERY either PATTERN OR(A a, B b) WITHIN 10 ms""").queries
    assert switchable(qs) == ["alone"]  # s1 and s2 share SEQ(A, B)
    engine = AdaptiveEngine(qs, adapt=False)
    assert engine.constructions == {"alone": "joins"}
    with pytest.raises(ValueError, match="switchable: alone"):
        engine.switch("s1", "chain")


def test_a_moved_query_goes_on_with_the_state_its_vertices_would_hold():
    """Moved back and forth after each batch, from the first one on: the reference's
    matches, each once; the program really changes (a RUN vertex, then joins)."""
    qs = parse(KLEENE).queries
    events = stream()
    engine = AdaptiveEngine(qs, adapt=False)
    out = MatchBatch(engine.match_queries)
    seen = set()
    for k in range(0, len(events), 40):
        out += engine.process(events[k:k + 40])
        target = "chain" if engine.constructions["k"] == "joins" else "joins"
        assert engine.switch("k", target)
        seen.add(tuple(sorted(engine.plan.label(v) for v in engine.program.topo)))
    out += engine.flush()
    assert as_set(out.to_matches()) == as_set(ReferenceMatcher(qs).run(events))
    assert len(seen) == 2


def test_a_query_holding_matches_for_a_trailing_not_moves_once_it_holds_none():
    qs = parse("QUERY t PATTERN SEQ(A a, B b, NOT C c) WITHIN 5 ms").queries
    engine = AdaptiveEngine(qs, adapt=False)
    engine.process([Event(1, "A", 0, {}), Event(2, "B", 1, {})])
    assert len(engine.state.pending[0])  # held until 0 + 5 ms
    assert not engine.switch("t", "chain")
    assert engine.constructions == {"t": "joins"}
    out = engine.process([Event(3, "D", 9, {})])  # the watermark passes: released
    assert [m.events for m in out.to_matches()] == [(("a", 1), ("b", 2))]
    assert engine.switch("t", "chain")
    out = engine.process([Event(4, "A", 10, {}), Event(5, "B", 11, {}), Event(6, "C", 12, {})])
    out += engine.flush()
    assert not len(out)  # C negates the new pair: the chain checks it


def test_a_moved_engine_restores_into_one_built_with_its_constructions():
    qs = parse(KLEENE).queries
    events = stream(200, seed=3)
    first = AdaptiveEngine(qs, adapt=False)
    got = first.process(events[:100])
    assert first.switch("k", "chain")
    got += first.process(events[100:150])
    second = AdaptiveEngine(qs, adapt=False, constructions=first.constructions)
    second.restore(first.snapshot())
    got += second.process(events[150:])
    got += second.flush()
    assert as_set(got.to_matches()) == as_set(ReferenceMatcher(qs).run(events))


class Measured(AdaptiveEngine):
    """An adaptive engine whose measurements are given: its query's vertices take
    ``cost[construction]`` ns per stored event, and so does a trial of it (None: the
    trial went over its cap or the budget). The clocks read 0 (``no_clock``)."""

    def __init__(self, queries, cost: dict, **kwargs):
        super().__init__(queries, **kwargs)
        self.cost, self.tried = cost, []

    def _match(self, seqs, ts, types, only=None):
        out = super()._match(seqs, ts, types, only)
        q = self.program.queries[0]
        v = min(adapt.query_vertices(self.program, q.index))
        self.state.stats[v].ns += int(self.cost[q.spec.construction] * len(seqs))
        return out

    def try_construction(self, name, construction, cap_ns_per_event=None):
        self.tried.append((construction, cap_ns_per_event))
        if self.cost[construction] is None:
            return None
        trial = super().try_construction(name, construction)
        return Trial(trial.program, trial.state, self.cost[construction], trial.events)


@pytest.fixture
def no_clock(monkeypatch):
    """Every time the engine measures is 0 ns: only the given costs count."""
    monkeypatch.setattr("dqcep.runtime.engine.perf_counter_ns", lambda: 0)
    monkeypatch.setattr("dqcep.runtime.adapt.perf_counter_ns", lambda: 0)


def run(engine, events, size=1000):
    out = MatchBatch(engine.match_queries)
    for k in range(0, len(events), size):
        out += engine.process(events[k:k + size])
    out += engine.flush()
    return out


def test_the_engine_moves_a_query_when_the_other_construction_measures_faster(no_clock):
    qs = parse(KLEENE).queries
    events = stream(30_000, seed=5)
    engine = Measured(qs, {"joins": 20_000.0, "chain": 1000.0})
    out = run(engine, events)
    # the first look: LOOK_EVENTS stored events in, the current cost per event its cap;
    # then the chain is looked at (and kept: joins measure slower)
    assert engine.tried == [("chain", 20_000.0), ("joins", 1000.0)]
    assert engine.constructions == {"k": "chain"}
    assert engine.looks["k"].switches == 1
    unmoved = run(AdaptiveEngine(qs, adapt=False), events)  # (the reference is slow here)
    assert as_set(out.to_matches()) == as_set(unmoved.to_matches())


def test_a_slower_trial_is_dropped_and_the_next_look_waits_twice_as_long(no_clock):
    qs = parse(KLEENE).queries
    events = stream(40_000, seed=6)  # 30,000 stored (no query reads D)
    engine = Measured(qs, {"joins": 2000.0, "chain": 1500.0})  # faster, not GAIN times
    run(engine, events)
    assert engine.constructions == {"k": "joins"}
    look = engine.looks["k"]
    # looks after 8192 and 8192 + 16384 stored events (not after every batch)
    assert look.trials == len(engine.tried) == 2 and look.switches == 0
    assert look.wait == 4 * adapt.LOOK_EVENTS


def test_cheap_queries_and_adapt_false_are_never_tried(no_clock):
    qs = parse(KLEENE).queries
    events = stream(20_000, seed=7)
    cheap = Measured(qs, {"joins": 1.0, "chain": 0.0})  # 15 us in all: under LOOK_MIN_NS
    run(cheap, events)
    off = Measured(qs, {"joins": 2000.0, "chain": 1.0}, adapt=False)
    run(off, events)
    assert cheap.tried == off.tried == []
    assert cheap.constructions == off.constructions == {"k": "joins"}


def test_a_trial_over_its_cap_keeps_the_query_as_it_runs(no_clock):
    qs = parse(KLEENE).queries
    engine = Measured(qs, {"joins": 2000.0, "chain": None})
    run(engine, stream(20_000, seed=8))
    assert engine.tried and engine.constructions == {"k": "joins"}
