"""The service's consumer: journal records -> batches of events -> the pipeline.

``JournalConsumer.step`` reads the journal beyond the service's offset (``JournalTail``)
and takes each record in its place: a gap (records the journal cannot give back) is
reported and passed over, a control record changes the query set there
(``dqcep.service.changes``), and a payload is decoded into the engine's columns: by
the ColumnDecoder kernel where it can (msgpack events), else read in Python by the
``PayloadReader`` (a ``--map``, JSON, what the kernel leaves to the validator), whose
events become columns too. Both kinds wait in one pending list in journal order and
go down the pipeline together (``_run_batch``): events ahead of their arrival,
rejected payloads and events, events a declared schema refuses and queries stopped
by their budget become dead letters with the journal offset of their record; late
events go to the late sink.

``JournalConsumer`` is a part of ``dqcep.service.streaming.StreamingService``, apart
for reading: its methods read the service's engine, pipeline, sinks and counters.
"""
from __future__ import annotations

import sys
import time
from typing import NamedTuple

import numpy as np

from dqcep.io.database import Progress
from dqcep.io.ingest import ahead_reason, ahead_rows
from dqcep.io.journal import SERVICE_TOPICS, TICK_TOPIC, Gap, Record, tick_time
from dqcep.io.journal_tail import RecordBlock
from dqcep.io.mapping import MappedColumns, Recoding
from dqcep.io.match_text import readable_time
from dqcep.io.payloads import MAX_PAYLOAD, Rejected, dead_letter
from dqcep.runtime import EventColumns
from dqcep.service.changes import CONTROL_TOPIC
from dqcep.service.http import LAST_MATCHES
from dqcep.service.stats import last_matches

# A journal record of the next batch: (record, how many rows it gave, its events when
# it was read in Python, else None: the kernel decoded it). A plain tuple: one is made
# per msgpack payload, and a NamedTuple's 180 ns more were 3% of the service's step on
# one-event payloads (bench_service.py --per-record 1)
Pending = tuple[Record, int, "list | None"]


class PendingBlock(NamedTuple):
    """Records ``lo``..``hi - 1`` of a ``RecordBlock`` that the compiled map read
    (``rows``: the rows each gave): a run of the next batch without a tuple each."""
    block: RecordBlock
    lo: int
    hi: int
    rows: np.ndarray


# decoded events handed to the engine at once, at most: their matches go to the output's
# writer thread while the next are matched (bench_front_door, 10 example queries:
# 65,536 a batch 44-51 K messages/s, 16,384 53-57 K)
CHUNK_ROWS = 16_384
BLOCK_RECORDS = 16_384  # records of a block the compiled map reads at once, at most
DEAD = "dead."        # counters of dead letters by reason: dead.payload, dead.event, ...
# events after which the service says, once, the types and attributes its queries name
# that none of them held (a typo gives no error, only no match); also at the stream's end
UNSEEN_AFTER = 10_000


class JournalConsumer:
    """The journal's records into the engine (see the module docstring)."""

    def _nothing_pending(self) -> None:
        """The next batch, empty: at a load, after a recovery. Its records, in journal
        order, and their events: pieces of columns, then at the tail either the rows of
        kernel-decoded records (in the decoder) or the events of records read in
        Python (``_read_events``, which become columns together: one conversion per
        run of them, ``_close_read``)."""
        self._pending: list[Pending | PendingBlock] = []
        self._mapped: MappedColumns | Recoding | None = None  # made on first use
        self._pending_rows = 0
        self._decoded_rows = 0  # of them, decoded by the kernel (not checked for --max-future)
        self._columns: list[EventColumns] = []
        self._read_events: list = []

    def step(self, deadline: float | None = None, until: int | None = None) -> int:
        """Process what the journal holds beyond our offset (up to ``until``, if
        given); returns records consumed.

        Stops early once ``deadline`` (time.monotonic) has passed, so that a long
        backlog does not hold checkpoints back. Well-formed msgpack event payloads
        are decoded by the ColumnDecoder kernel; any other record (mapped by
        ``--map``, JSON, or one the kernel leaves to the validator) is read in
        Python by the service's ``PayloadReader``, which names what is wrong, and
        its events become the engine's columns (``_ingest``, ``_piece``). Both kinds
        wait in one pending list, in journal order, and go to the engine together
        in batches of about CHUNK_ROWS events (``_run_batch``); the engine's results
        do not depend on how the events are batched.
        """
        if self._admission_at is not None and not self._take_admission():
            return 0
        if self.source is not None:
            self._take_changes()
        n = 0
        upto = self.journal.durable_offset if until is None else \
            min(until, self.journal.durable_offset)
        kernel = self.reader.event_payloads and self.returns is None  # RETURN: Events
        mapped = self._mapped_columns()
        if mapped is not None:
            n = self._step_blocks(mapped, upto, deadline)
        else:
            for record in self.tail.read(upto):
                n += 1
                self._take(record, kernel)
                if deadline is not None and n % 256 == 0 and time.monotonic() > deadline:
                    break
        self._flush()
        return n

    def _step_blocks(self, mapped: MappedColumns, upto: int, deadline: float | None) -> int:
        """``step`` with a map the kernel reads: runs of plain records as blocks, the
        rest (gaps, control records, damage) one record at a time."""
        n = checked = 0
        while True:
            block = self.tail.block(upto, BLOCK_RECORDS, SERVICE_TOPICS)
            if block is not None:
                self._take_block(mapped, block)
                n += block.count
            else:
                record = next(self.tail.read(upto), None)
                if record is None:
                    break
                n += 1
                self._take(record, False)
            if deadline is not None and n - checked >= 256:
                checked = n
                if time.monotonic() > deadline:
                    break
        return n

    def _take(self, record: Record, kernel: bool) -> None:
        """One journal record in its place: a gap, a control record, or a payload
        (decoded by the msgpack kernel when ``kernel`` and it can, else read in Python)."""
        payload = record.payload
        if isinstance(payload, Gap):
            self._flush()
            self._lost(record.offset, payload)
            return
        if record.topic == CONTROL_TOPIC:  # a change of the query set, in its place
            self._flush()
            self._change(record)
            return
        if record.topic == TICK_TOPIC:  # time passes, in its place
            self._flush()
            self._tick(record)
            return
        self.counts["payloads"] += 1
        rows = self.decoder.decode(payload) if kernel and isinstance(
            payload, bytes) and len(payload) <= MAX_PAYLOAD else -1
        if rows >= 0:
            if self._read_events:  # read before this record's rows: a piece first
                self._close_read()
            self._pending.append((record, rows, None))
            self._pending_rows += rows
            self._decoded_rows += rows
        else:
            self._ingest(record)
        if self._pending_rows >= CHUNK_ROWS:
            self._run_batch()

    def _mapped_columns(self) -> MappedColumns | Recoding | None:
        """The compiled map over the engine's decoder (made again when the decoder is),
        or, with a reading shared by the process's consumers (a worker's), its runs in
        our codes; None: no map, or RETURN values (which need the events)."""
        if self.reader.map is None or self.returns is not None:
            return None
        if self._mapped is None or self._mapped.decoder is not self.decoder:
            engine = self.engine
            self._mapped = MappedColumns(self.reader.map, self.decoder, engine.types,
                                         engine.attrs) if self.reading is None else \
                Recoding(self.reading, self.decoder, engine.types, engine.attrs,
                         engine.dictionary)
        return self._mapped

    def _take_block(self, mapped: MappedColumns | Recoding, block: RecordBlock) -> None:
        """A block's records: runs the compiled map reads, each record it leaves read by
        the map in Python (``_ingest``), all in their places."""
        self.counts["payloads"] += block.count
        shared = isinstance(mapped, Recoding)
        rows = None if shared else np.zeros(block.count, np.int64)
        lo = 0
        while lo < block.count:
            if self._read_events:  # read before the kernel's rows: a piece first
                self._close_read()
            if shared:  # decoded once for the process's consumers: a piece of ours
                run = self.reading.read(block, lo)
                hi, rows = run.stop, run.rows
                if hi > lo:
                    self._columns.append(EventColumns(*mapped.columns(run)))
            else:
                hi = mapped.decode(block, lo, rows)
            if hi > lo:
                self._pending.append(PendingBlock(block, lo, hi, rows[lo:hi]))
                self._pending_rows += hi - lo
            if hi < block.count:
                self._ingest(block.record(hi))
                hi += 1
            lo = hi
            if self._pending_rows >= CHUNK_ROWS:
                self._run_batch()

    def _flush(self) -> None:
        """Process what is held."""
        self._run_batch()
        if self.engine.program is not self.program:  # the engine moved a query
            self._use_queries(self.query_set, self.engine.program)

    def _close_read(self) -> None:
        """The events read in Python since the last piece, as a piece of columns."""
        self._columns.append(self.engine.columns(self._read_events))
        self._read_events = []

    def _piece(self) -> None:
        """The tail of the pending events (the decoder's rows or the events read in
        Python: one of them holds any) closed as a piece of columns."""
        if self.decoder.rows:
            self._columns.append(EventColumns(*self.decoder.take()))
        if self._read_events:
            self._close_read()

    def _batch(self) -> EventColumns:
        """The pending records' events as one batch of columns, in journal order."""
        self._piece()
        cols = EventColumns.concat(self._columns) if self._columns else \
            EventColumns.empty(len(self.engine.attrs))
        self._columns = []
        return cols

    def _run_batch(self) -> None:
        """The pending records' events down the pipeline: events ahead of their
        arrival out, repeated ids dropped, the engine run; what it refused, stopped
        and left out late reported with the journal offset of its record."""
        if not self._pending:
            return
        pending = PendingRecords(self._pending)
        cols = self._batch()
        rows = pending.rows
        record = np.repeat(np.arange(len(rows)), rows)  # row -> its pending record
        if self.cfg.max_future and self._decoded_rows:  # (PayloadReader checks its own)
            arrival = pending.arrival_ms()
            ahead = ahead_rows(cols.ts, arrival[record], self.cfg.max_future)
            if ahead.any():
                self._dead_ahead(pending, cols.ts, record, rows, arrival, ahead)
                cols, record = cols.take(~ahead), record[~ahead]
        events = pending.events() if self.returns is not None else None
        end = pending.last_offset
        before = self.engine.max_seen  # G before the batch: what it made final
        out = self._run(end, lambda write, through: self.pipeline.process(
            cols, write, through, records=events))
        if out.matches is not None:
            cols = out.events
            if out.kept is not None:
                record = record[out.kept]
            if len(out.matches) and self.arrivals is not None:
                self.response.observe(out.matches, cols.id,
                                      self.arrivals.at(pending.offsets())[record], time.time(),
                                      cols.ts, before, self.engine.state.tolerance)
            self._misdeclared(out.refused, lambda event_id: pending.record(
                int(record[np.flatnonzero(cols.id == event_id)[0]]))[0].offset)
            self._stopped(out.stopped, end)
            if out.late:
                late = dict(zip(out.late, out.late_why))
                for r in np.unique(record[np.isin(cols.id, out.late)]).tolist():
                    self._write_late(*pending.record(r), late)
        self.offset = end + 1
        self._pending, self._pending_rows, self._decoded_rows = [], 0, 0
        if self.engine.events_in >= UNSEEN_AFTER:
            self._report_unseen()

    def _report_unseen(self) -> None:
        """Once: the event types and attributes the queries name that no event held so
        far (``dqcep.lang.check.never_seen``, as a file run says at its end), and the
        attributes the map made that no query could name."""
        if self._unseen_said or not self.engine.events_in:
            return
        self._unseen_said = True
        from dqcep.lang.check import never_seen
        types, attrs = self.engine.seen()
        n = self.engine.events_in
        for q in self.queries:
            for message, pos in never_seen(q, types, attrs):
                print(f"dqcep: {self.cfg.queries}:{pos.line}:{pos.col}: {message} (its first "
                      f"{n:,} events)", file=sys.stderr, flush=True)

    def _dead_ahead(self, pending, ts, record, rows, arrival, ahead) -> None:
        """Dead letters for the kernel-decoded events too far ahead of their arrival:
        one per payload, the events named by their places in it."""
        starts = np.concatenate(([0], np.cumsum(rows)[:-1]))
        by_record: dict[int, list[Rejected]] = {}
        for row in np.flatnonzero(ahead):
            r = int(record[row])
            place = None if rows[r] == 1 else int(row - starts[r])
            by_record.setdefault(r, []).append(Rejected(
                ahead_reason(int(ts[row]), int(arrival[r]), self.cfg.max_future), place))
        for r, rejected in by_record.items():
            rec = pending.record(r)[0]
            self.counts["malformed"] += len(rejected)
            self._dead_count("ahead", len(rejected))
            self.dead.write(dead_letter(rec.offset, rec.topic, rec.payload, len(rec.payload),
                                        rejected))

    def _ingest(self, record: Record) -> None:
        """A record read in Python (``PayloadReader``: the map, JSON, what the kernel
        left to the validator): its rejections dead-lettered now, its events pending
        after the decoder's rows so far (they become columns with the events read in
        Python after them: ``_piece``)."""
        events, rejected = self.reader.read(record)
        topic_map = self.reader.map
        if topic_map is not None and len(topic_map.unnamable) > self._unnamable_said:
            for line in topic_map.unnamable_lines(self._unnamable_said):
                print(f"dqcep: {topic_map.source}: {line}", file=sys.stderr, flush=True)
            self._unnamable_said = len(topic_map.unnamable)
        if rejected:
            payload = record.payload
            self.counts["malformed"] += len(rejected)
            for r in rejected:
                self._dead_count("payload" if r.index is None else "event")
            kept = payload if isinstance(payload, bytes) and len(payload) <= MAX_PAYLOAD \
                else None  # never the bytes of a payload over the limit
            size = len(payload) if isinstance(payload, bytes) else payload.size
            self.dead.write(dead_letter(record.offset, record.topic, kept, size, rejected))
        if self.decoder.rows:  # the kernel's rows before it keep their place
            self._piece()
        self._read_events += events
        self._pending.append((record, len(events), events))
        self._pending_rows += len(events)

    def _run(self, end: int, step):
        """The journal's records up to offset ``end`` through the pipeline: ``step(write,
        through)`` runs it (``Pipeline.process`` for a batch, ``Pipeline.tick`` for a
        tick). A database output commits that progress with the matches; while catching
        up to it (``_catch_up``) they are already there."""
        through = Progress(end + 1, False) if self.database else None
        out = step(not self._replaying, through)
        if out.matches is not None and len(out.matches):
            if through and not self._replaying:
                self.db_written = end + 1  # committed once the sink is synced (a checkpoint)
            self._keep_last(out.matches)
        return out

    def _keep_last(self, batch) -> None:
        """The newest matches, for the HTTP side's page and ``/status`` (only when it is
        on: the conversion is per match): each with its detection time as people read
        it (``detected``) and, with ``--returns``, its RETURN values."""
        if self.board is None and not self.cfg.last_matches:
            return
        for m in last_matches(batch, LAST_MATCHES):
            if self.returns is not None:
                m = self.returns.fill(m)
            obj = m.to_json_obj(with_returns=True)
            obj["detected"] = readable_time(m.detected_at)
            self.last_matches.append(obj)

    def _misdeclared(self, refused, offset_of) -> None:
        """Events a declared schema refused (``EVENT Type(...)``): dead letters with the
        journal offset of their payload (``offset_of(event id)``), counted malformed."""
        for event_id, why in refused:
            self.counts["malformed"] += 1
            self._dead_count("schema")
            self.dead.write({"offset": offset_of(event_id), "event": event_id,
                             "reason": why})

    def _stopped(self, stopped, offset: int) -> None:
        """Queries the engine stopped by their budget in the batch that ends at journal
        offset ``offset``: a line on stderr and a dead letter each (the stats list them).
        The stop is in the engine's state: a replay from an earlier checkpoint stops the
        query again, and the dead-letter file is cut back to the checkpoint with it."""
        for query, why in stopped:
            print(f"dqcep: {why}", file=sys.stderr, flush=True)
            self._dead_count("stopped")
            self.dead.write({"offset": offset, "query": query, "reason": why})

    def _lost(self, offset: int, gap: Gap) -> None:
        """Journal records that cannot be read: reported, counted, and passed over."""
        last = offset + gap.count - 1
        what = f"journal record {offset}" if gap.count == 1 else \
            f"journal records {offset}..{last}"
        print(f"dqcep: {what} cannot be read ({gap.reason}); going on after them",
              file=sys.stderr, flush=True)
        self.counts["journal_lost"] += gap.count
        self._dead_count("journal_lost", gap.count)
        self.dead.write({"offset": offset, "records": gap.count,
                         "reason": f"{what} lost: {gap.reason}"})
        self.offset = last + 1

    def _dead_count(self, reason: str, n: int = 1) -> None:
        """A dead letter's reason counted (``dead_letters`` in the stats, the metrics'
        ``reason`` label; checkpointed with the other counters)."""
        key = DEAD + reason
        self.counts[key] = self.counts.get(key, 0) + n

    def _write_late(self, record: Record, events: list | None, late: dict[int, str]) -> None:
        """The events of a pending record that came late, as they were read, with why
        (``lateness``: behind its timeline; ``skew``: behind the stream). A payload a
        kernel decoded holds no ``Event`` objects (its columns keep only what the
        queries read): it is read again, whole, for its late events (rare)."""
        if events is None:
            events = self.reader.read(record)[0]
        for e in events:
            if e.id in late:
                self.late.write({"offset": record.offset, "event": e.as_mapping(),
                                 "reason": late[e.id]})

    def _tick(self, record: Record) -> None:
        """A tick: the engine's time moves to its time (spec section 7); what that makes
        final comes out now, its response time measured from the tick's arrival."""
        at = tick_time(record.payload)
        if at is None:  # damage that kept the record whole: a dead letter, passed over
            self._dead_count("tick")
            self.dead.write({"offset": record.offset, "reason": "a tick record without "
                             "a time"})
        else:
            out = self._run(record.offset,
                            lambda write, through: self.pipeline.tick(at, write, through))
            if len(out.matches) and self.arrivals is not None:
                self.response.observe_finalised(out.matches, self.arrivals.of(record.offset),
                                                time.time(), at)
        self.counts["ticks"] = self.counts.get("ticks", 0) + 1
        self.offset = record.offset + 1


class PendingRecords:
    """The next batch's pending records (tuples and ``PendingBlock`` runs) as arrays:
    ``rows`` each gave, ``offsets()``, ``arrival_ms()``, and ``record(i)``: record i
    and its events (None: a kernel decoded it)."""

    def __init__(self, pending: list):
        self.pending = pending
        counts = [p.hi - p.lo if type(p) is PendingBlock else 1 for p in pending]
        self.starts = np.cumsum([0] + counts)  # entry -> its first record
        self.blocks = any(type(p) is PendingBlock for p in pending)
        self.rows = self._each(lambda p: p[1], lambda b: b.rows)
        last = pending[-1]
        self.last_offset = last.block.first + last.hi - 1 if type(last) is PendingBlock \
            else last[0].offset

    def _each(self, single, block) -> np.ndarray:
        """An int64 per record: ``single(tuple)`` or the slice ``block(PendingBlock)``."""
        if not self.blocks:
            return np.fromiter((single(p) for p in self.pending), np.int64, len(self.pending))
        parts, run = [], []
        for p in self.pending:
            if type(p) is PendingBlock:
                if run:
                    parts.append(np.asarray(run, np.int64))
                    run = []
                parts.append(np.asarray(block(p), np.int64))
            else:
                run.append(single(p))
        if run:
            parts.append(np.asarray(run, np.int64))
        return np.concatenate(parts)

    def offsets(self) -> np.ndarray:
        return self._each(lambda p: p[0].offset,
                          lambda b: np.arange(b.block.first + b.lo, b.block.first + b.hi))

    def arrival_ms(self) -> np.ndarray:
        return self._each(lambda p: -1 if p[0].arrival_us is None else p[0].arrival_us // 1000,
                          lambda b: b.block.arrival_ms()[b.lo:b.hi])

    def events(self) -> list:
        return [e for p in self.pending for e in p[2]]  # (no blocks with RETURN)

    def record(self, i: int) -> tuple[Record, list | None]:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        p = self.pending[k]
        if type(p) is PendingBlock:
            return p.block.record(p.lo + i - int(self.starts[k])), None
        return p[0], p[2]
