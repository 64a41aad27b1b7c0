"""The plan preserves the spec: executing it gives the reference matcher's matches.

Hypothesis draws query files (often with shared sub-patterns) and small event
streams; the naive plan executor and the reference matcher must agree match for
match, detected_at included.
"""
from hypothesis import HealthCheck, given, settings

from dqcep.lang import file_to_source, parse
from dqcep.plan import build_plan
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.plan_executor import execute
from dqcep.lang import ast
from tests.support.strategies import negation_queries, small_event_streams, small_query_files
from tests.support.examples import examples
from tests.support.paths import ROOT


def as_set(matches):
    out = [(m.query, m.events, m.detected_at) for m in matches]
    assert len(out) == len(set(out)), "a match was emitted twice"
    return set(out)


def check(queries, events):
    expected = as_set(ReferenceMatcher(queries).run(events))
    got = as_set(execute(build_plan(queries), events))
    assert got == expected


@settings(max_examples=examples(600), deadline=None, suppress_health_check=list(HealthCheck))
@given(small_query_files(), small_event_streams())
def test_plan_matches_reference(f, events):
    # the file goes through text, as a user's would
    check(parse(file_to_source(f)).queries, events)


def test_examples_agree():
    import json
    from dqcep.core.events import event_from_mapping

    root = ROOT / "examples"
    queries = parse((root / "fire.cep").read_text()).queries
    events = [event_from_mapping(json.loads(x))
              for x in (root / "fire-events.jsonl").read_text().splitlines()]
    check(queries, events)


@settings(max_examples=examples(500), deadline=None, suppress_health_check=list(HealthCheck))
@given(negation_queries(), small_event_streams())
def test_plan_matches_reference_on_negations(q, events):
    check(parse(file_to_source(ast.QueryFile("<t>", (q,)))).queries, events)
