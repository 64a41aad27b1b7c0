"""The lint for negated events an ``[attr]`` does not reach (spec section 4: ``[attr]``
never constrains negated events)."""
import pytest

from dqcep.lang import parse
from dqcep.lang.check import untied_negations


def warnings(text):
    parsed = parse(text)
    (q,) = parsed.queries
    schemas = {s.type: s for s in parsed.schemas}
    return [(m, (p.line, p.col)) for m, p in untied_negations(q, schemas)]


@pytest.mark.parametrize("where", [
    "[device] AND c.device = o.device",
    "[device] AND o.device = c.device AND c.contact = true",
    "c.contact = true",                      # no [attr]: nothing to reach
    "([device] OR o.x = 1) AND c.contact = true",  # [attr] not a top-level conjunct
])
def test_no_warning_when_tied_or_nothing_to_reach(where):
    assert warnings(f"PATTERN SEQ(Door o, NOT Door c) WHERE {where} WITHIN 5 min") == []


def test_each_negated_variable_an_attr_does_not_reach_is_named_at_its_place():
    text = ("QUERY q PATTERN SEQ(Door o, NOT Door c, Light m, NOT (SEQ(Light a, Light b)))\n"
            "WHERE [room] AND [device] AND c.device = o.device AND a.room = m.room "
            "AND b.room = c.room WITHIN 5 min")
    got = warnings(text)
    # c: tied by device, not by room; a: tied by room (to m), not by device; b: by
    # neither (b.room = c.room ties it to a negated variable, not to the match)
    assert [(m.split(" does not reach the negated ")[1].split(":")[0],
             m.split(": ")[2].split(" ")[0], pos) for m, pos in got] == [
        ("Door c", "[room]", (1, 33)), ("Light a", "[device]", (1, 59)),
        ("Light b", "[room]", (1, 68)), ("Light b", "[device]", (1, 68))]
    assert got[0][0] == ("warning: query q: [room] does not reach the negated Door c: a Door "
                         "of any room rules a match out; to tie it, add c.room = o.room")


def test_a_negated_event_of_another_kind_is_named_only_when_declared_with_the_attribute():
    query = "PATTERN SEQ(Temperature t, NOT Rain r, Smoke s) WHERE [room] WITHIN 1 min"
    assert warnings(query) == []  # a weather station's rain may be meant for every room
    declared = "EVENT Rain(room STRING, mm DOUBLE);\n" + query
    assert [pos for _, pos in warnings(declared)] == [(2, 32)]
