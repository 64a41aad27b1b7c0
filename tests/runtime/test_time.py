"""Spec section 7 (time): when a match that waits comes out. A held match (a trailing
NOT) is final once no admissible event can rule it out: the late rule admits no event
below G - L, so at G - L > start + W. Every engine outputs it with the record that made
it final, not with a later one."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.baseline import SaseEngine
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.core.events import Event
from dqcep.lang import parse
from dqcep.plan import build_plan
from dqcep.runtime import Engine
from dqcep.runtime.adapt import AdaptiveEngine
from tests.support.examples import examples

LEFT_OPEN = parse("QUERY left_open PATTERN SEQ(Door o, NOT Door c) WHERE o.open = true "
                  "AND c.open = false AND c.device = o.device WITHIN 8 s").queries
ENGINES = {"native": lambda qs, lateness: Engine(build_plan(qs), lateness=lateness),
           "adaptive": lambda qs, lateness: AdaptiveEngine(qs, lateness=lateness),
           "sase": lambda qs, lateness: SaseEngine(qs, lateness=lateness)}


def door(i, ts, device, is_open=True):
    return Event(i, "Door", ts, {"device": device, "open": is_open})


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("lateness", [0, 1000])
@pytest.mark.parametrize("after", [1, 7000])
def test_a_held_match_comes_out_with_the_record_that_makes_it_final(engine, lateness, after):
    """door-3 opens at 1 s: its match is final once G - L > 9 s. Another door's event
    at 9 s + L does not make it final; the next one, ``after`` ms later, does, and the
    alert comes out with it (issue 52 found it waiting for a third event: lateness 1 s,
    the next event at 16 s)."""
    events = [door(1, 1000, "door-3"), door(2, 9000 + lateness, "door-9"),
              door(3, 9000 + lateness + after, "door-7")]
    e = ENGINES[engine](LEFT_OPEN, lateness)
    assert not len(e.process(events[:1]))
    assert not len(e.process(events[1:2]))  # G - L = start + W: not yet final
    out = e.process(events[2:]).to_matches()
    assert [m.events for m in out] == [(("o", 1),)]
    out += e.flush().to_matches()
    assert sorted(m.events for m in out) == sorted(
        m.events for m in ReferenceMatcher(LEFT_OPEN).run(events))


@pytest.mark.parametrize("engine", ENGINES)
def test_the_record_that_makes_a_match_final_need_not_be_released_itself(engine):
    """Issue 52's case: lateness 1 s, door-3 open at 1 s, door-9 open at 16 s. The
    second event stays in the reorder buffer (ts > G - L), yet G - L = 15 s > 9 s makes
    door-3's match final: it comes out with that event, not with a third."""
    e = ENGINES[engine](LEFT_OPEN, 1000)
    assert not len(e.process([door(1, 1000, "door-3")]))
    assert [m.events for m in e.process([door(2, 16000, "door-9")]).to_matches()] == \
        [(("o", 1),)]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from("ABC"), st.integers(0, 60), st.integers(0, 3),
                          st.booleans()), min_size=1, max_size=40),
       st.integers(0, 30), st.lists(st.integers(1, 40), max_size=4),
       st.sampled_from(["SEQ(A a, B b) WHERE b.p = a.p WITHIN 20",
                        "SEQ(A a, NOT C c, B b) WITHIN 15",
                        "SEQ(A a, B b, NOT C c) WHERE c.p = a.p WITHIN 10",
                        "SEQ(A a, B+ b[]) WHERE b[i].p >= b[i-1].p WITHIN 12"]))
def test_every_engine_admits_the_events_the_late_rule_admits(events, lateness, cuts, pattern):
    """Out-of-order streams cut into random batches: the native, adaptive and SASE
    engines find exactly the reference matcher's matches under the same lateness, and
    leave out the same late events (spec section 7 with one timeline, no ticks)."""
    stream = [Event(i + 1, t, ts, {"p": p}) for i, (t, ts, p, _) in enumerate(events)]
    qs = parse(f"QUERY q PATTERN {pattern}").queries
    reference = ReferenceMatcher(qs, lateness=lateness)
    expected = sorted(m.events for m in reference.run(stream))
    bounds = sorted({0, len(stream), *[c % (len(stream) + 1) for c in cuts]})
    for name, make in ENGINES.items():
        e = make(qs, lateness)
        out = []
        for a, b in zip(bounds, bounds[1:]):
            out += e.process(stream[a:b]).to_matches()
        out += e.flush().to_matches()
        assert sorted(m.events for m in out) == expected, name
        assert sorted(e.take_late()) == sorted(reference.late_ids), name
