"""EventBatch -> bytes in the interchange formats (spec section 1).

``BatchEncoder(schema, fmt)`` encodes batches of one schema as JSON Lines,
msgpack payloads (``{"events": [...]}``, the MQTT form), CSV (one header, then
rows), or Parquet (through ``ParquetSink``). Events marked ``malformed`` are
corrupted on purpose, per ``dqcep.core.batch.Malformed``.

The encodings are deterministic: the same batches give the same bytes.
"""
from __future__ import annotations

import csv
import io
import json
from typing import BinaryIO

import msgpack
import numpy as np

from dqcep._kernels.msgpack_encode import encode_payloads
from dqcep.core.batch import KINDS, EventBatch, Malformed, Schema

EVENT_FORMATS = ("jsonl", "msgpack", "csv", "parquet")
BAD_TS = "not-a-ts"


class _MsgpackTables:
    """The pre-encoded strings and column layout the msgpack kernel needs."""

    def __init__(self, schema: Schema):
        names = [n for n, _ in schema.attrs]
        entries = ["events", "id", "type", "ts", "garbage", BAD_TS] + names + list(schema.types)
        self.dict_base = np.zeros(len(names), dtype=np.int64)
        for a, (name, kind) in enumerate(schema.attrs):
            if kind == "str":
                self.dict_base[a] = len(entries) - 6 - len(names) - len(schema.types)
                entries += list(schema.dictionary(name))
        packed = [msgpack.packb(e) for e in entries]
        self.blob = np.frombuffer(b"".join(packed), dtype=np.uint8)
        self.offsets = np.zeros(len(packed) + 1, dtype=np.int64)
        self.offsets[1:] = np.cumsum([len(p) for p in packed])
        self.kinds = np.array([KINDS.index(k) for _, k in schema.attrs], dtype=np.int8)
        per_kind = {k: [n for n, kk in schema.attrs if kk == k] for k in KINDS}
        self.column_index = np.array([per_kind[k].index(n) for n, k in schema.attrs],
                                     dtype=np.int64)
        self.per_kind = per_kind
        longest_key = max((len(p) for p in packed[6:6 + len(names)]), default=0)
        longest_value = max([9] + [len(p) for p in packed[6 + len(names):]])
        # map header + id + type + ts + every attribute, each with its key
        self.max_event = 5 + 3 + 9 + 5 + longest_value + 3 + 9 + \
            len(names) * (longest_key + longest_value)
        self.n_types = len(schema.types)


class BatchEncoder:
    def __init__(self, schema: Schema, fmt: str, batch_size: int = 1000):
        if fmt not in EVENT_FORMATS:
            raise ValueError(f"unknown event format {fmt!r}; expected one of "
                             f"{', '.join(EVENT_FORMATS)}")
        self.schema, self.fmt, self.batch_size = schema, fmt, batch_size
        self.names = [n for n, _ in schema.attrs]
        self._mp = _MsgpackTables(schema) if fmt == "msgpack" else None
        self._header_written = False

    # msgpack ------------------------------------------------------------
    def msgpack_payloads(self, batch: EventBatch) -> tuple[np.ndarray, np.ndarray]:
        """One buffer with all payloads of ``batch_size`` events, and their end offsets."""
        t = self._mp
        n = len(batch)
        cols = {k: [batch.columns[name] for name in t.per_kind[k]] for k in KINDS}

        def stack(k, dtype):
            return np.ascontiguousarray(np.stack(cols[k])) if cols[k] else \
                np.zeros((0, n), dtype=dtype)

        out = np.empty(n * t.max_event + 16 * (n // self.batch_size + 1), dtype=np.uint8)
        mal = batch.malformed if batch.malformed is not None else np.zeros(n, np.int8)
        used, ends = encode_payloads(
            np.ascontiguousarray(batch.id), np.ascontiguousarray(batch.ts),
            np.ascontiguousarray(batch.type), np.ascontiguousarray(mal),
            t.kinds, t.column_index, stack("float", np.float64), stack("int", np.int64),
            stack("str", np.int32), stack("bool", np.int8), t.dict_base, t.blob, t.offsets,
            t.n_types, self.batch_size, out)
        return out[:used], ends

    # text formats ---------------------------------------------------------
    def rows(self, batch: EventBatch):
        """(event dict, malformed kind) per row; columns go to Python lists once per batch."""
        types = self.schema.types
        cols = []
        for name, kind in self.schema.attrs:
            present = batch.present(name).tolist()
            col = batch.columns[name]
            if kind == "str":
                d = self.schema.dictionary(name)
                values = [d[c] if c >= 0 else None for c in col.tolist()]
            elif kind == "bool":
                values = [c == 1 for c in col.tolist()]
            else:
                values = col.tolist()
            cols.append((name, values, present))
        bad = [0] * len(batch) if batch.malformed is None else batch.malformed.tolist()
        for i, (eid, etype, ts) in enumerate(zip(batch.id.tolist(), batch.type.tolist(),
                                                 batch.ts.tolist())):
            obj = {"id": eid, "type": types[etype], "ts": ts}
            for name, values, present in cols:
                if present[i]:
                    obj[name] = values[i]
            if bad[i] == Malformed.NO_TYPE:
                del obj["type"]
            elif bad[i] == Malformed.BAD_TS:
                obj["ts"] = BAD_TS
            yield obj, bad[i]

    def jsonl(self, batch: EventBatch) -> bytes:
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        lines = []
        for obj, bad in self.rows(batch):
            line = dumps(obj)
            if bad == Malformed.UNDECODABLE:
                line = line[: len(line) // 2]  # cut mid-object: not valid JSON
            lines.append(line)
        return ("\n".join(lines) + "\n").encode() if lines else b""

    def csv(self, batch: EventBatch) -> bytes:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if not self._header_written:
            w.writerow(["id", "type", "ts"] + self.names)
            self._header_written = True
        for obj, bad in self.rows(batch):
            row = [obj["id"], obj.get("type", ""), obj["ts"]]
            for name in self.names:
                v = obj.get(name)
                row.append("" if v is None else ("true" if v else "false")
                           if isinstance(v, bool) else repr(v) if isinstance(v, float) else v)
            if bad == Malformed.UNDECODABLE:
                row = row[:2]  # too few cells
            w.writerow(row)
        return buf.getvalue().encode()

    def encode(self, batch: EventBatch) -> bytes | memoryview:
        """The batch's bytes (msgpack: a view of the kernel's buffer, not a copy)."""
        if self.fmt == "msgpack":
            buf, _ = self.msgpack_payloads(batch)
            return memoryview(buf)
        if self.fmt == "jsonl":
            return self.jsonl(batch)
        if self.fmt == "csv":
            return self.csv(batch)
        raise ValueError("Parquet is written through ParquetSink")


class ParquetSink:
    """Appends batches to one Parquet file (row group per batch).

    Columns: id, type (dictionary string), ts, then the attributes with their
    natural Arrow types; type and ts are nullable so malformed events survive as
    nulls (NO_TYPE: type null; BAD_TS: ts null; UNDECODABLE: both null).
    """

    def __init__(self, schema: Schema, stream: BinaryIO):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.schema = pa, schema
        arrow = {"float": pa.float64(), "int": pa.int64(), "str": pa.string(),
                 "bool": pa.bool_()}
        self.arrow_schema = pa.schema(
            [("id", pa.int64()), ("type", pa.string()), ("ts", pa.int64())]
            + [(n, arrow[k]) for n, k in schema.attrs])
        self.writer = pq.ParquetWriter(stream, self.arrow_schema, compression="zstd")

    def write(self, batch: EventBatch) -> None:
        pa = self.pa
        mal = batch.malformed if batch.malformed is not None else np.zeros(len(batch), np.int8)
        no_type = (mal == Malformed.NO_TYPE) | (mal == Malformed.UNDECODABLE)
        bad_ts = (mal == Malformed.BAD_TS) | (mal == Malformed.UNDECODABLE)
        types = pa.DictionaryArray.from_arrays(
            pa.array(np.where(no_type, 0, batch.type), mask=no_type, type=pa.int32()),
            pa.array(self.schema.types)).cast(pa.string())
        arrays = [pa.array(batch.id), types, pa.array(batch.ts, mask=bad_ts)]
        for name, kind in self.schema.attrs:
            col, missing = batch.columns[name], ~batch.present(name)
            if kind == "str":
                codes = pa.array(np.where(missing, 0, col), mask=missing, type=pa.int32())
                arrays.append(pa.DictionaryArray.from_arrays(
                    codes, pa.array(self.schema.dictionary(name))).cast(pa.string()))
            elif kind == "bool":
                arrays.append(pa.array(col == 1, mask=missing))
            else:
                arrays.append(pa.array(col, mask=missing))
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.arrow_schema))

    def close(self) -> None:
        self.writer.close()
