"""Lookups (``table(v.attr).column``, the Select operator) as engine attributes.

The value of a lookup depends on one event only (the one whose attribute is the
key) and on the table's snapshot, so every engine reads it as an attribute of
that event: ``rooms(t.room).threshold`` becomes ``t.<rooms(room).threshold>``, an
attribute no event can carry by itself (its name is no identifier), filled at
ingest from the snapshot the batch sees (``dqcep.runtime.lookups``). Pushdown,
join predicates, Kleene conditions and aggregates then treat it as any other.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from dqcep.lang import ast


@dataclass(frozen=True)
class LookupColumn:
    """An engine attribute filled from a lookup table: for every event, ``column`` of
    the row of ``table`` whose key is the event's attribute ``key`` (ts and id are the
    event's own fields)."""

    attr: str       # the engine attribute's name: ast.lookup_attribute(table, key, column)
    table: str
    key: str
    column: str


def resolve_lookups(q: ast.Query) -> tuple[ast.Query, tuple[LookupColumn, ...]]:
    """The query with every lookup of its condition read as the attribute it fills,
    and those attributes. (RETURN items keep their lookups: their values come from
    the remembered events, ``dqcep.runtime.returns``.)"""
    found: dict[str, LookupColumn] = {}

    def rewrite(e: ast.Expr) -> ast.Expr:
        if isinstance(e, ast.Lookup):
            attr = ast.lookup_attribute(e.table, e.key.attr, e.column)
            found.setdefault(attr, LookupColumn(attr, e.table, e.key.attr, e.column))
            return ast.AttrRef(e.key.var, attr, e.pos, e.key.index)
        if isinstance(e, ast.Unary):
            return dataclasses.replace(e, operand=rewrite(e.operand))
        if isinstance(e, ast.Binary):
            return dataclasses.replace(e, left=rewrite(e.left), right=rewrite(e.right))
        return e
    if q.where is None:
        return q, ()
    where = rewrite(q.where)
    return (dataclasses.replace(q, where=where) if found else q), tuple(found.values())


def resolve_all(queries, tables: Mapping[str, ast.LookupTable] | None = None
                ) -> tuple[list[ast.Query], tuple[LookupColumn, ...]]:
    """``resolve_lookups`` over a file's queries: the queries and every lookup column
    once. ``tables`` (by name), if given, must declare every table named."""
    out, columns = [], {}
    for q in queries:
        rq, cols = resolve_lookups(q)
        out.append(rq)
        for c in cols:
            if tables is not None and c.table not in tables:
                raise ValueError(f"query {q.name} reads table {c.table!r}, not declared")
            columns.setdefault(c.attr, c)
    return out, tuple(columns.values())
