"""Adaptive plans (dqcep.runtime.adapt): a query moved between joins and a chain while
the engine runs. The differential tests of test_native, test_policies and
test_lookups run every query through random moves (``RandomSwitches``); here: what
may move and when, the state a move hands over, and the decisions, with the
measurements given (no test reads a clock)."""
import itertools
import random

import numpy as np
import pytest

from dqcep._kernels.store import EventStore
from dqcep.core.events import Event
from dqcep.lang import parse
from dqcep.plan import switchable
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.runtime import MatchBatch
from dqcep.runtime import adapt
from dqcep.runtime.adapt import OTHER, AdaptiveEngine, Trial
from tests.support.engines import as_set

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
    ``cost[construction]`` ns per stored event, and so does a replay of it (None: over
    the budget). The clocks read 0 (``no_clock``)."""

    def __init__(self, queries, cost: dict, replay: dict | None = None, **kwargs):
        super().__init__(queries, **kwargs)
        self.cost, self.tried = cost, []
        self.replay = {**cost, **(replay or {})}  # what a replay measures, if not cost

    def _match(self, seqs, ts, types, only=None):
        out = super()._match(seqs, ts, types, only)
        q = self.program.queries[0]
        v = min(adapt.query_vertices(self.program, q.index))
        self.state.stats[v].ns += int(self.cost[q.spec.construction] * len(seqs))
        return out

    def try_construction(self, name, construction, capped=True, upto=None):
        self.tried.append((construction, capped))
        cost = self.replay[construction]
        if cost is None or (capped and cost > adapt.CAP * self.replay[OTHER[construction]]):
            return None
        trial = super().try_construction(name, construction, False, upto)
        return Trial(trial.program, trial.state, cost, trial.events, trial.overrides)


@pytest.fixture
def no_clock(monkeypatch):
    """Every time the engine measures is 0 ns: only the given costs count."""
    monkeypatch.setattr("dqcep.runtime.engine.perf_counter_ns", lambda: 0)
    monkeypatch.setattr("dqcep.runtime.handover.perf_counter_ns", lambda: 0)


def run(engine, events, size=1000):
    out = MatchBatch(engine.match_queries)
    for k in range(0, len(events), size):
        out += engine.process(events[k:k + size])
    out += engine.flush()
    return out


def test_a_faster_construction_is_kept_after_its_probation(no_clock):
    qs = parse(KLEENE).queries
    events = stream(30_000, seed=5)  # 22,500 stored
    engine = Measured(qs, {"joins": 20_000.0, "chain": 1000.0})
    out = run(engine, events)
    # the first look tries the chain, capped by a replay of the joins; the probation
    # (8192 stored events later) keeps it; the next look is after 8192 more
    assert engine.tried == [("chain", True)]
    assert engine.constructions == {"k": "chain"}
    assert engine.looks["k"].switches == 1 and engine.looks["k"].before is None
    assert len(engine.moves) == 1 and engine.moves[0].at_event >= adapt.LOOK_EVENTS
    assert "on probation (20,000 ns/event as joins" in str(engine.moves[0])
    unmoved = run(AdaptiveEngine(qs, adapt=False), events)  # (the reference is slow here)
    assert as_set(out.to_matches()) == as_set(unmoved.to_matches())


def test_after_a_first_trial_a_look_waits_while_the_store_holds_most_of_the_run(
        no_clock):
    """A trial replays the whole store: while a window fills (the store holds most of
    what came since the last look) a look would cost more than its share of the run,
    so after the first trial it waits until STORE_SHARE times what the store holds has
    come since. Here the chain's replay goes over its cap at every look (the next one
    BACKOFF times later): a window longer than the stream is tried once, one that
    fills twice."""
    rnd = random.Random(3)
    events = [Event(i + 1, rnd.choice("ABCD"), i, {"p": rnd.randint(0, 9999)})
              for i in range(52_000)]  # 1 ms apart: 39,000 stored

    def engine(within):
        return Measured(parse("QUERY k PATTERN SEQ(A a, B b, C c) WHERE b.p = a.p AND "
                              f"c.p = a.p WITHIN {within}").queries,
                        {"joins": 2000.0, "chain": 1000.0}, replay={"chain": 5000.0})
    longer = engine("2 min")
    run(longer, events)
    fills = engine("2 s")  # the store keeps 4 s for a move: about 3,000 events
    run(fills, events)
    assert fills.tried == [("chain", True)] * 2
    assert longer.tried == [("chain", True)] and not longer.moves
    assert longer.looks["k"].due > longer.state.store.next_seq  # and waits on


def test_a_move_slower_on_probation_is_taken_back_and_the_next_look_waits(no_clock):
    qs = parse(KLEENE).queries
    events = stream(40_000, seed=6)  # 30,000 stored
    engine = Measured(qs, {"joins": 2000.0, "chain": 3000.0})  # within the replay's cap
    out = run(engine, events)
    assert engine.constructions == {"k": "joins"}
    look = engine.looks["k"]
    assert engine.tried == [("chain", True), ("joins", False)]  # moved back: no cap
    assert look.switches == 2 and look.wait == adapt.BACKOFF * adapt.LOOK_EVENTS
    assert "3,000 ns/event as chain, 2,000 before" in str(engine.moves[1])
    unmoved = run(AdaptiveEngine(qs, adapt=False), events)
    assert as_set(out.to_matches()) == as_set(unmoved.to_matches())


def test_a_probation_clearly_slower_ends_early(no_clock):
    """The replay said the chain might do (3,000 ns/event against 2,000) but it runs at
    5,000: over EARLY_FACTOR times slower, the probation ends after EARLY_EVENTS stored
    events instead of PROBATION_EVENTS (a short run spent the rest of itself there)."""
    import re
    qs = parse(KLEENE).queries
    events = stream(40_000, seed=6)
    engine = Measured(qs, {"joins": 2000.0, "chain": 5000.0}, replay={"chain": 3000.0})
    out = run(engine, events)
    assert engine.constructions == {"k": "joins"} and len(engine.moves) == 2
    at = [int(re.search(r"from stored event ([\d,]+)", str(m)).group(1).replace(",", ""))
          for m in engine.moves]
    assert adapt.EARLY_EVENTS <= at[1] - at[0] < adapt.PROBATION_EVENTS, at
    assert "5,000 ns/event as chain, 2,000 before" in str(engine.moves[1])
    unmoved = run(AdaptiveEngine(qs, adapt=False), events)
    assert as_set(out.to_matches()) == as_set(unmoved.to_matches())


def test_cheap_queries_and_adapt_false_are_never_tried(no_clock):
    qs = parse(KLEENE).queries
    events = stream(20_000, seed=7)
    cheap = Measured(qs, {"joins": 1.0, "chain": 0.0})  # 15 us in all: under LOOK_MIN_NS
    run(cheap, events)
    off = Measured(qs, {"joins": 2000.0, "chain": 1.0}, adapt=False)
    run(off, events)
    assert cheap.tried == off.tried == []
    assert cheap.constructions == off.constructions == {"k": "joins"}
    # far under it: its looks come BACKOFF times later than a look's wait
    assert cheap.looks["k"].stretch == adapt.BACKOFF


def test_the_model_s_doubt_raises_the_time_before_a_trial(no_clock):
    """A query is tried once it took LOOK_MIN_NS in a look, times the cost
    model's estimate of the other construction's work over its own when more: at
    2,000 ns a stored event (~8 ms a look) it is tried when the model put the chain at
    4x the joins, not at 10x (the time it could save is small, the trial may cost 10x)."""
    qs = parse(KLEENE).queries
    tried = {}
    for ratio in (4.0, 10.0):
        engine = Measured(qs, {"joins": 2000.0, "chain": 1000.0})
        assert engine.estimated["k"] == {}  # --materialize always: nothing estimated
        engine.estimated["k"] = {"joins": 1.0, "chain": ratio}
        run(engine, stream(20_000, seed=8))
        tried[ratio] = engine.tried
    assert tried == {4.0: [("chain", True)], 10.0: []}  # 10x: looks ~1.2x apart, never
    assert adapt.LOOK_MIN_NS * 4 < 2000 * adapt.LOOK_EVENTS < adapt.LOOK_MIN_NS * 10
    auto = AdaptiveEngine(qs, materialize="auto")  # what the planner estimated
    assert set(auto.estimated["k"]) == {"joins", "chain"}
    assert all(w > 0 for w in auto.estimated["k"].values())


def test_a_replay_over_its_cap_or_the_budget_keeps_the_query_as_it_runs(no_clock):
    qs = parse(KLEENE).queries
    for cost in (None, 4001.0):  # the budget; over CAP x 2000
        engine = Measured(qs, {"joins": 2000.0, "chain": cost})
        run(engine, stream(20_000, seed=8))
        assert engine.tried == [("chain", True)]  # the next look: 8 x 4096 stored later
        assert engine.looks["k"].wait == adapt.BACKOFF * adapt.LOOK_EVENTS
        assert engine.constructions == {"k": "joins"} and not engine.moves


def test_a_real_replay_stops_at_its_cap(monkeypatch):
    """The replays themselves, on a clock that ticks once a reading (every slice of a
    replay takes 1 ns): within CAP times the current one's; with a cap of 0, stopped."""
    ticks = itertools.count()
    monkeypatch.setattr("dqcep.runtime.handover.perf_counter_ns", lambda: next(ticks))
    qs = parse(KLEENE).queries
    engine = AdaptiveEngine(qs, adapt=False)
    engine.process(stream(500, seed=9))
    assert engine.try_construction("k", "chain") is not None
    monkeypatch.setattr(adapt, "CAP", 0.0)
    assert engine.try_construction("k", "chain") is None
    assert engine.try_construction("k", "chain", capped=False) is not None


def burst():
    """An A, then 15 rising-enough Bs in one batch: 2^15 lists as joins, none as a chain
    (no C after them matches); then one match."""
    events = [Event(1, "A", 0, {"p": 0})]
    later = [Event(2 + i, "B", 1 + i, {"p": 5}) for i in range(15)]
    later += [Event(20, "C", 17, {"p": 5}), Event(21, "A", 100, {"p": 0}),
              Event(22, "B", 101, {"p": 1}), Event(23, "C", 102, {"p": -1})]
    return events, later


def test_a_move_over_the_budget_on_probation_goes_back_and_loses_no_match():
    """Joins on probation make 2^15 lists in one slice, over a budget of 1024 partial
    matches: the query is not stopped; it goes back to the chain, rebuilt from the
    events before the slice, which takes the slice (its matches emitted)."""
    qs = parse(KLEENE).queries
    engine = AdaptiveEngine(qs, budget=1024, constructions={"k": "chain"})
    first, later = burst()
    out = engine.process(first)
    assert engine.switch("k", "joins")
    engine.looks["k"].before = 1.0  # on probation
    out += engine.process(later)
    assert engine.stopped == {} and engine.take_stopped() == []
    assert engine.constructions == {"k": "chain"}
    assert "over the budget on probation" in str(engine.moves[-1])
    out += engine.flush()
    want = as_set(ReferenceMatcher(qs).run(first + later))
    assert len(want) == 1 and as_set(out.to_matches()) == want


def test_joins_over_the_budget_become_a_chain_instead_of_stopping():
    """dqcep run's default plan (joins) of a list tied to its neighbours: over the
    budget, the query moves to a chain and goes on; without adapting it is stopped."""
    qs = parse(KLEENE).queries
    first, later = burst()
    want = as_set(ReferenceMatcher(qs).run(first + later))
    engine = AdaptiveEngine(qs, budget=1024)
    out = engine.process(first)
    out += engine.process(later)
    out += engine.flush()
    assert engine.stopped == {} and engine.constructions == {"k": "chain"}
    assert "over the budget as joins" in str(engine.moves[-1])
    assert as_set(out.to_matches()) == want
    plain = AdaptiveEngine(qs, budget=1024, adapt=False)
    plain.process(first)
    plain.process(later)
    assert list(plain.stopped) == ["k"] and plain.constructions == {"k": "joins"}


def test_a_moved_engine_restores_from_its_overrides_and_universe():
    """What the service's checkpoint holds of an adaptive engine (the constructions its
    program was planned with, and its universe when it has one) builds the program its
    snapshot belongs to, after any sequence of moves, a move back included."""
    qs = parse(KLEENE + """;
QUERY two PATTERN SEQ(B x, D y) WHERE x.p < y.p AND [p] WITHIN 20 ms""").queries
    engine = AdaptiveEngine(qs, materialize="auto", adapt=False)
    engine.process(stream(500, seed=3))
    moves = 0
    for _ in range(2):
        for name, now in list(engine.constructions.items()):
            assert engine.switch(name, adapt.OTHER[now])
            moves += 1
            universe = engine.program.based_on and engine.program.universe
            again = AdaptiveEngine(qs, materialize="auto", adapt=False,
                                   constructions=engine.overrides or None,
                                   universe=universe or None)
            again.restore(engine.snapshot())
            assert again.constructions == engine.constructions
    assert moves >= 4
