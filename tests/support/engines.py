"""The engines a differential test runs against the reference matcher: the native
engine under each materialization (and an adaptive one switching at random), the SASE
baseline, the snapshot-and-restore round, and how a stream is cut into batches."""
import random

from hypothesis import strategies as st

from dqcep.baseline import SaseEngine
from dqcep.core.events import Event
from dqcep.plan import build_plan
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.runtime import Engine
from dqcep.runtime.adapt import OTHER, AdaptiveEngine
from tests.support.strategies import ATTR_VALUES, SMALL_TYPES, outside_sase


def as_set(matches):
    out = [(m.query, m.events, m.detected_at) for m in matches]
    assert len(out) == len(set(out)), "a match was emitted twice"
    return set(out)


# joins kept / built on demand / chains / an adaptive engine moving its queries between
# joins and a chain after random batches (RandomSwitches)
SWITCHING = "switching"
MATERIALIZE = ("always", "on-demand", "chain", SWITCHING)


class RandomSwitches(AdaptiveEngine):
    """An adaptive engine that, instead of measuring, moves each switchable query to
    its other construction with probability 1/2 after every batch (``seed``)."""

    def __init__(self, queries, seed: int = 0, **kwargs):
        super().__init__(queries, adapt=False, **kwargs)
        self.rnd = random.Random(seed)
        self.moves = 0

    def process(self, events):
        out = super().process(events)
        for name, now in self.constructions.items():
            if self.rnd.random() < 0.5:
                self.moves += self.switch(name, OTHER[now])
        return out


def engine_for(queries, lateness=0, materialize="always", seed=0, **kwargs) -> Engine:
    """An engine of ``queries`` under a ``MATERIALIZE`` mode (``kwargs``: schemas,
    tables, lookup_source, budget)."""
    if materialize == SWITCHING:
        return RandomSwitches(queries, seed, lateness=lateness, **kwargs)
    plan = build_plan(queries, materialize=materialize, schemas=kwargs.pop("schemas", ()),
                      tables=kwargs.pop("tables", ()))
    return Engine(plan, lateness, **kwargs)


def native(queries, batches, lateness=0, materialize="always"):
    engine = engine_for(queries, lateness, materialize,
                        seed=sum(e.id * (i + 1) for i, b in enumerate(batches) for e in b))
    out = engine.process([])
    for b in batches:
        out += engine.process(b)
    out += engine.flush()
    return as_set(out.to_matches())


def split(events, cuts, shuffle_seed=None):
    """Events in ts order, cut into batches; each batch optionally shuffled."""
    events = sorted(events, key=lambda e: (e.ts, e.id))
    bounds = sorted({0, len(events), *[c % (len(events) + 1) for c in cuts]})
    batches = [events[a:b] for a, b in zip(bounds, bounds[1:])]
    if shuffle_seed is not None:
        rnd = random.Random(shuffle_seed)
        for b in batches:
            rnd.shuffle(b)
    return batches


def sase(queries, batches, lateness=0):
    engine = SaseEngine(queries, lateness)
    out = engine.process([])
    for b in batches:
        out += engine.process(b)
    out += engine.flush()
    return as_set(out.to_matches())


def check(queries, events, cuts=(), shuffle_seed=None, baseline=False):
    """Native (and with ``baseline`` the SASE baseline, for queries in its subset) ==
    reference, on the stream cut at ``cuts``, each batch shuffled by ``shuffle_seed``."""
    expected = as_set(ReferenceMatcher(queries).run(events))
    batches = split(events, cuts, shuffle_seed)
    # a shuffled batch is out of order by up to its ts span: a lateness covering it
    lateness = max((max(e.ts for e in b) - min(e.ts for e in b) for b in batches if b),
                   default=0) if shuffle_seed is not None else 0
    for materialize in MATERIALIZE:
        assert native(queries, batches, lateness, materialize) == expected, materialize
    if baseline and not any(map(outside_sase, queries)):
        assert sase(queries, batches, lateness) == expected


@st.composite
def bursty_streams(draw, max_events=14):
    """Bursts of equal timestamps and long gaps between them."""
    out, t = [], 0
    for i in range(draw(st.integers(0, max_events))):
        t += draw(st.sampled_from([0, 0, 0, 1, 2, 7, 40]))
        attrs = {a: draw(ATTR_VALUES) for a in ("p", "q") if draw(st.booleans())}
        out.append(Event(i + 1, draw(SMALL_TYPES), t, attrs))
    return out


CUTS = st.lists(st.integers(0, 40), max_size=4)


def snapshot_at(q, events, cut, lateness=0, materialize="always"):
    """The matches of an engine snapshotted after ``cut`` events (in stream order) and
    restored into a fresh engine of the same program, which goes on to the end.
    ``q``: a query or a list of them."""
    from dqcep.runtime import Engine, MatchBatch
    ordered = sorted(events, key=lambda e: (e.ts, e.id))
    first = Engine(build_plan(q if isinstance(q, list) else [q], materialize=materialize),
                   lateness)
    got = MatchBatch(first.match_queries)
    got += first.process(ordered[:cut])
    second = Engine(first.program)
    second.restore(first.snapshot())
    got += second.process(ordered[cut:])
    got += second.flush()
    return as_set(got.to_matches())
