"""Lookup tables as every engine reads them: one consistent snapshot of a table's
rows, by key (the Select operator; ``TABLE`` declarations, docs/databases.md).

The rule, in one place for the reference matcher (per event), the engines (per
column, ``dqcep.runtime.lookups``) and the readers (``dqcep.io.database``):

- a key is compared as a value of the key column's declared type (``lookup_key``):
  a number is the same number whatever its written form (3 = 3.0); a value of
  another kind, or a fraction for an INT key, finds no row;
- a row's cells are read as their declared types (``cell_value``): NULL, or a cell
  of another type (SQLite does not enforce types), reads as missing; so does a cell
  that is no number, string or boolean at all (a BLOB, a jsonb object, a timestamp:
  a driver's bytes, dict, list or datetime), a string that is not Unicode (a lone
  surrogate), and a number the engines cannot hold (NaN, an infinity, an integer
  beyond 64 bits);
- no row for the key: missing, which makes the conjunct false, like a missing
  attribute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Protocol, Sequence

from dqcep.core.events import DECLARED_VALUES, value_kind


def lookup_key(value: Any, key_type: str) -> Hashable | None:
    """The key a value finds rows by in a table keyed by ``key_type`` (None: none)."""
    kind = value_kind(value)
    want, whole = DECLARED_VALUES[key_type]
    if kind != want:
        return None
    if kind == "num":  # as the engines hold numbers: binary64
        f = float(value)
        if not math.isfinite(f):
            return None
        return int(f) if f.is_integer() else (None if whole else f)
    return value


INT64 = (-(2**63), 2**63 - 1)


def cell_kind(value: Any) -> str | None:
    """"num", "str" or "bool" for a cell an engine can hold (None: missing, or any
    other object a database driver gives: bytes, a dict, a datetime, ...)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "num" if INT64[0] <= value <= INT64[1] else None
    if isinstance(value, float):
        return "num" if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return None  # a lone surrogate: no text any sink can write
        return "str"
    return None


def cell_value(value: Any, declared: str) -> Any:
    """A database cell as a value of its column's declared type (None: missing)."""
    if cell_kind(value) is None:
        return None
    if declared == "BOOL":
        if isinstance(value, bool):
            return value
        return bool(value) if value in (0, 1) and value_kind(value) == "num" else None
    want, whole = DECLARED_VALUES[declared]
    if value_kind(value) != want:
        return None
    if want == "num":
        f = float(value)
        if not math.isfinite(f) or (whole and not f.is_integer()):
            return None
        return int(value) if whole else f
    return value


@dataclass(frozen=True)
class TableSnapshot:
    """One read of a table: ``rows[key]`` holds the row's cells in ``columns`` order.
    ``version`` changes whenever the rows may have (a new read)."""

    name: str
    columns: tuple[str, ...]
    rows: Mapping[Hashable, tuple] = field(default_factory=dict)
    version: int = 0
    bad_cells: int = 0   # cells not of their declared type (read as missing)

    def value(self, key: Hashable | None, column: str) -> Any:
        """The cell of ``column`` in the row of a key from ``lookup_key`` (None:
        missing: no key, no row, or no value there)."""
        row = self.rows.get(key) if key is not None else None
        return None if row is None else row[self.columns.index(column)]


def snapshot_of(table, records: Iterable[Sequence], version: int = 0) -> TableSnapshot:
    """A snapshot of a declared table (``dqcep.lang.ast.LookupTable``) from its rows,
    each a sequence of cells in the declaration's column order. Rows whose key is
    missing find nothing; of rows with the same key the last one counts."""
    names = tuple(c.name for c in table.columns)
    types = tuple(c.type for c in table.columns)
    k = names.index(table.key)
    rows, bad = {}, 0
    for record in records:
        cells = tuple(cell_value(v, t) for v, t in zip(record, types))
        bad += sum(v is not None and c is None for v, c in zip(record, cells))
        key = lookup_key(cells[k], table.key_type)
        if key is not None:
            rows[key] = cells
    return TableSnapshot(table.name, names, rows, version, bad)


class LookupSource(Protocol):
    """Where an engine takes its tables' snapshots from: called once per table per
    engine batch, so that every event of a batch sees one snapshot."""

    def snapshot(self, table: str) -> TableSnapshot: ...


class StaticTables:
    """Snapshots that never change (tests, a Spark executor's broadcast copy)."""

    def __init__(self, snapshots: Mapping[str, TableSnapshot]):
        self.snapshots = dict(snapshots)

    def snapshot(self, table: str) -> TableSnapshot:
        return self.snapshots[table]
