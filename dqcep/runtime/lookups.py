"""Lookup attributes filled at ingest (``dqcep.plan.lookups``): for every event of a
batch, the lookup table's cell at the key the event's attribute holds, read from
one snapshot of the table per batch (``dqcep.core.tables``: the rule for keys, cells
and missing rows). Strings are coded in the engine's dictionary, as decoded
attributes are."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dqcep.runtime.compile import KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR, StringDictionary
from dqcep.core.tables import LookupSource, lookup_key

_KEY_KIND = {"INT": KIND_NUM, "DOUBLE": KIND_NUM, "STRING": KIND_STR, "BOOL": KIND_BOOL}


class LookupFiller:
    """Fills a plan's lookup attributes (``plan.lookups``) in engine columns."""

    def __init__(self, lookups: Sequence, tables: Sequence, attr_index: dict[str, int],
                 source: LookupSource):
        declared = {t.name: t for t in tables}
        # (target column, key: a column, "ts" or "id", the key's kind, key type, table,
        # column)
        self.fills = [(attr_index[c.attr], c.key if c.key in ("ts", "id") else
                       attr_index[c.key], declared[c.table].key_type, c.table, c.column)
                      for c in lookups if c.attr in attr_index]
        self.source = source
        self.tables = sorted({f[3] for f in self.fills})

    def fill(self, cols: tuple, dictionary: StringDictionary) -> tuple:
        """A batch (``(ts, id, type, val, kind)``) with its lookup attributes written,
        every table read once for the whole batch."""
        if not self.fills:
            return cols
        ts, ids, types, val, kind = cols
        val, kind = val.copy(), kind.copy()  # the caller's columns stay as they were
        snapshots = {t: self.source.snapshot(t) for t in self.tables}
        for target, key, key_type, table, column in self.fills:
            if key == "ts" or key == "id":
                present = np.ones(len(ts), bool)
                keys = (ts if key == "ts" else ids).astype(np.float64)
            else:
                present = kind[:, key] == _KEY_KIND[key_type]
                keys = val[present, key]
            out_val = np.zeros(len(ts), np.float64)
            out_kind = np.full(len(ts), KIND_MISSING, np.int8)
            if len(keys):
                uniq, inverse = np.unique(keys, return_inverse=True)
                snap = snapshots[table]
                u_val = np.zeros(len(uniq), np.float64)
                u_kind = np.full(len(uniq), KIND_MISSING, np.int8)
                for i, k in enumerate(uniq.tolist()):
                    if key_type == "STRING":
                        k = dictionary.values[int(k)]
                    elif key_type == "BOOL":
                        k = bool(k)
                    u_kind[i], u_val[i] = _cell(snap.value(lookup_key(k, key_type), column),
                                                dictionary)
                out_val[present], out_kind[present] = u_val[inverse], u_kind[inverse]
            val[:, target], kind[:, target] = out_val, out_kind
        return ts, ids, types, val, kind


def _cell(value, dictionary: StringDictionary) -> tuple[int, float]:
    """A cell as an engine value: (kind, value), strings coded."""
    if value is None:
        return KIND_MISSING, 0.0
    if isinstance(value, bool):
        return KIND_BOOL, float(value)
    if isinstance(value, str):
        return KIND_STR, float(dictionary.code(value))
    return KIND_NUM, float(value)
