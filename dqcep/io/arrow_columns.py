"""Arrow record batches -> the engine's input columns, by the validator's rules.

``arrow_columns`` turns a record batch (a Parquet file's, or a block of JSON Lines
or CSV that pyarrow read) into ``(ts, id, type, val, kind)`` in an engine's column
layout when every row obeys ``dqcep.core.events.event_from_mapping``'s rules, else
gives None and the caller hands the rows to the validator (``dqcep.io.columnar``).
"""
from __future__ import annotations

import numpy as np

from dqcep._kernels.store import KINDS
from dqcep.core.events import INT64_MAX, TS_LIMIT

KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR = (KINDS[k] for k in ("BOOL", "MISSING", "NUM",
                                                                 "STR"))


def string_codes(strings, engine) -> np.ndarray:
    """The engine dictionary's codes (float64) of an Arrow string array, one per row
    (a null row gets the code of the first distinct string; callers mask it)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(strings)
    codes = engine.dictionary.codes_for(encoded.dictionary.to_pylist())
    if not len(codes):
        return np.zeros(len(strings), np.float64)
    return codes[encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)]


def type_codes(types, engine) -> np.ndarray:
    """The engine's type codes (int32, -1: a type no query uses) of an Arrow string array."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(types)
    codes = np.array([engine.type_code.get(v, -1) for v in encoded.dictionary.to_pylist()],
                     np.int32)
    return codes[encoded.indices.to_numpy(zero_copy_only=False)]


def arrow_columns(batch, engine):
    """(ts, id, type, val, kind) of a record batch whose every row the validator
    accepts, else None. The same rules as ``event_from_mapping``: a non-empty string
    ``type``, integer ``ts`` (within +-TS_LIMIT) and ``id`` (64-bit), attributes that
    are numbers (finite), strings or booleans; null is absent."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if batch.num_rows == 0 or len(set(names)) != len(names) \
            or not {"id", "type", "ts"} <= set(names):
        return None
    try:
        batch.validate(full=True)  # strings are UTF-8
    except pa.ArrowInvalid:
        return None
    column = dict(zip(names, batch.columns))
    etype = column["type"]
    if not (pa.types.is_string(etype.type) or pa.types.is_large_string(etype.type)) \
            or etype.null_count or pc.min(pc.utf8_length(etype)).as_py() == 0:
        return None
    fields = []
    for name in ("ts", "id"):
        c = column[name]
        if not pa.types.is_integer(c.type) or c.null_count:
            return None
        lo, hi = pc.min_max(c).values()
        limit = TS_LIMIT if name == "ts" else INT64_MAX
        if hi.as_py() > limit or (name == "ts" and lo.as_py() < -TS_LIMIT):
            return None
        fields.append(c.to_numpy().astype(np.int64))
    n, attrs = batch.num_rows, engine.attrs
    val, kind = np.zeros((n, len(attrs)), np.float64), np.zeros((n, len(attrs)), np.int8)
    slot = {a: i for i, a in enumerate(attrs)}
    for name, c in column.items():
        if name in ("id", "type", "ts"):
            continue
        t = c.type
        if pa.types.is_floating(t):
            if c.null_count < n and not pc.all(pc.is_finite(c)).as_py():
                return None
        elif not (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t)
                  or pa.types.is_string(t) or pa.types.is_large_string(t)):
            return None
        if name not in slot or pa.types.is_null(t):
            continue
        a, present = slot[name], c.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            val[:, a], kind[:, a] = string_codes(c, engine), KIND_STR
        else:
            val[:, a] = pc.fill_null(c, False if pa.types.is_boolean(t) else 0) \
                .to_numpy(zero_copy_only=False).astype(np.float64)
            kind[:, a] = KIND_BOOL if pa.types.is_boolean(t) else KIND_NUM
        val[~present, a], kind[~present, a] = 0.0, KIND_MISSING
    return fields[0], fields[1], type_codes(etype, engine), val, kind
