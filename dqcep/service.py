"""``dqcep run ... --input mqtt://...``: the long-lived streaming service.

    MQTT (QoS 1, persistent session) -> journal (fsync, then PUBACK)
        -> decode (bad payloads/events -> dead-letter sink, with the reason)
        -> drop repeated event ids (redelivery)
        -> engine (K-slack reorder; later events -> late sink)
        -> match sink

Nothing is lost and nothing emitted twice across a crash: a checkpoint holds
the journal offset consumed, the engine snapshot, the recent event ids and the
length of every sink file, written atomically (temporary file, fsync, rename).
On start the sinks are cut back to those lengths and the journal is replayed
from that offset; the engine is deterministic, so it writes again exactly what
was lost. A clean shutdown (SIGINT/SIGTERM) drains the journal, flushes the
engine (releasing held matches) and checkpoints.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np

from dqcep._kernels.recent_ids import RecentIds
from dqcep.errors import UserError
from dqcep.io.journal import Journal, JournalTail
from dqcep.io.mqtt import MqttSource, MqttUrl
from dqcep.io.payloads import MAX_PAYLOAD, dead_letter, decode_payload
from dqcep.io.sinks import json_line, open_match_sink
from dqcep.lang import parse_file
from dqcep.plan import build_plan
from dqcep.runtime import Engine, EventColumns

CHECKPOINT_VERSION = 2
CHUNK_ROWS = 65_536  # decoded events handed to the engine at once, at most


@dataclass
class ServiceConfig:
    queries: str
    inputs: list[str]
    journal: str
    checkpoint: str
    output: str
    dead_letter: str
    late: str
    fmt: str = "msgpack"
    lateness: int = 0
    checkpoint_every: float = 1.0
    stats_every: float = 10.0
    stats_file: str | None = None
    client_id: str = "dqcep-engine"
    output_format: str = "json"
    recent_ids: int = 100_000


class _Sink:
    """An append-only JSON-lines file that can be cut back to a checkpointed length."""

    def __init__(self, path: str, keep: int | None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "ab")
        if keep is not None:
            self.f.truncate(keep)
        self.f.seek(0, os.SEEK_END)

    def write(self, obj: dict) -> None:
        self.f.write(json_line(obj))

    def sync(self) -> int:
        self.f.flush()
        os.fsync(self.f.fileno())
        return self.f.tell()

    def close(self) -> None:
        self.sync()
        self.f.close()


class StreamingService:
    def __init__(self, cfg: ServiceConfig):
        self.cfg = cfg
        self.urls = [MqttUrl.parse(u, subscribe=True) for u in cfg.inputs]
        self.engine = Engine(build_plan(parse_file(cfg.queries).queries), cfg.lateness)
        self.journal = Journal(cfg.journal)
        self.offset = 0
        self.recent = RecentIds(cfg.recent_ids)
        sizes = {}
        ck = Path(cfg.checkpoint)
        if ck.exists():
            state = msgpack.unpackb(ck.read_bytes(), raw=False)
            if state.get("version") != CHECKPOINT_VERSION:
                raise UserError(f"checkpoint {ck} has version {state.get('version')}; this "
                                f"service reads version {CHECKPOINT_VERSION}")
            self.engine.restore(state["engine"])
            self.offset = state["offset"]
            self.recent.admit(np.frombuffer(state["recent"], dtype="<i8").astype(np.int64))
            sizes = state["sinks"]
            restored_counts = state["counts"]
        else:
            restored_counts = {}
        self.decoder = self.engine.column_decoder()  # after restore, which replaces it
        self._pending: list[tuple[int, bytes, int]] = []  # decoded: (offset, payload, rows)
        self._pending_rows = 0
        self.tail = JournalTail(cfg.journal, self.offset)
        self.out = open_match_sink(cfg.output, cfg.output_format,
                                   keep=sizes.get("output") if ck.exists() else None)
        self.dead = _Sink(cfg.dead_letter, sizes.get("dead_letter"))
        self.late = _Sink(cfg.late, sizes.get("late"))
        self.counts = {"payloads": 0, "events_in": 0, "matches_out": 0, "malformed": 0,
                       "duplicates": 0, "late": 0, **restored_counts}
        self.started = time.monotonic()

    # ------------------------------------------------------------- processing
    def step(self) -> int:
        """Process what the journal holds beyond our offset; returns records consumed.

        Well-formed msgpack payloads are decoded by the ColumnDecoder kernel and
        go to the engine together, up to CHUNK_ROWS events at a time; any other
        payload (JSON, or one the kernel leaves to the validator) is decoded in
        Python, which names what is wrong. Both keep arrival order, and the
        engine's results do not depend on how the events are batched.
        """
        n = 0
        for offset, topic, payload in self.tail.read(self.journal.durable_offset):
            self.counts["payloads"] += 1
            rows = self.decoder.decode(payload) \
                if self.cfg.fmt == "msgpack" and len(payload) <= MAX_PAYLOAD else -1
            if rows >= 0:
                self._pending.append((offset, payload, rows))
                self._pending_rows += rows
                if self._pending_rows >= CHUNK_ROWS:
                    self._process_pending()
            else:
                self._process_pending()
                self._process_payload(offset, topic, payload)
            n += 1
        self._process_pending()
        return n

    def _process_pending(self) -> None:
        """The decoded payloads held: drop repeated ids, run the engine."""
        if not self._pending:
            return
        cols = EventColumns(*self.decoder.take())
        record = np.repeat(np.arange(len(self._pending)), [r for _, _, r in self._pending])
        fresh = self.recent.admit(cols.id)
        if not fresh.all():
            self.counts["duplicates"] += int((~fresh).sum())
            cols, record = cols.take(fresh), record[fresh]
        self.counts["events_in"] += len(cols.ts)
        if len(cols.ts):
            self._emit(self.engine.process(cols))
            late = self.engine.take_late()
            if late:  # rare: decode those payloads again for the late sink
                rows = np.flatnonzero(np.isin(cols.id, late))
                for r in np.unique(record[rows]):
                    offset, payload, _ = self._pending[r]
                    self._write_late(offset, decode_payload(payload)[0], set(late))
        self.offset = self._pending[-1][0] + 1
        self._pending, self._pending_rows = [], 0

    def _process_payload(self, offset: int, topic: str, payload: bytes) -> None:
        events, rejected = decode_payload(payload, self.cfg.fmt)
        if rejected:
            self.counts["malformed"] += len(rejected)
            kept = payload if len(payload) <= MAX_PAYLOAD else None  # never the bytes of a huge one
            self.dead.write(dead_letter(offset, topic, kept, len(payload), rejected))
        fresh = self.recent.admit(np.fromiter((e.id for e in events), np.int64, len(events)))
        self.counts["duplicates"] += int((~fresh).sum())
        events = [e for e, f in zip(events, fresh) if f]
        self.counts["events_in"] += len(events)
        if events:
            self._emit(self.engine.process(events))
            late = self.engine.take_late()
            if late:
                self._write_late(offset, events, set(late))
        self.offset = offset + 1

    def _write_late(self, offset: int, events, late: set[int]) -> None:
        for e in events:
            if e.id in late:
                self.counts["late"] += 1
                self.late.write({"offset": offset, "event": {
                    "id": e.id, "type": e.type, "ts": e.ts, **e.attrs}})

    def _emit(self, batch) -> None:
        if len(batch):
            self.counts["matches_out"] += self.out.write_batch(batch)

    def checkpoint(self) -> None:
        state = {"version": CHECKPOINT_VERSION, "offset": self.offset,
                 "engine": self.engine.snapshot(), "recent": self.recent.ids().astype("<i8").tobytes(),
                 "counts": self.counts,
                 "sinks": {"output": self.out.sync(), "dead_letter": self.dead.sync(),
                           "late": self.late.sync()}}
        path = Path(self.cfg.checkpoint)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(msgpack.packb(state, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def stats(self) -> dict:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {**self.counts, "lag_records": self.journal.durable_offset - self.offset,
                "events_per_s": self.counts["events_in"] / elapsed,
                "watermark": self.engine.wm}

    def _write_stats(self) -> None:
        s = self.stats()
        print(f"dqcep: events in {s['events_in']}, matches out {s['matches_out']}, late "
              f"{s['late']}, malformed {s['malformed']}, duplicates {s['duplicates']}, lag "
              f"{s['lag_records']} records, {s['events_per_s']:,.0f} events/s",
              file=sys.stderr, flush=True)
        if self.cfg.stats_file:
            tmp = self.cfg.stats_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(s, f)
            os.replace(tmp, self.cfg.stats_file)

    def close(self) -> None:
        """Close files without a checkpoint: what a crash leaves, minus the torn writes."""
        for sink in (self.out, self.dead, self.late):
            sink.close()
        self.tail.close()
        self.journal.close()

    # ------------------------------------------------------------------- run
    def run(self, stop: threading.Event) -> int:
        self.step()  # replay what the journal holds from before a restart
        source = MqttSource(self.urls, self.journal, self.cfg.client_id)
        source.start()
        print(f"dqcep: listening on {', '.join(self.cfg.inputs)}", file=sys.stderr, flush=True)
        last_ck = last_stats = time.monotonic()
        try:
            while not stop.is_set():
                if not self.step():
                    stop.wait(0.02)
                now = time.monotonic()
                if now - last_ck >= self.cfg.checkpoint_every:
                    self.checkpoint()
                    last_ck = now
                if now - last_stats >= self.cfg.stats_every:
                    self._write_stats()
                    last_stats = now
        finally:
            source.stop()
        self.step()                      # drain
        self._emit(self.engine.flush())  # a clean shutdown closes the stream
        self.checkpoint()
        self._write_stats()
        self.close()
        return 0


def serve(cfg: ServiceConfig) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return StreamingService(cfg).run(stop)
