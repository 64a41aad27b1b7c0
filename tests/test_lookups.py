"""Lookups (``table(v.attr).column``, the Select operator) on every engine.

The differential tests of issue 20: a query whose constants are read from a lookup
table (keyed by event id, a row for every id) finds what the same query with the
constants written out finds, on the native engine (both materializations), the SASE
baseline and the reference matcher; and with tables that lack rows and keys of
every kind, the engines agree with the reference's reading of the rule
(``dqcep.tables``)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dqcep.baseline import SaseEngine
from dqcep.events import Event
from dqcep.lang import QueryError, ast, file_to_source, parse
from dqcep.plan import build_plan
from dqcep.reference import ReferenceMatcher
from dqcep.runtime import Engine
from dqcep.tables import StaticTables, snapshot_of
from tests.strategies import ATTR_VALUES, outside_sase, small_event_streams, small_query_files
from tests.test_native import CUTS, MATERIALIZE, as_set, split

LITERALS = (ast.Number, ast.String, ast.Boolean)
TYPE_OF = {ast.Number: ast.DOUBLE, ast.String: ast.STRING, ast.Boolean: ast.BOOL}


def _and(parts):
    out = parts[0]
    for p in parts[1:]:
        out = ast.Binary("AND", out, p)
    return out


def read_from_table(draw, f: ast.QueryFile, key: str, key_type: str):
    """The file with some of its literals (in conjuncts naming a variable) replaced by
    lookups ``consts(v.<key>).cN``; returns the file, the table's declaration and the
    columns' values (column name -> the literal it stands for)."""
    values: dict[str, object] = {}
    columns: list[ast.SchemaAttr] = []

    def lookup(lit, var):
        name = f"c{len(columns)}"
        columns.append(ast.SchemaAttr(name, TYPE_OF[type(lit)]))
        values[name] = lit.value
        return ast.Lookup("consts", ast.AttrRef(var, key), name)

    def rewrite(e, vars_):
        if isinstance(e, LITERALS) and draw(st.booleans()):
            return lookup(e, draw(st.sampled_from(vars_)))
        if isinstance(e, ast.Unary):
            return dataclasses.replace(e, operand=rewrite(e.operand, vars_))
        if isinstance(e, ast.Binary):
            return dataclasses.replace(e, left=rewrite(e.left, vars_),
                                       right=rewrite(e.right, vars_))
        return e
    queries = []
    for q in f.queries:
        parts = []
        for c in ast.conjuncts(q.where):
            vars_ = sorted(ast.expr_vars(c))
            parts.append(rewrite(c, vars_) if vars_ else c)
        queries.append(dataclasses.replace(q, where=_and(parts)) if parts else q)
    assume(columns)
    table = ast.LookupTable("consts", (ast.SchemaAttr("k", key_type), *columns), "k",
                            "sqlite:///consts.db")
    return ast.QueryFile(f.source, tuple(queries), f.schemas, (table,)), table, values


def engines_agree(parsed, events, source, cuts):
    """Every engine's matches over the events (in batches), the reference's first."""
    queries, tables = parsed.queries, parsed.tables
    expected = as_set(ReferenceMatcher(queries, (), tables, source).run(events))
    batches = split(events, cuts)
    for materialize in MATERIALIZE:
        engine = Engine(build_plan(queries, materialize=materialize, tables=tables),
                        lookup_source=source)
        out = engine.process([])
        for b in batches:
            out += engine.process(b)
        out += engine.flush()
        assert as_set(out.to_matches()) == expected, materialize
    if not any(map(outside_sase, queries)):
        engine = SaseEngine(queries, tables=tables, lookup_source=source)
        out = engine.process([])
        for b in batches:
            out += engine.process(b)
        out += engine.flush()
        assert as_set(out.to_matches()) == expected, "sase"
    return expected


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), small_query_files(), small_event_streams(), CUTS)
def test_constants_read_from_a_table_match_as_the_constants_do(data, f, events, cuts):
    with_table, table, values = read_from_table(data.draw, f, "id", ast.INT)
    try:
        parsed = parse(file_to_source(with_table))
    except QueryError as err:  # every literal's kind is its column's: it must parse
        raise AssertionError(f"{err}\n{file_to_source(with_table)}") from None
    rows = [(i, *values.values()) for i in range(1, len(events) + 1)]
    source = StaticTables({"consts": snapshot_of(table, rows)})
    with_constants = as_set(ReferenceMatcher(f.queries).run(events))
    assert engines_agree(parsed, events, source, cuts) == with_constants


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data(), small_query_files(), small_event_streams(), CUTS,
       st.sampled_from(ast.ATTRIBUTE_TYPES))
def test_tables_with_missing_rows_and_odd_keys_are_read_alike(data, f, events, cuts,
                                                              key_type):
    """Keyed by the attribute p (numbers, fractions, booleans, strings, or absent), a
    row for only some keys, the cells sometimes NULL: every engine reads the rule as
    the reference does."""
    with_table, table, values = read_from_table(data.draw, f, "p", key_type)
    parsed = parse(file_to_source(with_table))
    keys = data.draw(st.lists(ATTR_VALUES, unique_by=repr, max_size=6))
    rows = [(k, *(data.draw(st.sampled_from([v, None])) for v in values.values()))
            for k in keys]
    engines_agree(parsed, events, StaticTables({"consts": snapshot_of(table, rows)}), cuts)


KEYS = [1, 1.0, 2, 0.5, True, False, "x", "1", None]  # p of events 1..9 (None: absent)


@pytest.mark.parametrize("key_type, rows, found", [
    (ast.INT, [(1, 1), (2, 5), (0.5, 1), ("1", 1)], {1, 2}),
    (ast.DOUBLE, [(0.5, 1), (1.0, 1), (True, 1)], {1, 2, 4}),
    (ast.STRING, [("x", 1), ("1", 1), (1, 1)], {7, 8}),
    (ast.BOOL, [(True, 1), (1, 1), (False, None)], {5}),
])
def test_a_key_finds_its_row_by_the_key_column_type(key_type, rows, found):
    """The rule, spelled out: a number is itself whatever its form (1 = 1.0), a key of
    another kind finds nothing (1 is no boolean, '1' no number), a NULL cell is
    missing; rows whose key does not fit the key type are never found."""
    parsed = parse(f"TABLE consts(k {key_type}, c0 INT) KEY k FROM 'sqlite:///x.db'; "
                   "QUERY q PATTERN A a WHERE consts(a.p).c0 = 1 WITHIN 10")
    events = [Event(i, "A", i, {} if p is None else {"p": p}) for i, p in enumerate(KEYS, 1)]
    source = StaticTables({"consts": snapshot_of(parsed.tables[0], rows)})
    got = engines_agree(parsed, events, source, cuts=(3, 6))
    assert {dict(events_)["a"] for _, events_, _ in got} == found
