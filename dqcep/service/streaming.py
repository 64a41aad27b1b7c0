"""``dqcep run ... --input mqtt://...``: the long-lived streaming service.

    MQTT (QoS 1, persistent session) -> journal (fsync, then PUBACK)
        -> decode (bad payloads/events -> dead-letter sink, with the reason)
        -> drop repeated event ids (redelivery)
        -> engine (K-slack reorder; later events -> late sink)
        -> match sink

Nothing is lost and nothing emitted twice across a crash: a checkpoint holds
the journal offset consumed, the engine snapshot, the recent event ids and the
length of every sink file, written atomically with a checksum
(``dqcep.io.checkpoint``). On start the sinks are cut back to those lengths and
the journal is replayed from that offset; the engine is deterministic, so it
writes again exactly what was lost. A write that fails while processing (a full
disk) takes the same road without a restart: the service says why, goes back
to its last checkpoint and tries again a second later.

A database output (``sqlite:///...``, ``postgresql://...``) cannot be cut back:
each batch's rows commit with the journal offset they cover (``dqcep.io.database``),
and on start the journal is replayed from the checkpoint up to that offset without
writing; the checkpoint names the service's stream, so a table written by another
service is refused rather than skipped into.

Stopping (SIGTERM, SIGINT) drains the journal and checkpoints with the matches
held for a trailing NOT still held: a stop is a pause, and the next run goes on
as if there had been none. Only an end of stream (``--until-idle S``, SIGUSR1,
or ``end_of_stream`` set by an embedding program) releases them.
"""
from __future__ import annotations

import hashlib
import itertools
import signal
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from dqcep._kernels.recent_ids import RecentIds
from dqcep.runtime.duplicates import RECENT_IDS, admit_bytes, recent_to_bytes
from dqcep.core.admission import TICK_MS, AdmissionRule
from dqcep.core.errors import UserError
from dqcep.io.database import DatabaseTables, Progress, is_database
from dqcep.io.checkpoint import CheckpointError, recovery_hint, write_checkpoint
from dqcep.io.ingest import MAX_FUTURE_MS, PayloadReader
from dqcep.io.journal import Journal, JournalView, Record, read_journal
from dqcep.io.journal_tail import BlockCache, JournalTail
from dqcep.io.mapping import SharedReading, TopicMap
from dqcep.io.mqtt import ArrivalTimes, MqttSource, MqttUrl
from dqcep.io.readers import SAMPLE_EVENTS, rates_of
from dqcep.io.sinks import BackgroundSink, is_mqtt, open_match_sink
from dqcep.lang import parse_file, to_source
from dqcep.plan import explain_dot
from dqcep.runtime.program import Program, Universe
from dqcep.service.changes import (CONTROL_TOPIC, Admission, ChangeMailbox, ChangeRefused,
                                   ChangeRequest, QuerySet,
                                   read_admission, read_control, requested_change,
                                   write_admission)
from dqcep.service.consumer import DEAD, JournalConsumer
from dqcep.service.http import LAST_MATCHES, PUBLISH_EVERY, Board, HttpAccess, HttpServer
from dqcep.service.recovery import (CHECKPOINT_VERSION, SINKS, Sink, check_fresh_start,
                                    check_table, read_state)
from dqcep.service.response import ResponseTimes, ServiceTimes
from dqcep.service.stats import (query_entries, source_figures, stream_figures,
                                 time_figures, write_stats_file)
from dqcep.runtime import STATE_BUDGET
from dqcep.runtime.adapt import AdaptiveEngine
from dqcep.runtime.pipeline import Pipeline
from dqcep.runtime.returns import ReturnValues

CONSUMER = "service"  # a service's name among the journal's consumers (retention), default
RETRY_SECONDS = 1.0   # pause before going back to the checkpoint after a failed write
CHECKPOINT_SHARE = 0.1  # at most this share of the time goes to periodic checkpoints
MATCHES = "matches."  # counters of each query's matches (dqcep.runtime.pipeline)


@dataclass
class ServiceConfig:
    queries: str
    inputs: list[str]
    journal: str
    checkpoint: str
    output: str
    dead_letter: str
    late: str
    fmt: str | None = None            # payload format; None: each payload's own (detected)
    topic_map: TopicMap | None = None  # the --map file's rules: topics and payloads -> events
    max_future: int = MAX_FUTURE_MS   # ms an event's ts may be ahead of its arrival
    lateness: int = 0                 # spec section 7: L, D (None: L) and K ...
    skew: int | None = None
    timeline: str | None = None
    tick: int = TICK_MS               # ... and a tick after this many ms of silence (0: off)
    checkpoint_every: float = 1.0
    stats_every: float = 10.0
    stats_file: str | None = None
    client_id: str = "dqcep-engine"
    output_format: str = "json"
    output_token_file: str | None = None  # a webhook output's bearer token
    recent_ids: int = RECENT_IDS
    until_idle: float | None = None   # end of stream after this many seconds without input
    journal_retention: int = 0        # bytes of consumed closed segments kept for replay
    journal_segment_bytes: int = 64 * 1024 * 1024  # a segment is closed beyond this size
    state: str | None = None          # the directory the defaults above live in (shown at start)
    materialize: str = "auto"         # which joins keep their records (plan/joins.py)
    adapt: bool = True                # queries move between joins and a chain as measured
    rates: dict | None = None         # events/s per type, for the planner's cost model
    hosted: list[str] | None = None   # the queries of the file this service runs (all)
    consumer: str = CONSUMER          # its name among the journal's consumers (retention)
    budget: int = STATE_BUDGET        # partial matches one buffer of a query may hold
    returns: bool = False             # matches with their RETURN values (--returns)
    http: HttpAccess | None = None    # the HTTP side (--http), off when None
    last_matches: bool = False        # keep the newest matches (a worker's, for the page)
    start_offset: int = 0             # where a consumer with no checkpoint starts (a
                                      # query added live to workers: its control record)
    admission_at: int | None = None   # ... and the control record whose admission it
                                      # takes (``changes.Admission``) before it starts


    @property
    def admission_rule(self) -> AdmissionRule:
        return AdmissionRule(self.lateness, self.skew, self.timeline)


def hosted_queries(query_file, hosted: list[str] | None, source: str) -> list:
    """The queries of a parsed file named in ``hosted`` (all of them for None), in the
    file's order; a name the file does not have is an error."""
    if hosted is None:
        return list(query_file.queries)
    names = [q.name for q in query_file.queries]
    unknown = [n for n in hosted if n not in names]
    if unknown or not hosted:
        raise UserError(f"{source} has no query {', '.join(map(repr, unknown))} (its "
                        f"queries: {', '.join(names)})" if unknown else
                        "a service hosts at least one query")
    return [q for q in query_file.queries if q.name in hosted]


class StreamingService(JournalConsumer):
    """Consumes the journal into the engine and the sinks. It writes the journal itself
    (``run`` subscribes) unless given ``journal``: a ``JournalView`` of a journal that
    another process writes (a worker of ``dqcep.service.worker``, which calls
    ``timed_step`` and ``timed_checkpoint`` itself)."""

    def __init__(self, cfg: ServiceConfig, journal: JournalView | None = None,
                 blocks: BlockCache | None = None, reading: SharedReading | None = None):
        self.cfg = cfg
        self.blocks = blocks  # journal blocks shared with the process's other consumers
        self.reading = reading  # ... and the compiled map's reading of them (``--map``)
        self.urls = [MqttUrl.parse(u, subscribe=True) for u in cfg.inputs]
        own = [u.topic for u in self.urls if u.topic.startswith(CONTROL_TOPIC.split("/")[0])]
        if own:  # the service's own records: no device may write them
            raise UserError(f"--input topic {own[0]}: topics under "
                            f"{CONTROL_TOPIC.split('/')[0]}/ are the service's own")
        self.reader = PayloadReader(cfg.fmt, cfg.topic_map, cfg.max_future)
        query_file = parse_file(cfg.queries)
        queries = hosted_queries(query_file, cfg.hosted, cfg.queries)
        # the query set of the file; a checkpoint after a live change holds its own
        self.file_set = QuerySet(queries, {}, query_file.schemas, query_file.tables)
        self.query_tables = query_file.tables
        self.board: Board | None = None
        self.source: MqttSource | None = None  # while run() runs: the HTTP side's changes
        # changes from the HTTP side, taken on this service's thread (``_take_changes``)
        self.mailbox = ChangeMailbox()
        self._answering: dict[int, ChangeRequest] = {}  # by control record offset
        self._next_set: QuerySet | None = None  # the set after the changes journaled
        # lookup tables: read at the start, again before a batch when due (one snapshot
        # per batch); kept across a recovery
        self.tables = DatabaseTables(query_file.tables) if query_file.tables else None
        state = read_state(cfg.checkpoint)
        low = 0 if state is None else max(state["offset"], state["journal_end"])
        self.journal = journal if journal is not None else \
            Journal(cfg.journal, cfg.journal_segment_bytes, min_next_offset=low)
        if state is None:
            check_fresh_start(cfg.checkpoint, cfg.journal,
                              (cfg.output, cfg.dead_letter, cfg.late))
        self.error: str | None = None  # a failed write being retried, while it lasts
        # the stream a database output's progress row names (in every checkpoint)
        self.stream = (state or {}).get("stream") or uuid.uuid4().hex
        # when each journal offset arrived (the MQTT source's, while it runs; a catch-up
        # at start replays without it), and what the service measures
        self.arrivals: ArrivalTimes | None = None
        self.response = ResponseTimes([q.name for q in queries])
        self.service_times = ServiceTimes(time.monotonic())
        self.checkpointed_at: float | None = None  # time.monotonic() of the last one
        self._checkpoint_seconds = 0.0  # ... and the time it held the service thread
        self._in_flight: tuple[Future, int] | None = None  # one being written, its offset
        self.last_matches: deque = deque(maxlen=LAST_MATCHES)  # for the HTTP side
        self._recent: dict = {}  # the last stats line's figures of its period
        self._load(state)
        self._next_set = self._set_after_journal()
        if self.database and (state is None or "stream" not in state):
            self.checkpoint()  # the stream named durably before any row is written
        self.started = time.monotonic()

    # ------------------------------------------------------------ state
    def _use_queries(self, query_set: QuerySet, program: Program) -> None:
        """The query set the service runs from now on, and its program."""
        self.query_set, self.queries = query_set, list(query_set.queries)
        self.program, self.plan = program, program.plan
        self.query_texts = {q.name: to_source(q) for q in self.queries}
        self.response.rename([q.name for q in self.queries])
        plan_dot = explain_dot(self.plan)
        self.plan_version = hashlib.sha1(plan_dot.encode()).hexdigest()[:12]
        if self.cfg.http is not None:
            if self.board is None:
                self.board = Board(plan_dot)
            self.board.set_plan(plan_dot)

    def _engine_of(self, state: dict | None) -> tuple[QuerySet, AdaptiveEngine]:
        """The query set and a fresh engine of the program a checkpoint's state was
        written by: the file's, unless queries were changed live (then the checkpoint
        holds the set and the universe of the engine's codes), run as the engine ran
        them (the constructions it had moved its queries to). The engine is planned as
        ``dqcep run`` plans one (``--materialize``, ``--rates``) and, with ``--adapt
        on``, moves its queries between joins and a chain as it measures them."""
        cfg = self.cfg
        universe = None
        if state is None or not state.get("query_set"):
            query_set = self.file_set
        else:
            query_set = QuerySet.from_obj(state["query_set"], self.file_set, cfg.checkpoint)
        if state is not None and state.get("universe"):
            types, attrs, constants = state["universe"]
            universe = Universe(tuple(types), tuple(attrs), tuple(constants))
        # the rates it was planned with: a checkpoint's; else --rates (none: {}); else, at
        # a fresh start, measured on what the journal holds (a backlog, a late worker)
        if state is not None and "rates" in state:
            rates = state["rates"]
        elif cfg.rates or state is not None:
            rates = cfg.rates
        else:
            rates = self._journal_rates()
        engine = AdaptiveEngine(
            query_set.queries, rates=rates, materialize=cfg.materialize,
            schemas=query_set.schemas, tables=query_set.tables, lateness=cfg.admission_rule,
            lookup_source=self.tables, budget=cfg.budget, adapt=cfg.adapt,
            constructions=(state or {}).get("constructions") or None,
            epochs=query_set.live_epochs, universe=universe)
        return query_set, engine

    def _journal_rates(self) -> dict[str, float] | None:
        """Events per second of each type among the first events the journal holds from
        where this service starts (``readers.rates_of``, as ``dqcep run`` measures a
        file's), read as the service will read them; None when it holds none yet: the
        adaptive engine then corrects the plan as it measures its queries."""
        events = []
        records = read_journal(self.cfg.journal, self.cfg.start_offset, include_open=True,
                               upto=self.journal.durable_offset)
        for record in itertools.islice(records, SAMPLE_EVENTS):  # (records without events)
            if record.topic != CONTROL_TOPIC:
                events += self.reader.read(record)[0]
                if len(events) >= SAMPLE_EVENTS:
                    break
        return rates_of(events[:SAMPLE_EVENTS])

    def _load(self, state: dict | None) -> None:
        """Engine, offsets and sinks as the checkpoint left them (fresh without one)."""
        cfg = self.cfg
        query_set, engine = self._engine_of(state)
        self._use_queries(query_set, engine.program)
        sizes = dict.fromkeys(SINKS, 0)
        self.offset, self.counts = cfg.start_offset, {}
        # a query added live to workers starts after its control record, with the
        # admission the records before it left (``_take_admission``)
        self._admission_at = cfg.admission_at if state is None else \
            state.get("admission_at")
        self.ended_at: int | None = None  # the journal offset of the last end of stream
        self.recent = RecentIds(cfg.recent_ids)
        if state is not None:
            try:
                engine.restore(state["engine"])
            except Exception as err:  # noqa: BLE001 - any failure means: not this state
                raise CheckpointError(f"checkpoint {cfg.checkpoint} holds no engine state "
                                      f"for these queries ({err}); "
                                      f"{recovery_hint(cfg.checkpoint)}") from None
            self.offset, sizes, self.counts = state["offset"], state["sinks"], state["counts"]
            self.ended_at = state.get("ended_at")
            admit_bytes(self.recent, state["recent"])
        self.engine = engine
        # RETURN values: from the events kept since the engine's store reaches back
        self.returns = ReturnValues(self.queries, engine, self.query_tables, self.tables) \
            if cfg.returns else None
        if self.returns is not None and state is not None and state.get("returns"):
            self.returns.restore(state["returns"])
        self.counts = {"payloads": 0, "events_in": 0, "matches_out": 0, "malformed": 0,
                       "duplicates": 0, "late": 0, "journal_lost": 0, "ticks": 0,
                       **self.counts}
        self.decoder = engine.column_decoder()  # after restore, which replaces it
        self._loaded_at = time.monotonic()  # (``checkpoint_due`` before the first one)
        self._nothing_pending()
        self._unseen_said = False  # the queries' unseen types and attributes (once)
        self._unnamable_said = 0   # the map's (rule, attribute) pairs no query can name
        self.out = self.dead = self.late = None
        self.database = is_database(cfg.output)
        self.out = open_match_sink(cfg.output, cfg.output_format, keep=sizes["output"],
                                   token_file=cfg.output_token_file,
                                   with_returns=cfg.returns)
        try:
            written = self.out.claim(self.stream) if self.database else None
            check_table(cfg.output, cfg.checkpoint, written,
                        (state or {}).get("db_written"))
        except BaseException:
            self.out.close()
            raise
        # the journal offset the table's rows are known to cover (in every checkpoint)
        self.db_written = max((state or {}).get("db_written") or 0,
                              written.offset if written else 0) if self.database else None
        if not is_mqtt(cfg.output) and not cfg.returns:
            self.out = BackgroundSink(self.out)  # output overlaps matching; sync waits
        self.dead = Sink(cfg.dead_letter, sizes["dead_letter"])
        self.late = Sink(cfg.late, sizes["late"])
        self.tail = JournalTail(cfg.journal, self.offset, self.blocks)
        self._replaying = False
        self.pipeline = Pipeline(engine, self.out, recent=self.recent, returns=self.returns,
                                 tables=self.tables, counts=self.counts)
        if written is not None:
            try:
                self._catch_up(written)
            except BaseException:
                self._unload()
                raise

    def _set_after_journal(self) -> QuerySet | None:
        """The query set as it will be once the changes the journal holds beyond the
        checkpoint are applied (None: there are none): what a change over HTTP is
        checked against while a restart replays them (it was checked against the
        checkpoint's set: a duplicate add answered 200, a DELETE of a query added
        there 404). A change the replay will refuse leaves the set as it was."""
        if self.cfg.consumer != CONSUMER:
            return None
        query_set, changed = self.query_set, False
        for record in self.journal.read(self.offset):
            if record.topic != CONTROL_TOPIC or not isinstance(record.payload, bytes):
                continue
            try:
                query_set, _ = query_set.after(read_control(record.payload), record.offset)
                changed = True
            except (UserError, ValueError, KeyError):
                continue  # refused again where the replay reaches it
        return query_set if changed else None

    def _catch_up(self, written: Progress) -> None:
        """The journal from the checkpoint up to what the database output already
        holds, processed without writing a row (the engine is deterministic: these are
        the matches it holds); the end of the stream too, if that was written."""
        if written.offset > self.journal.durable_offset:
            raise CheckpointError(
                f"{self.cfg.output} holds matches up to journal offset {written.offset}, "
                f"but the journal {self.cfg.journal} ends at {self.journal.durable_offset}: "
                "that table was not written from this journal; give the service a table "
                "of its own (?table=NAME)")
        # The table's end of stream is one the checkpoint's state has not seen when the
        # checkpoint is older: before its offset, or at it but taken before the end.
        # A checkpoint past it, or taken after it, holds matches of a later stream (a
        # pause's held matches): ending the stream again here would count them and never
        # write them.
        flush = written.flushed and (self.offset < written.offset or (
            self.offset == written.offset and self.ended_at != written.offset))
        self._replaying = True
        try:
            while self.offset < written.offset:
                if not self.step(until=written.offset):
                    raise CheckpointError(f"the journal {self.cfg.journal} cannot be read "
                                          f"up to offset {written.offset}")
            if flush:
                self.end_stream()
        finally:
            self._replaying = False

    def _unload(self) -> None:
        """Let go of the sinks and the tail without writing (after a failed write). A
        checkpoint in flight is written or not when the output's writer ends; a start
        or a recovery reads whichever file is there, and its offset is told to the
        journal with the next one."""
        self._in_flight = None
        for sink in (self.out, self.dead, self.late):
            if sink is None:
                continue
            try:
                sink.close()
            except OSError:
                pass  # what it could not write is written again from the checkpoint
        self.tail.close()

    # ------------------------------------------------------------- processing

    def timed_step(self, deadline: float) -> int:
        """``step`` until ``deadline``, its time (and the delay since its first record
        arrived) counted in ``service_times``; returns records consumed."""
        started, first, arrived = time.monotonic(), self.offset, time.time()
        n = self.step(deadline=deadline)
        if n:
            delay = arrived - self.arrivals.of(first) if self.arrivals is not None else None
            self.service_times.add(time.monotonic() - started, n, delay)
        return n

    def checkpoint_due(self, now: float) -> bool:
        """Whether a periodic checkpoint is due at ``now`` (time.monotonic):
        ``checkpoint_every`` s have passed since the last and, where the last one took
        long, long enough that checkpoints take at most CHECKPOINT_SHARE of the time (a
        large state is written less often; a crash replays more of the journal, and the
        output stays exactly once). Issue 49 item 13: an 857 MB state was rewritten
        every second. (An idle service still writes its own: `dqcep calibrate` measures
        those.)"""
        if not self.checkpoint_done():
            return False  # the last one is still being written
        last = self.checkpointed_at if self.checkpointed_at is not None else self._loaded_at
        wait = max(self.cfg.checkpoint_every,
                   self._checkpoint_seconds * (1 - CHECKPOINT_SHARE) / CHECKPOINT_SHARE)
        return now - last >= wait

    def timed_checkpoint(self) -> None:
        """A periodic ``checkpoint``, written while the service goes on; the time it
        held the service thread counted in ``service_times``."""
        self.checkpoint(wait=False)
        self.service_times.add_checkpoint(self._checkpoint_seconds)

    def _change(self, record: Record) -> None:
        """A control record: the query set changes here, every record before it
        processed under the old set, every one after it under the new. A worker's
        consumer (one query of the file) leaves changes to its coordinator."""
        try:
            self._apply_change(record)
        finally:
            self.offset = record.offset + 1

    def _apply_change(self, record: Record) -> None:
        if self.cfg.consumer != CONSUMER:  # a worker's query consumer
            self._hand_over_admission(record)
            return
        try:
            change = read_control(record.payload)
            req = self._answering.get(record.offset)  # parsed when it was requested
            new, names = self.query_set.after(change, record.offset,
                                              req.added if req is not None else None)
            what = f"{'added' if change['op'] == 'add' else 'removed'} {', '.join(names)}"
            # planned with the engine's own rates and materialization, in place
            self.engine.change_queries(new.queries, new.live_epochs, schemas=new.schemas,
                                       tables=new.tables)
        except (UserError, ValueError, KeyError) as err:  # journaled by another version
            self._dead_count("change")
            self.dead.write({"offset": record.offset, "reason": f"change refused: {err}"})
            print(f"dqcep: journal record {record.offset}: change refused: {err}",
                  file=sys.stderr, flush=True)
            req = self._answering.pop(record.offset, None)
            if req is not None:
                req.answer(409, {"error": f"change refused where it was applied: {err}"})
            return
        engine = self.engine
        self._use_queries(new, engine.program)
        self.decoder = engine.column_decoder()
        if self.returns is not None:
            self.returns = self.pipeline.returns = self.returns.for_engine(
                self.queries, engine, self.query_tables)
        if not self._replaying:
            print(f"dqcep: queries {what} at journal record {record.offset}; running "
                  f"{', '.join(self.query_set.names)}", file=sys.stderr, flush=True)
        req = self._answering.pop(record.offset, None)
        if req is not None:  # the set after it runs
            req.applied(names, self.query_set.names)

    def _hand_over_admission(self, record: Record) -> None:
        """A worker's consumer at an add: what its engine admits by, for the added
        query's consumer, which starts after the record (``_take_admission``)."""
        try:
            if read_control(record.payload)["op"] != "add":
                return
        except (ValueError, KeyError):
            return  # dead-lettered by the coordinator
        write_admission(self.cfg.journal, record.offset, Admission(
            self.engine.max_seen, self.engine.wm,
            recent_to_bytes(self.recent), self.engine.timeline_values()))

    def _take_admission(self) -> bool:
        """A query added live to workers, before its first record: the admission its
        control record left (written by a running consumer that reached it), so that it
        admits what the single service does. False: not written yet."""
        found = read_admission(self.cfg.journal, self._admission_at)
        if found is None:
            return False
        self.engine.max_seen, self.engine.wm = found.max_seen, found.wm
        self.engine.add_timelines(found.timelines)
        admit_bytes(self.recent, found.recent)
        self._admission_at = None
        return True

    @property
    def waiting_for_admission(self) -> bool:
        return self._admission_at is not None

    # ------------------------------------------------------- changes over HTTP
    def http_change(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        """``POST /queries`` (body: query text) and ``DELETE /queries/NAME``, from the
        HTTP side's threads: handed to this service's thread (``_take_changes``), which
        checks, journals and applies it; answered once the set after it runs (202:
        journaled, not applied within the mailbox's wait). Returns (HTTP status,
        answer)."""
        if self.source is None:
            return 503, {"error": "the service is not running"}
        return self.mailbox.request(method, path, body)

    def _take_changes(self) -> None:
        """The change requests waiting, on this service's thread: each checked against
        the query set as it will be once the changes journaled before are applied, and
        journaled as a control record; ``_change`` answers it when it applies it."""
        while (req := self.mailbox.take()) is not None:
            try:
                change = requested_change(req.method, req.path, req.body,
                                          self._next_set or self.query_set)
            except ChangeRefused as err:
                req.answer(err.code, {"error": err.message})
                continue
            try:
                offset = self.source.journal_record(CONTROL_TOPIC, change.payload)
            except (UserError, OSError) as err:
                req.answer(503, {"error": f"cannot write the journal: {err}; the change "
                                          "is applied once the journal is written again"})
                continue
            self._next_set = change.after
            req.journaled_at(offset, change, self.query_set.names)
            self._answering[offset] = req

    def end_stream(self) -> None:
        """The stream is closed: the matches held for a trailing NOT go out."""
        through = Progress(self.offset, True) if self.database else None
        out = self.pipeline.end(not self._replaying, through)
        if len(out.matches):
            if through and not self._replaying:
                self.db_written = self.offset
            self._keep_last(out.matches)
        self._stopped(out.stopped, self.offset)
        self.ended_at = self.offset
        self._report_unseen()

    def checkpoint(self, wait: bool = True) -> None:
        """A checkpoint: the journal offset consumed, the engine's snapshot and the
        length of every sink, written once the matches before it are on disk. The state
        is taken now; where the output has a writer thread (``BackgroundSink``) that
        thread syncs the output and writes the file when it gets there. ``wait``
        False: the service goes on meanwhile (Flink's asynchronous part of a snapshot)
        and ``checkpoint_done`` finishes it; one is in flight at a time, in order."""
        self.checkpoint_done(wait=True)
        started = time.monotonic()
        state = {
            "offset": self.offset, "journal_end": self.journal.durable_offset,
            "engine": self.engine.snapshot(),
            "recent": recent_to_bytes(self.recent),
            "admission_at": self._admission_at,
            "counts": dict(self.counts), "stream": self.stream,
            "sinks": {"dead_letter": self.dead.sync(), "late": self.late.sync()},
            "ended_at": self.ended_at, "db_written": self.db_written,
            "returns": None if self.returns is None else self.returns.snapshot(),
            # after a live change: the query set; after a change or a move: the codes
            # the engine's state uses
            "query_set": None if self.query_set is self.file_set else self.query_set.to_obj(),
            "universe": None if self.program.based_on is None else
            [list(u) for u in self.program.universe],
            # how the engine runs its queries (moved between joins and a chain), and the
            # rates it was planned with (a restart plans the same program)
            "constructions": dict(self.engine.overrides),
            "rates": dict(self.engine.source.rates)}

        def write(output_length: int | None) -> None:
            state["sinks"]["output"] = output_length
            write_checkpoint(self.cfg.checkpoint, CHECKPOINT_VERSION, state)

        if isinstance(self.out, BackgroundSink):
            written = self.out.synced(write)
        else:
            written = Future()
            write(self.out.sync())
            written.set_result(None)
        self._in_flight = (written, self.offset)
        # the service thread's part: what a periodic checkpoint holds it up
        self._checkpoint_seconds = time.monotonic() - started
        if wait:
            self.checkpoint_done(wait=True)

    def checkpoint_done(self, wait: bool = False) -> bool:
        """Whether no checkpoint is in flight: the one in flight, once written, finished
        (its offset told to the journal, retention applied); ``wait``: until it is.
        Raises what failed it (an OSError: back to the last checkpoint)."""
        if self._in_flight is None:
            return True
        written, offset = self._in_flight
        if not wait and not written.done():
            return False
        self._in_flight = None
        written.result()
        self.journal.checkpointed(self.cfg.consumer, offset)
        self.journal.trim(self.cfg.journal_retention)
        self.checkpointed_at = time.monotonic()
        return True

    def recover(self, err: OSError, stop: threading.Event) -> None:
        """After a failed write: back to the last checkpoint (sinks cut back, engine
        restored), after a pause; the journal is read again from its offset."""
        what = getattr(err, "filename", None) or "the service's state"
        message = f"cannot write {what}: {err.strerror or err}"
        if message != self.error:
            print(f"dqcep: {message}; going back to the last checkpoint, retrying every "
                  f"{RETRY_SECONDS:g} s", file=sys.stderr, flush=True)
        self.error = message
        self._unload()
        last_stats = time.monotonic()
        while True:
            stop.wait(RETRY_SECONDS)
            try:
                self._load(read_state(self.cfg.checkpoint))
                return
            except OSError:
                if stop.is_set():
                    raise
                if time.monotonic() - last_stats >= self.cfg.stats_every:
                    self._write_stats()  # the stats say FAILING while it lasts
                    last_stats = time.monotonic()
                if self.board is not None:
                    self.board.publish(self.status())

    def stats(self) -> dict:
        """The figures of the stats line, the stats file, ``/status`` and ``/metrics``
        (docs/operations.md names each)."""
        now = time.monotonic()
        names = [q.name for q in self.queries]
        plain = {k: v for k, v in self.counts.items()
                 if not k.startswith((DEAD, MATCHES))}
        stopped = self.engine.stopped
        return {**plain, "lag_records": self.journal.durable_offset - self.offset,
                **time_figures(self.engine), "error": self.error,
                "stopped": stopped,
                "response": self.response.totals(histogram=True),
                "service": self.service_times.totals(now),
                "dead_letters": {k[len(DEAD):]: v for k, v in self.counts.items()
                                 if k.startswith(DEAD)},
                "matches_by_query": {n: self.counts.get(MATCHES + n, 0) for n in names},
                "state_bytes": self.engine.query_state_bytes(),
                "state_total_bytes": self.engine.state_bytes(),
                "checkpoint_age_s": None if self.checkpointed_at is None
                else now - self.checkpointed_at,
                "output_backlog": self.out.backlog if isinstance(self.out, BackgroundSink)
                else 0,
                **stream_figures(names=names, events_in=self.counts["events_in"],
                                 stopped=stopped, error=self.error, started=self.started,
                                 now=now, inputs=self.cfg.inputs, state=self.cfg.state,
                                 journal=self.cfg.journal)}

    def status(self, source: MqttSource | None = None) -> dict:
        """``/status``: the stats, the last stats line's recent figures, the query set,
        the newest matches."""
        s = source_figures({**self.stats(), **self._recent}, source)
        s["queries"] = query_entries(self.query_set, self.query_texts,
                                     [q.name for q in self.queries])
        s["plan_version"] = self.plan_version
        s["last_matches"] = list(self.last_matches)
        return s

    def _write_stats(self, source: MqttSource | None = None) -> None:
        s = source_figures(self.stats(), source)
        s["response_recent"] = recent = self.response.take_recent()
        s["service_recent"] = self.service_times.take_recent(time.monotonic())
        self._recent = {k: s[k] for k in ("response_recent", "service_recent")}
        measured = ", ".join(f"{q} {r['mean_ms']:.1f}" for q, r in recent.items()
                             if r["mean_ms"] is not None)
        print(f"dqcep: events in {s['events_in']}, matches out {s['matches_out']}, late "
              f"{s['late']}, malformed {s['malformed']}, duplicates {s['duplicates']}, lag "
              f"{s['lag_records']} records, {s['events_per_s']:,.0f} events/s"
              + (f"; response ms: {measured}" if measured else "")
              + (f"; journal records lost {s['journal_lost']}" if s["journal_lost"] else "")
              + (f"; STOPPED by their budget: {', '.join(s['stopped'])}" if s["stopped"]
                 else "")
              + (f"; FAILING: {s['error']}" if s["error"] else ""),
              file=sys.stderr, flush=True)
        write_stats_file(self.cfg.stats_file, s)

    def close(self) -> None:
        """Close files without a checkpoint: what a crash leaves, minus the torn writes."""
        self._unload()
        self.journal.close()
        if self.tables is not None:
            self.tables.close()

    # ------------------------------------------------------------------- run
    def run(self, stop: threading.Event, end_of_stream: threading.Event | None = None) -> int:
        """Serve until ``stop`` (a pause: held matches stay in the checkpoint) or an end
        of stream (``end_of_stream`` set, or ``until_idle`` seconds without input: held
        matches are released). Returns the exit code."""
        end_of_stream = end_of_stream or threading.Event()
        http = None
        if self.board is not None:  # a port in use is refused before anything starts
            http = HttpServer(self.board, self.cfg.http, self.http_change)
            self.board.publish(self.status())
        source = self.source = MqttSource(self.urls, self.journal, self.cfg.client_id)
        self.arrivals = source.arrivals
        source.start()
        where = f"; state in {self.cfg.state}" if self.cfg.state else ""
        where += f"; http on {http.url}" if http is not None else ""
        print(f"dqcep: listening on {', '.join(self.cfg.inputs)}{where}", file=sys.stderr,
              flush=True)
        if http is not None:
            http.start()
        last_stats = last_input = last_publish = time.monotonic()
        failure = None
        try:
            while not stop.is_set() and not end_of_stream.is_set():
                source.committed.clear()  # set again by the next commit
                if source.failure:
                    failure = source.failure
                    break
                now = time.monotonic()
                ticks_before = self.counts.get("ticks", 0)
                try:
                    n = self.timed_step(deadline=now + self.cfg.checkpoint_every)
                    now = time.monotonic()
                    if self.checkpoint_due(now):
                        self.timed_checkpoint()
                    self.error = None
                except OSError as err:
                    self.recover(err, stop)
                    continue
                if now - last_stats >= self.cfg.stats_every:
                    self._write_stats(source)
                    last_stats = now
                if self.board is not None and now - last_publish >= PUBLISH_EVERY:
                    self.board.publish(self.status(source))
                    last_publish = now
                if n > self.counts.get("ticks", 0) - ticks_before:  # not only ticks
                    last_input = now
                elif self.cfg.until_idle is not None and \
                        now - last_input >= self.cfg.until_idle:
                    end_of_stream.set()
                elif source.tick_if_silent(self.cfg.tick) is None:
                    source.committed.wait(0.02)  # new records, or a look at stop
        finally:
            committed = source.stop()
            if http is not None:
                http.close()
        if failure is None:
            try:
                while self.step():           # drain
                    pass
                if end_of_stream.is_set():
                    self.end_stream()
                self.checkpoint()
            except OSError as err:
                failure = (f"cannot write {getattr(err, 'filename', None) or 'the state'}: "
                           f"{err.strerror or err}; the last checkpoint stands")
        self._write_stats(source)
        try:
            self.close()
        except (OSError, UserError) as err:  # JournalWriteError: the last commit failed
            reason = getattr(err, "strerror", None) or err
            failure = failure or f"cannot close the journal: {reason}"
        if failure is None and not committed:
            failure = (f"{source.write_error}: messages not journaled were not acknowledged; "
                       "the broker sends them again to the next run")
        if failure is not None:
            print(f"dqcep: {failure}", file=sys.stderr, flush=True)
            return 1
        return 0


def serve(cfg: ServiceConfig) -> int:
    stop, end_of_stream = threading.Event(), threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: end_of_stream.set())
    return StreamingService(cfg).run(stop, end_of_stream)
