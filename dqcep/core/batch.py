"""Columnar event batches: how events travel between the generator, readers and engines.

An ``EventBatch`` holds n events as numpy arrays: ``id`` (int64), ``ts`` (int64),
``type`` (int32 codes into ``schema.types``) and one column per attribute of the
schema. Column encodings, by attribute kind:

======  ========  ============================================
kind    dtype     missing value
======  ========  ============================================
float   float64   NaN
int     int64     ``MISSING_INT`` (the smallest int64)
str     int32     -1; other values index ``schema.dictionary(attr)``
bool    int8      -1; otherwise 0 or 1
======  ========  ============================================

``malformed`` (int8, optional) marks events that writers must corrupt on purpose
(the generator's robustness knob): 0 is a good event, see ``Malformed``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterable, Sequence

import numpy as np

from dqcep.core.events import Event

KINDS = ("float", "int", "str", "bool")
MISSING_INT = np.iinfo(np.int64).min
DTYPES = {"float": np.float64, "int": np.int64, "str": np.int32, "bool": np.int8}
MISSING = {"float": np.nan, "int": MISSING_INT, "str": -1, "bool": -1}


def missing_column(kind: str, n: int) -> np.ndarray:
    """A column of n missing values of an attribute kind."""
    return np.full(n, MISSING[kind], dtype=DTYPES[kind])


class Malformed(IntEnum):
    """How a writer corrupts an event marked malformed (spec section 1's malformed events)."""

    OK = 0
    NO_TYPE = 1       # the type field is left out
    BAD_TS = 2        # ts is written as a string
    UNDECODABLE = 3   # the record itself does not decode (broken JSON, wrong CSV row, non-map)


@dataclass(frozen=True)
class Schema:
    """Event types, attribute names and kinds, and the dictionaries of string attributes."""

    types: tuple[str, ...]
    attrs: tuple[tuple[str, str], ...]                        # (name, kind), in column order
    dictionaries: tuple[tuple[str, tuple[str, ...]], ...] = ()  # str attribute -> values

    def __post_init__(self):
        for name, kind in self.attrs:
            if kind not in KINDS:
                raise ValueError(f"attribute {name!r} has unknown kind {kind!r}")
            if name in ("id", "type", "ts"):
                raise ValueError(f"{name!r} is an event field, not an attribute")
        strs = {n for n, k in self.attrs if k == "str"}
        if strs != {n for n, _ in self.dictionaries}:
            raise ValueError("every str attribute needs a dictionary, and only those")

    def kind(self, attr: str) -> str:
        return dict(self.attrs)[attr]

    def dictionary(self, attr: str) -> tuple[str, ...]:
        return dict(self.dictionaries)[attr]

    def type_code(self, name: str) -> int:
        return self.types.index(name)


@dataclass
class EventBatch:
    schema: Schema
    id: np.ndarray
    ts: np.ndarray
    type: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    malformed: np.ndarray | None = None

    def __post_init__(self):
        n = len(self.id)
        for name, arr in (("ts", self.ts), ("type", self.type)):
            if len(arr) != n:
                raise ValueError(f"column {name} has {len(arr)} rows, id has {n}")
        for name, kind in self.schema.attrs:
            col = self.columns.get(name)
            if col is None:
                self.columns[name] = missing_column(kind, n)
            elif col.dtype != DTYPES[kind] or len(col) != n:
                raise ValueError(f"column {name} must be {np.dtype(DTYPES[kind])}[{n}], "
                                 f"got {col.dtype}[{len(col)}]")

    def __len__(self) -> int:
        return len(self.id)

    def present(self, attr: str) -> np.ndarray:
        col, kind = self.columns[attr], self.schema.kind(attr)
        if kind == "float":
            return ~np.isnan(col)
        return col != MISSING[kind]

    def take(self, index) -> "EventBatch":
        """Rows selected by a slice, an index array or a boolean mask."""
        return EventBatch(self.schema, self.id[index], self.ts[index], self.type[index],
                          {k: v[index] for k, v in self.columns.items()},
                          None if self.malformed is None else self.malformed[index])

    @staticmethod
    def empty(schema: Schema) -> "EventBatch":
        z64 = np.empty(0, dtype=np.int64)
        return EventBatch(schema, z64, z64.copy(), np.empty(0, dtype=np.int32))

    @staticmethod
    def concat(batches: Sequence["EventBatch"]) -> "EventBatch":
        batches = list(batches)
        schema = batches[0].schema
        if any(b.schema != schema for b in batches):
            raise ValueError("cannot concatenate batches with different schemas")
        mal = None
        if any(b.malformed is not None for b in batches):
            mal = np.concatenate([b.malformed if b.malformed is not None
                                  else np.zeros(len(b), np.int8) for b in batches])
        return EventBatch(schema, np.concatenate([b.id for b in batches]),
                          np.concatenate([b.ts for b in batches]),
                          np.concatenate([b.type for b in batches]),
                          {n: np.concatenate([b.columns[n] for b in batches])
                           for n, _ in schema.attrs}, mal)

    def value(self, attr: str, row: int):
        """The attribute's Python value in a row, or None when missing."""
        kind, v = self.schema.kind(attr), self.columns[attr][row]
        if kind == "float":
            return None if np.isnan(v) else float(v)
        if kind == "int":
            return None if v == MISSING_INT else int(v)
        if kind == "str":
            return None if v < 0 else self.schema.dictionary(attr)[v]
        return None if v < 0 else bool(v)

    def to_events(self) -> list[Event]:
        """Python Events (well-formed rows only); for tests and the reference matcher."""
        out = []
        names = [n for n, _ in self.schema.attrs]
        ok = np.ones(len(self), bool) if self.malformed is None else self.malformed == 0
        for i in np.flatnonzero(ok):
            attrs = {}
            for n in names:
                v = self.value(n, i)
                if v is not None:
                    attrs[n] = v
            out.append(Event(int(self.id[i]), self.schema.types[self.type[i]],
                             int(self.ts[i]), attrs))
        return out

    @staticmethod
    def from_events(events: Iterable[Event], schema: Schema) -> "EventBatch":
        events = list(events)
        n = len(events)
        cols = {name: missing_column(kind, n) for name, kind in schema.attrs}
        codes = {name: {v: i for i, v in enumerate(schema.dictionary(name))}
                 for name, kind in schema.attrs if kind == "str"}
        for i, ev in enumerate(events):
            for name, value in ev.attrs.items():
                kind = schema.kind(name)
                cols[name][i] = codes[name][value] if kind == "str" else value
        return EventBatch(schema, np.array([e.id for e in events], dtype=np.int64),
                          np.array([e.ts for e in events], dtype=np.int64),
                          np.array([schema.type_code(e.type) for e in events], dtype=np.int32),
                          cols)
