"""Queries added to and removed from a running native engine (dqcep.runtime.live).

Hypothesis draws a query set (a small file's queries, whose sub-patterns are often
shared, plus a query of the Kleene, strategy or negation families; each with an
after-match policy or none), a stream, the batches it arrives in (each shuffled
within the lateness, so that an event from before a change may lie between two
after it), a history of changes at random points (some queries run from the start,
the others are added at a batch boundary, some removed at a later one) and a
restart (snapshot, program built again from what a checkpoint holds, restore). The
engine changes its query set live and goes on with the state it has.
Against the reference matcher run on the slice of events each query was live for:

- a query that ran from the start and stayed: the reference on the whole stream (the
  changes around it lost and added nothing);
- a query added and never removed: the reference on the events from its addition on;
- a removed query: what a fresh engine running it alone outputs on the events of its
  live slice before the end of the stream is declared (it outputs nothing from its
  removal on; its held matches are dropped).
"""
import dataclasses
import random

import pytest

from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from dqcep.core.events import Event
from dqcep.lang import ast, parse
from dqcep.lang.printer import file_to_source
from dqcep.plan import build_plan
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.runtime import Engine, MatchBatch
from dqcep.plan.joins import MATERIALIZE_MODES
from dqcep.runtime.adapt import AdaptiveEngine
from dqcep.runtime.live import change_queries
from dqcep.runtime.program import Program
from tests.support.strategies import (kleene_event_streams, kleene_queries, negation_queries,
                              small_event_streams, small_query_files, strategy_queries)
from tests.support.engines import as_set
from tests.support.examples import examples
from tests.support.paths import ROOT


def renamed(q: ast.Query, name: str) -> ast.Query:
    return dataclasses.replace(q, name=name)


@st.composite
def live_cases(draw):
    """(queries, events, batch bounds, history): history[name] = (added at batch i or
    None for the start, removed at batch j or None)."""
    qs = list(parse(file_to_source(draw(small_query_files()))).queries)
    family = draw(st.sampled_from(["kleene", "strategy", "negation", "none"]))
    if family == "kleene":
        qs.append(renamed(draw(kleene_queries()), "extra"))
        events = draw(kleene_event_streams())
    elif family == "strategy":
        qs.append(renamed(draw(strategy_queries()), "extra"))
        events = draw(small_event_streams(max_events=16))
    elif family == "negation":
        qs.append(renamed(draw(negation_queries()), "extra"))
        events = draw(small_event_streams(max_events=16))
    else:
        events = draw(small_event_streams(max_events=16))
    qs = [dataclasses.replace(q, name=f"q{i}",  # names unique; a policy sometimes
                              after_match=draw(st.none() | st.sampled_from(ast.POLICIES)))
          for i, q in enumerate(qs)]
    events = sorted(events, key=lambda e: (e.ts, e.id))
    n_batches = draw(st.integers(1, 5))
    bounds = sorted({0, len(events), *draw(st.lists(st.integers(0, len(events)),
                                                    min_size=n_batches - 1,
                                                    max_size=n_batches - 1))})
    batches = len(bounds) - 1
    history = {}
    for q in qs:
        # added before batch i (1 <= i <= batches: the last, after every batch), removed
        # before a later one
        added = draw(st.none() | st.integers(1, batches)) if batches else None
        first = (added or 0) + 1
        removed = draw(st.none() | st.integers(first, batches)) if first <= batches else None
        history[q.name] = (added, removed)
    history[qs[0].name] = (None, None)  # the engine always runs some query
    # each batch arrives shuffled (its events out of ts order within the lateness that
    # covers it): an event that came before a query may lie between two after it
    seed = draw(st.none() | st.integers(0, 9))
    if seed is not None:
        rnd = random.Random(seed)
        batches = [events[a:b] for a, b in zip(bounds, bounds[1:])]
        for b in batches:
            rnd.shuffle(b)
        events = [e for b in batches for e in b]
    return qs, events, bounds, history


def lateness_of(events, bounds) -> int:
    """The lateness that covers each batch's disorder (the batches are in ts order)."""
    spans = [max(e.ts for e in events[a:b]) - min(e.ts for e in events[a:b])
             for a, b in zip(bounds, bounds[1:]) if b > a]
    return max(spans, default=0)


def live_at(qs, history, i):
    """The queries live for batch ``i``, in the file's order."""
    added = {q.name: -1 if history[q.name][0] is None else history[q.name][0] for q in qs}
    return [q for q in qs if added[q.name] <= i and
            (history[q.name][1] is None or history[q.name][1] > i)]


def run_live(qs, events, bounds, history, snapshot_at=None, materialize="always",
             adaptive=False):
    """The matches per query of one engine whose query set changes at the batch
    boundaries ``history`` says (a snapshot and restore before batch ``snapshot_at``),
    planned with ``materialize``; ``adaptive``: an ``AdaptiveEngine`` (the service's),
    which moves its switchable queries between joins and a chain at random batches."""
    live = live_at(qs, history, -1)  # those of the start
    epochs: dict[str, int] = {}
    lateness = lateness_of(events, bounds)
    rnd = random.Random(len(events))
    if adaptive:
        engine = AdaptiveEngine(live, materialize=materialize, lateness=lateness, adapt=False)
    else:
        engine = Engine(build_plan(live, materialize=materialize), lateness)
    out: dict[str, set] = {q.name: set() for q in qs}

    def take(batch):
        for m in batch.to_matches():
            key = (m.query, m.events, m.detected_at)
            assert key not in out[m.query], "a match was emitted twice"
            out[m.query].add(key)
    batches = [events[a:b] for a, b in zip(bounds, bounds[1:])]
    for i in range(len(batches) + 1):
        now = live_at(qs, history, i)
        if [q.name for q in now] != [q.name for q in live]:
            for q in now:
                if q not in live:
                    epochs[q.name] = i + 1  # any number of its own
            engine = change_queries(engine, now, epochs, materialize=materialize)
            live = now
        if snapshot_at == i:  # a restart: the program built again from the query set,
            # the epochs and (after a change) the universe: what a checkpoint holds
            universe = engine.program.based_on and engine.program.universe
            if adaptive:
                second = AdaptiveEngine(live, materialize=materialize, adapt=False,
                                        epochs=epochs, universe=universe or None,
                                        constructions=engine.overrides)
            else:
                second = Engine(Program(build_plan(
                    live, materialize=materialize, types=universe.types if universe else (),
                    epochs=epochs), universe))
            second.restore(engine.snapshot())
            engine = second
        if adaptive:  # a move at random: the same matches
            for name, now in engine.constructions.items():
                if rnd.random() < 0.3:
                    engine.switch(name, "chain" if now == "joins" else "joins")
        if i < len(batches):
            take(engine.process(batches[i]))
    take(engine.flush())
    return out


def expected(qs, events, bounds, history):
    out, before = {}, 0
    for q in qs:
        added, removed = history[q.name]
        start = bounds[added] if added is not None else 0
        if removed is None:
            out[q.name] = as_set(ReferenceMatcher([q]).run(events[start:]))
        else:  # alone on its slice, without the end of the stream
            engine = Engine(build_plan([q]), lateness_of(events, bounds))
            got = MatchBatch(engine.match_queries)
            for a, b in zip(bounds[added or 0:removed], bounds[(added or 0) + 1:removed + 1]):
                got += engine.process(events[a:b])
            out[q.name] = as_set(got.to_matches())
        if added is not None:  # steer to the matches an added query must not have
            before += len(as_set(ReferenceMatcher([q]).run(events)) - out[q.name])
    target(float(before), label="matches from before an addition")
    return out


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(live_cases(), st.none() | st.integers(0, 5), st.sampled_from(MATERIALIZE_MODES),
       st.booleans())
def test_queries_added_and_removed_live_match_their_slices(case, restart, materialize,
                                                           adaptive):
    """Under every materialization (a shared join that the set after a change no
    longer shares may be built on demand then), on a plain and an adaptive engine."""
    qs, events, bounds, history = case
    assert run_live(qs, events, bounds, history, restart, materialize, adaptive) == \
        expected(qs, events, bounds, history)


def ev(i, etype, ts, **attrs):
    return Event(i, etype, ts, attrs)


def matches_of(engine_batches):
    return {(m.query, tuple(i for _, i in m.events)) for b in engine_batches
            for m in b.to_matches()}


def test_a_shared_partial_match_from_before_an_addition_is_not_the_new_querys():
    """q1 shares q0's SEQ vertex and its partial match (A1): A1 came before q1, so
    (A1, B2) is q0's alone; (A3, B4) is both's."""
    q0, q1 = parse("QUERY q0 PATTERN SEQ(A a, B b) WITHIN 10 ms;\n"
                   "QUERY q1 PATTERN SEQ(A x, B y) WITHIN 10 ms").queries
    engine = Engine(build_plan([q0]))
    out = [engine.process([ev(1, "A", 1)])]
    engine = change_queries(engine, [q0, q1], {"q1": 1})
    assert engine.program.plan.n_vertices == 5  # A, B, SEQ shared; an OUTPUT each
    out += [engine.process([ev(2, "B", 2), ev(3, "A", 3), ev(4, "B", 4)]), engine.flush()]
    assert matches_of(out) == {("q0", (1, 2)), ("q0", (1, 4)), ("q0", (3, 4)),
                               ("q1", (3, 4))}


@pytest.mark.parametrize("pattern", [
    "SEQ(A a, NOT C c, B b) WITHIN 10 ms",                       # C2 would negate
    "SEQ(A a, B b) WITHIN 10 ms USING strict-contiguity"])       # C2 would break the run
def test_an_event_from_before_an_addition_neither_negates_nor_breaks_a_new_querys_run(
        pattern):
    """C2 arrived before q1 and lies between A1 and B3, which came after (within the
    lateness): it negates q0's (A1, B3), or breaks q0's strictly contiguous run, not
    q1's: q1's NOT and RUN vertices are its own and take in no earlier event."""
    q0, q1 = parse(f"QUERY q0 PATTERN {pattern};\nQUERY q1 PATTERN {pattern}").queries
    engine = Engine(build_plan([q0]), lateness=5)
    out = [engine.process([ev(2, "C", 2)])]
    engine = change_queries(engine, [q0, q1], {"q1": 1})
    out += [engine.process([ev(1, "A", 1), ev(3, "B", 3)]), engine.flush()]
    assert matches_of(out) == {("q1", (1, 3))}


def test_a_removed_query_says_nothing_more_and_its_vertices_are_freed():
    """q1's held match (a trailing NOT waits) is dropped with it; the vertices only it
    read are gone and their state with them; q0 goes on."""
    q0, q1 = parse("QUERY q0 PATTERN SEQ(A a, B b) WITHIN 10 ms;\n"
                   "QUERY q1 PATTERN SEQ(A a, D d, NOT C c) WITHIN 10 ms").queries
    engine = Engine(build_plan([q0, q1]))
    out = [engine.process([ev(1, "A", 1), ev(2, "D", 2)])]
    assert engine.query_state_bytes()["q1"] > 0
    engine = change_queries(engine, [q0], {})
    assert engine.program.plan.n_vertices == 4 and "q1" not in engine.query_state_bytes()
    out += [engine.process([ev(3, "B", 3), ev(30, "A", 30)]), engine.flush()]
    assert matches_of(out) == {("q0", (1, 3))}


def test_a_removed_querys_attributes_leave_the_stored_events():
    """Issue 49 item 13: every attribute a query ever named stayed a column of every
    stored event (150 add/remove cycles of the same 3 queries: state 0.56 -> 5.8 MB).
    After cycles of queries reading attributes of their own, the engine holds the
    columns its running queries read, and the state a fresh engine of them holds on
    the same events."""
    base = list(parse("QUERY keep PATTERN SEQ(A a, B b) WHERE [k] AND a.v < b.v "
                      "WITHIN 50").queries)
    events = [ev(i + 1, "AB"[i % 2], i, k=i % 3, v=i % 7, **{f"w{j}": i for j in range(6)})
              for i in range(3300)]
    engine, fresh = Engine(build_plan(base)), Engine(build_plan(base))
    sizes = []
    for cycle in range(30):
        part = events[cycle * 100:(cycle + 1) * 100]
        k = cycle % 6
        added = list(parse(f"QUERY x PATTERN SEQ(A a, B b) WHERE a.w{k} > b.w{(k + 1) % 6} "
                           "WITHIN 20").queries)
        engine = change_queries(engine, base + added, {"x": cycle + 1})
        engine.process(part[:50])
        engine = change_queries(engine, base, {})
        engine.process(part[50:])
        fresh.process(part)
        sizes.append(len(engine.snapshot()))
    assert sorted(engine.program.attrs) == sorted(fresh.program.attrs) == ["k", "v"]
    assert engine.state.store.nbytes == fresh.state.store.nbytes
    assert max(sizes[5:]) <= 1.1 * sizes[5]
    assert matches_of([engine.process(events[3000:]), engine.flush()]) == \
        matches_of([fresh.process(events[3000:]), fresh.flush()])


def test_strings_the_engine_held_at_a_change_are_freed_later():
    """Issue 49 item 13: a change pinned every string the engine held then as if it
    were a query's constant (300 add/remove cycles over events with a string of their
    own each: 72,000 strings never freed, the checkpoint 7.5 KB -> 715 KB). Only the
    running queries' constants stay pinned; the rest is swept as without changes, the
    constants mean what they did, and the matches are a fresh engine's."""
    base = list(parse("QUERY keep PATTERN SEQ(A a, B b) WHERE [k] AND a.tag != b.tag "
                      "WITHIN 50").queries)
    added = list(parse("QUERY x PATTERN SEQ(A a, B b) WHERE a.tag = 'zz' WITHIN 20"
                       ).queries)
    events = [ev(i + 1, "AB"[i % 2], i, k=f"room{i % 3}", tag="zz" if i % 50 == 0 else
                 f"msg-{i}") for i in range(60_300)]
    engine, fresh = Engine(build_plan(base)), Engine(build_plan(base))
    sizes, got, want = [], [], []
    for cycle in range(200):
        part = events[cycle * 300:(cycle + 1) * 300]
        engine = change_queries(engine, base + added, {"x": cycle + 1})
        got.append(engine.process(part[:150]))
        engine = change_queries(engine, base, {})
        got.append(engine.process(part[150:]))
        want.append(fresh.process(part))
        sizes.append(len(engine.snapshot()))
    assert len(engine.state.dictionary) < 3 * len(fresh.state.dictionary) + 100
    assert max(sizes[100:]) < 2 * max(sizes[:20])
    got += [engine.process(events[60_000:]), engine.flush()]
    want += [fresh.process(events[60_000:]), fresh.flush()]
    assert {m for m in matches_of(got) if m[0] == "keep"} == matches_of(want)
    assert any(m[0] == "x" for m in matches_of(got))  # its constant 'zz' still matches


def test_a_change_text_that_ends_in_a_comment_is_read_as_written():
    """Issue 49 item 19: a live text ending with a ``--`` comment took the ";" the
    service adds into the comment, and was refused with an error about the service's
    own EVENT line."""
    from dqcep.service.changes import QuerySet, requested_change
    base = parse("EVENT Door(open BOOL);\nQUERY d PATTERN Door x WITHIN 1 s;")
    qs = QuerySet(list(base.queries), {}, base.schemas, base.tables)
    for text in ("QUERY a PATTERN SEQ(Door x, Door y) WITHIN 1 s -- the last line",
                 "QUERY a PATTERN SEQ(Door x, Door y) WITHIN 1 s; -- note\n-- more\n",
                 "QUERY a PATTERN SEQ(Door x, Door y)\nWITHIN 1 s\n"):
        op, _, names, new, _ = requested_change("POST", "/queries", text.encode(), qs)
        assert (op, names, new.names) == ("add", ["a"], ["d", "a"]), text


def test_an_unnamed_query_of_a_change_is_named_once_and_kept_by_every_reader():
    """Issue 49 item 19: an unnamed query of a change was named ``q1`` by its place in
    the text, a clash with the service's own unnamed ``q1``. It is named ``qK``, the
    first K from its place that nothing runs, in the journaled text: a replay, a
    checkpoint (also after the queries before it went) and a worker's query file read
    the same name."""
    from dqcep.service.changes import QuerySet, read_control, requested_change
    base = parse("EVENT Door(open BOOL);\nPATTERN Door x WITHIN 1 s;\n"
                 "QUERY q2 PATTERN Door x WITHIN 1 s;")
    qs = QuerySet(list(base.queries), {}, base.schemas, base.tables)
    text = "PATTERN SEQ(Door x, Door y) WITHIN 1 s;\n  pattern Door z WITHIN 1 s -- two"
    op, record, names, new, _ = requested_change("POST", "/queries", text.encode(), qs)
    assert (names, new.names) == (["q3", "q4"], ["q1", "q2", "q3", "q4"])
    replayed, replayed_names = qs.after(read_control(record), 7)
    assert (replayed.names, replayed_names) == (new.names, names)
    # the queries before them removed: a checkpoint's set parses the same two names
    later = replayed.without("q1").without("q2")
    restored = QuerySet.from_obj(later.to_obj(), qs, "ck")
    assert restored.names == ["q3", "q4"]
    assert [q.pattern for q in restored.queries] == [q.pattern for q in later.queries]
    # a worker hosting q4 parses its query file (the text and the declarations) alone
    worker_file = parse(qs.with_declarations(read_control(record)["text"]))
    assert [q.name for q in worker_file.queries] == ["q3", "q4"]
    # a second such change goes on from there; a name the text gives is its own
    _, _, names, _, _ = requested_change("POST", "/queries",
                                      b"QUERY q9 PATTERN Door a WITHIN 1 s;\n"
                                      b"PATTERN Door b WITHIN 1 s", new)
    assert names == ["q9", "q5"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_query_files(max_queries=3), st.lists(st.booleans(), min_size=3, max_size=3),
       st.booleans())
def test_a_change_is_parsed_once_into_the_queries_its_named_text_parses_to(
        file, unnamed, one_line):
    """``QuerySet.named`` parses a request's text once and names its unnamed queries
    in the AST: the queries are those a parse of the journaled (named) text gives,
    positions included (a plan pickles them: a checkpoint's fingerprint), whether the
    queries stand on lines of their own or share one."""
    import pickle
    from dqcep.service.changes import QuerySet
    qs = QuerySet(list(parse("QUERY q1 PATTERN A x WITHIN 1 ms").queries))
    texts = [file_to_source(ast.QueryFile("<t>", (q,))).strip().replace("\n", " ")
             for q in file.queries]
    texts = [t.split(" ", 2)[2] if drop else t for t, drop in zip(texts, unnamed)]
    text = (" " if one_line else "\n").join(texts)
    named, queries = qs.named(text)
    again = parse(qs.with_declarations(named)).queries
    assert [q.name for q in queries] == [q.name for q in again]
    assert pickle.dumps(tuple(queries)) == pickle.dumps(again), named


def test_a_posted_query_is_parsed_once(monkeypatch):
    """Checked, journaled and applied, a POSTed query is parsed once: the request's
    parse is what the set after it runs (a replay, which has only the journal, parses
    the text)."""
    from dqcep.service import changes
    from dqcep.service.changes import QuerySet, read_control, requested_change
    qs = QuerySet(list(parse("EVENT Door(open BOOL);\nQUERY d PATTERN Door x WITHIN 1 s"
                             ).queries), {}, parse("EVENT Door(open BOOL);\n"
                                                   "PATTERN Door x WITHIN 1 s").schemas)
    calls = []
    real = changes.parse
    monkeypatch.setattr(changes, "parse", lambda *a, **k: calls.append(a) or real(*a, **k))
    change = requested_change("POST", "/queries", b"PATTERN SEQ(Door x, Door y) WITHIN 1 s",
                              qs)
    new, names = qs.after(read_control(change.payload), 7, change.added)
    assert len(calls) == 1 and names == ["q1"] and new.names == ["d", "q1"]
    assert new.epochs["q1"] == 8 and new.queries[-1] is change.added[0]
    replayed, _ = qs.after(read_control(change.payload), 7)  # from the journal alone
    assert len(calls) == 2 and replayed.queries == new.queries


def test_a_change_over_http_is_checked_against_the_set_the_journal_leads_to(tmp_path,
                                                                            monkeypatch):
    """Issue 49 item 15: while a restart replayed the journal, a change was checked
    against the checkpoint's set (a duplicate add answered 200 applied, then dead-
    lettered), and "applied" was answered once the control record was read, before the
    new set ran (``running`` listed the old one)."""
    import threading
    import time as clock
    from dqcep.io.journal import Journal
    from dqcep.service.changes import CONTROL_TOPIC, control_record
    from dqcep.service.streaming import ServiceConfig, StreamingService
    queries = ROOT / "dqcep" / "data" / "iot.cep"
    added = "QUERY later\nPATTERN SEQ(Door x, Motion y)\nWHERE [room]\nWITHIN 10 s\n"
    journal = Journal(tmp_path / "journal")
    journal.append(CONTROL_TOPIC, control_record("add", text=added), 1)
    journal.commit()
    journal.close()
    cfg = ServiceConfig(queries=str(queries), inputs=["mqtt://127.0.0.1:9/x"],
                        journal=str(tmp_path / "journal"),
                        checkpoint=str(tmp_path / "ck.bin"), output=str(tmp_path / "o.jsonl"),
                        dead_letter=str(tmp_path / "dead.jsonl"),
                        late=str(tmp_path / "late.jsonl"))
    svc = StreamingService(cfg)

    class Source:  # the MQTT source's journal_record, into the service's own journal
        def journal_record(self, topic, payload):
            offset = svc.journal.append(topic, payload, 2)
            svc.journal.commit()
            return offset
    svc.source = Source()

    def stepped(*request):
        """A change over HTTP, taken by the service's thread (here) at its next step."""
        answers = []
        asking = threading.Thread(target=lambda: answers.append(svc.http_change(*request)))
        asking.start()
        while svc.mailbox.empty() and asking.is_alive():
            clock.sleep(0.01)
        while asking.is_alive():
            svc.step()
            clock.sleep(0.05)
        return answers[0]
    # the add is journaled, not yet replayed: a second one is refused, no record written
    code, answer = stepped("POST", "/queries", added.encode())
    assert code == 400 and "runs a query 'later' already" in answer["error"], answer
    assert svc.journal.durable_offset == 1
    # a removal of it is taken; "applied" only once the set without it runs
    slow = AdaptiveEngine.change_queries  # the service's engine changes its queries

    def slow_change(*args, **kwargs):
        clock.sleep(0.5)
        return slow(*args, **kwargs)
    monkeypatch.setattr(AdaptiveEngine, "change_queries", slow_change)
    code, answer = stepped("DELETE", "/queries/later", b"")
    assert code == 200 and answer["applied"] and "later" not in answer["running"], answer
    assert svc.query_set.names == answer["running"]
    svc.close()


def test_the_change_mailbox_answers_what_its_runner_did():
    """The HTTP side waits on the mailbox; the thread that runs the queries answers:
    a request it never takes is 503 and can no longer be taken (nothing journaled),
    one journaled but not applied in time is 202 with the set before it, one applied
    is its runner's answer."""
    import threading
    from dqcep.service.changes import Change, ChangeMailbox
    box = ChangeMailbox(wait=0.2)
    code, answer = box.request("POST", "/queries", b"x")
    assert code == 503 and "nothing was journaled" in answer["error"], answer
    assert box.take() is None  # given up: the runner never journals it

    def run(then):
        while (req := box.take()) is None:
            pass
        assert (req.method, req.path, req.body) == ("DELETE", "/queries/b", b"")
        req.journaled_at(7, Change("remove", b"", ["b"], None, []), ["a", "b"])
        then(req)
    runner = threading.Thread(target=run, args=(lambda req: None,))
    runner.start()
    code, answer = box.request("DELETE", "/queries/b", b"")
    runner.join()
    assert (code, answer) == (202, {"op": "remove", "queries": ["b"], "journal_offset": 7,
                                    "applied": False, "running": ["a", "b"]})
    runner = threading.Thread(target=run, args=(lambda req: req.applied(["b"], ["a"]),))
    runner.start()
    code, answer = box.request("DELETE", "/queries/b", b"")
    runner.join()
    assert (code, answer) == (200, {"op": "remove", "queries": ["b"], "journal_offset": 7,
                                    "applied": True, "running": ["a"]})


SHARED_JOIN = """
QUERY q1 PATTERN SEQ(A a, B b, C c) WHERE a.p < b.p WITHIN 50 ms;
QUERY q2 PATTERN SEQ(A a, B b) WHERE a.p < b.p WITHIN 50 ms;
"""


@pytest.mark.parametrize("materialize", ["on-demand", "auto"])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("change", ["add", "remove"])
def test_a_join_built_otherwise_after_a_change_is_rebuilt_and_loses_nothing(
        materialize, adaptive, change):
    """q1's SEQ(A, B) is built on demand while q1 runs alone and kept as records while
    q2 shares it: adding or removing q2 halfway changes how the running vertex is
    built. q1 loses no match across the change (its SEQ(A, B) state rebuilt from the
    stored events); q2 has its slice's."""
    q1, q2 = parse(SHARED_JOIN).queries
    rnd = random.Random(7)
    events = [ev(i, rnd.choice("ABC"), i // 2, p=rnd.randrange(5)) for i in range(1, 400)]
    half = len(events) // 2
    before, after = ([q1], [q1, q2]) if change == "add" else ([q1, q2], [q1])
    if adaptive:
        engine = AdaptiveEngine(before, materialize=materialize, adapt=False)
    else:
        engine = Engine(build_plan(before, materialize=materialize))
    built = list(engine.plan.on_demand)
    out = matches_of([engine.process(events[:half])])
    engine = change_queries(engine, after, {"q2": 1} if change == "add" else {},
                            materialize=materialize)
    assert list(engine.plan.on_demand) != built  # the vertex is built otherwise now
    out |= matches_of([engine.process(events[half:]), engine.flush()])
    assert {m for m in out if m[0] == "q1"} == \
        {m for m in matches_of_ref([q1], events)}
    want_q2 = matches_of_ref([q2], events[half:] if change == "add" else [])
    if change == "add":
        assert {m for m in out if m[0] == "q2"} == want_q2 and want_q2


def matches_of_ref(queries, events):
    return {(m.query, tuple(i for _, i in m.events))
            for m in ReferenceMatcher(queries).run(events)}
