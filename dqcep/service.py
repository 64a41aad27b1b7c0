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

import base64
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgpack

from dqcep.errors import UserError
from dqcep.io.journal import Journal, JournalTail
from dqcep.io.mqtt import MqttSource, MqttUrl
from dqcep.io.payloads import decode_payload
from dqcep.io.sinks import open_match_sink

CHECKPOINT_VERSION = 1


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
        self.f.write((json.dumps(obj, ensure_ascii=False) + "\n").encode())

    def sync(self) -> int:
        self.f.flush()
        os.fsync(self.f.fileno())
        return self.f.tell()

    def close(self) -> None:
        self.sync()
        self.f.close()


class StreamingService:
    def __init__(self, cfg: ServiceConfig):
        from dqcep.lang import parse_file
        from dqcep.plan import build_plan
        from dqcep.runtime import Engine

        self.cfg = cfg
        self.urls = [MqttUrl.parse(u) for u in cfg.inputs]
        self.engine = Engine(build_plan(parse_file(cfg.queries).queries), cfg.lateness)
        self.journal = Journal(cfg.journal)
        self.offset = 0
        self.recent: deque[int] = deque(maxlen=cfg.recent_ids)
        self.recent_set: set[int] = set()
        sizes = {}
        ck = Path(cfg.checkpoint)
        if ck.exists():
            state = msgpack.unpackb(ck.read_bytes(), raw=False)
            if state.get("version") != CHECKPOINT_VERSION:
                raise UserError(f"checkpoint {ck} has version {state.get('version')}; this "
                                f"service reads version {CHECKPOINT_VERSION}")
            self.engine.restore(state["engine"])
            self.offset = state["offset"]
            for i in state["recent"]:
                self._remember(i)
            sizes = state["sinks"]
            restored_counts = state["counts"]
        else:
            restored_counts = {}
        self.tail = JournalTail(cfg.journal, self.offset)
        self.out = open_match_sink(cfg.output, cfg.output_format,
                                   keep=sizes.get("output") if ck.exists() else None)
        self.dead = _Sink(cfg.dead_letter, sizes.get("dead_letter"))
        self.late = _Sink(cfg.late, sizes.get("late"))
        self.counts = {"payloads": 0, "events_in": 0, "matches_out": 0, "malformed": 0,
                       "duplicates": 0, "late": 0, **restored_counts}
        self.started = time.monotonic()

    def _remember(self, event_id: int) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.recent_set.discard(self.recent[0])
        self.recent.append(event_id)
        self.recent_set.add(event_id)

    # ------------------------------------------------------------- processing
    def step(self) -> int:
        """Process what the journal holds beyond our offset; returns records consumed."""
        n = 0
        for offset, topic, payload in self.tail.read(self.journal.durable_offset):
            events, rejected = decode_payload(payload, self.cfg.fmt)
            self.counts["payloads"] += 1
            for r in rejected:
                self.counts["malformed"] += 1
                self.dead.write({"offset": offset, "topic": topic, "reason": r.describe(),
                                 "payload": base64.b64encode(payload).decode()})
            fresh = []
            for e in events:
                if e.id in self.recent_set:
                    self.counts["duplicates"] += 1
                    continue
                self._remember(e.id)
                fresh.append(e)
            self.counts["events_in"] += len(fresh)
            if fresh:
                self._emit(self.engine.process(fresh))
                late = set(self.engine.take_late())
                for e in fresh:
                    if e.id in late:
                        self.counts["late"] += 1
                        self.late.write({"offset": offset, "event": {
                            "id": e.id, "type": e.type, "ts": e.ts, **e.attrs}})
            self.offset = offset + 1
            n += 1
        return n

    def _emit(self, batch) -> None:
        for m in batch.to_matches():
            self.out.write(m)
            self.counts["matches_out"] += 1

    def checkpoint(self) -> None:
        state = {"version": CHECKPOINT_VERSION, "offset": self.offset,
                 "engine": self.engine.snapshot(), "recent": list(self.recent),
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
        for sink in (self.out, self.dead, self.late):
            sink.close()
        self.tail.close()
        self.journal.close()
        return 0


def serve(cfg: ServiceConfig) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return StreamingService(cfg).run(stop)
