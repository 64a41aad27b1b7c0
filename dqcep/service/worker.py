"""A worker process of ``dqcep run ... --workers N`` (``dqcep.service.coordinator``
starts them): it hosts query consumers, one ``StreamingService`` per query reading the
coordinator's journal through a ``JournalView``, steps them after every commit, and
checkpoints and reports them. The coordinator and a worker speak in the messages
declared here, as classes (CPython's ``concurrent.futures.process`` declares its
``_CallItem``/``_ResultItem`` alike).

Each query's consumer keeps its checkpoint, dead-letter and late files under
``STATE/queries/NAME/`` and writes its own output (``OUT.NAME.jsonl`` beside a file
output; a topic output is shared): ``query_config``.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, replace
from multiprocessing import shared_memory
from pathlib import Path

from dqcep.io.journal import JournalView
from dqcep.io.journal_tail import BlockCache
from dqcep.io.mapping import SharedReading
from dqcep.io.mqtt import ArrivalTimes
from dqcep.io.sinks import is_remote
from dqcep.service.streaming import ServiceConfig, StreamingService

ARRIVALS = 1 << 16  # journal offsets whose arrival time is kept
LIVE_QUERY = "query.cep"        # in a live-added query's home: its text and declarations
LIVE_START = "start-offset"     # ... and the journal offset its consumer starts at
LIVE_ADMISSION = "admission-at"  # ... after taking the admission of this control record


# ------------------------------------------------------------------ the messages
# What the coordinator and a worker say over their pipe (pickled by multiprocessing).

@dataclass(frozen=True)
class Host:
    """Coordinator -> worker: host this query's consumer, from its checkpoint."""
    query: str


@dataclass(frozen=True)
class Release:
    """Coordinator -> worker: checkpoint this query's consumer and let it go; ``until``:
    the query was removed by the control record there, its records before it first."""
    query: str
    until: int | None = None


@dataclass(frozen=True)
class Order:
    """Coordinator -> worker: step the hosted consumers in this order (the first
    answers first)."""
    queries: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """Coordinator -> worker: drain, checkpoint and end (releasing the held matches on
    an end of stream)."""
    end_of_stream: bool


@dataclass(frozen=True)
class Hosted:
    """Worker -> coordinator: the query is hosted; its consumer starts at ``offset``."""
    query: str
    offset: int


@dataclass(frozen=True)
class Released:
    """Worker -> coordinator: the query is let go, checkpointed at ``offset``."""
    query: str
    offset: int


@dataclass(frozen=True)
class Report:
    """Worker -> coordinator: its consumers' figures (``_report``), by query."""
    worker: int
    reports: dict


@dataclass(frozen=True)
class Failed:
    """Worker -> coordinator: the worker failed, and why (the service ends, exit 1)."""
    worker: int
    reason: str


@dataclass(frozen=True)
class Stopped:
    """Worker -> coordinator: the answer to ``Stop``, with its consumers' last figures."""
    worker: int
    reports: dict


class Wake:
    """The coordinator's nudge to a worker after a commit: a byte on a pipe of its
    own. A ``multiprocessing.Event`` cannot be used: its ``set()`` blocks forever once
    a process that waited on it has died holding its lock (a SIGKILLed worker hung the
    coordinator, SIGTERM included). A write here never blocks: a full pipe already
    holds a nudge, a closed one is a dead worker, which the coordinator's loop sees."""

    def __init__(self, ctx):
        self.reader, self.writer = ctx.Pipe(duplex=False)
        os.set_blocking(self.writer.fileno(), False)

    def set(self) -> None:
        try:
            os.write(self.writer.fileno(), b"\0")
        except (BlockingIOError, BrokenPipeError, ValueError, OSError):
            pass  # a nudge is waiting already / the worker is gone (noticed elsewhere)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


def wait_for_wake(reader, timeout: float) -> None:
    """In a worker: wait for a nudge (or ``timeout``), then take every byte waiting."""
    if reader.poll(timeout):
        os.set_blocking(reader.fileno(), False)
        try:
            while os.read(reader.fileno(), 4096):
                pass
        except BlockingIOError:
            pass


def query_home(cfg: ServiceConfig, query: str) -> Path:
    """Where a query's consumer keeps its checkpoint, dead letters and late events."""
    return Path(cfg.checkpoint).parent / "queries" / query


def removed_home(cfg: ServiceConfig, query: str, offset: int) -> Path:
    """Where a query removed at journal ``offset`` keeps what its consumer left."""
    return query_home(cfg, query).with_name(f"{query}.removed-{offset}")


def query_output(cfg: ServiceConfig, query: str) -> str:
    """A query's own output beside a file output (``out.jsonl`` -> ``out.NAME.jsonl``);
    a topic or webhook output is shared."""
    if is_remote(cfg.output):
        return cfg.output
    out = Path(cfg.output)
    return str(out.with_name(f"{out.stem}.{query}{out.suffix}"))


def set_up_added(cfg: ServiceConfig, query: str, offset: int, text: str) -> None:
    """The home of a query added by the control record at ``offset``: its query file
    (``text``: the change's, with the service's declarations), the offset its consumer
    starts at and the record whose admission it takes first."""
    home = query_home(cfg, query)
    home.mkdir(parents=True, exist_ok=True)
    (home / LIVE_QUERY).write_text(text)
    (home / LIVE_START).write_text(f"{offset + 1}\n")
    (home / LIVE_ADMISSION).write_text(f"{offset}\n")


def query_config(cfg: ServiceConfig, query: str) -> ServiceConfig:
    """The consumer of one query: its own state under STATE/queries/NAME/, its own
    output beside a file output (``out.jsonl`` -> ``out.NAME.jsonl``)."""
    home = query_home(cfg, query)
    home.mkdir(parents=True, exist_ok=True)
    output = query_output(cfg, query)
    if (home / LIVE_QUERY).exists():  # added live: its own text, from its control record on
        admission = home / LIVE_ADMISSION  # (added before dqcep wrote admissions: none)
        cfg = replace(cfg, queries=str(home / LIVE_QUERY),
                      start_offset=int((home / LIVE_START).read_text()),
                      admission_at=int(admission.read_text()) if admission.exists() else None)
    return replace(cfg, checkpoint=str(home / "checkpoint.bin"), output=output,
                   dead_letter=str(home / "dead-letter.jsonl"),
                   late=str(home / "late.jsonl"), hosted=[query], consumer=f"query-{query}",
                   stats_file=None, http=None, last_matches=cfg.http is not None)


# ------------------------------------------------------------------ the process

def worker_main(index: int, cfg: ServiceConfig, durable, wake, arrivals_name: str,
                conn) -> None:
    """A worker: hosts and lets go of query consumers as the coordinator says, steps
    each after every commit, one after the other in the order the coordinator gives
    (``order``: the first answers first), checkpoints each when due
    (``StreamingService.checkpoint_due``), and reports their stats every ``cfg.stats_every`` s."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the coordinator decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    memory = shared_memory.SharedMemory(arrivals_name)
    arrivals = ArrivalTimes(ARRIVALS, memory.buf, fresh=False)
    view = JournalView(cfg.journal, lambda: durable.value)
    # every consumer reads every record: each run of records is read and scanned once
    blocks = BlockCache()
    # ... and, with a map, the compiled map reads each run of them once
    reading = SharedReading(cfg.topic_map) if cfg.topic_map is not None else None
    hosted: dict[str, StreamingService] = {}
    last_stats = time.monotonic()
    # with the HTTP side on, the coordinator's page wants fresh figures
    report_every = min(cfg.stats_every, 1.0) if cfg.http is not None else cfg.stats_every
    try:
        while True:
            while conn.poll():
                message = conn.recv()
                if isinstance(message, Host):
                    q = message.query
                    svc = StreamingService(query_config(cfg, q), journal=view, blocks=blocks,
                                           reading=reading)
                    svc.arrivals = arrivals
                    hosted[q] = svc
                    conn.send(Hosted(q, svc.offset))
                elif isinstance(message, Release):
                    q = message.query
                    svc = hosted.pop(q)
                    if message.until is not None:  # removed: its matches up to the change out
                        _step_through(svc, hosted.values(), until=message.until)
                    svc.checkpoint()
                    svc.close()
                    conn.send(Released(q, svc.offset))
                elif isinstance(message, Order):
                    if sorted(message.queries) != sorted(hosted):
                        raise RuntimeError(f"order {list(message.queries)} is not the queries "
                                           f"hosted ({sorted(hosted)})")
                    hosted = {q: hosted[q] for q in message.queries}
                elif isinstance(message, Stop):
                    report = {}
                    for q, svc in hosted.items():
                        _step_through(svc, hosted.values())
                        if message.end_of_stream:
                            svc.end_stream()
                        svc.checkpoint()
                        svc.error = None  # written: a failure retried before is over
                        report[q] = _report(svc)
                        svc.close()
                    hosted.clear()
                    conn.send(Stopped(index, report))
                    return
                else:
                    raise RuntimeError(f"a message a worker does not take: {message!r}")
            if os.getppid() != parent:
                return  # the coordinator is gone: its restart takes over from the checkpoints
            wait_for_wake(wake, 0.02)
            for q, svc in hosted.items():
                try:
                    svc.timed_step(deadline=time.monotonic() + cfg.checkpoint_every)
                    if svc.checkpoint_due(time.monotonic()):
                        svc.timed_checkpoint()
                        for other in hosted.values():  # it held their next steps too
                            other.service_times.checkpointed()
                    svc.error = None
                except OSError as err:  # as the single service: back to the checkpoint,
                    # retried until the write goes through (a full disk), unless the
                    # coordinator speaks or is gone meanwhile: then the worker fails
                    svc.recover(err, _Interrupted(conn, parent, lambda: conn.send(
                        Report(index, {q: _report(svc)}))))  # the error, while it lasts
            if time.monotonic() - last_stats >= report_every:
                conn.send(Report(index, {q: _report(svc) for q, svc in hosted.items()}))
                last_stats = time.monotonic()
    except (EOFError, ConnectionError):
        return  # the coordinator is gone (SIGKILL): its restart takes over, nothing to say
    except BaseException as err:  # noqa: BLE001 - the coordinator says it and stops
        try:
            conn.send(Failed(index, f"{type(err).__name__}: {err}"))
        except OSError:
            pass
        raise
    finally:
        memory.close()


def _step_through(svc: StreamingService, others, until: int | None = None) -> None:
    """A consumer stepped through the durable records (up to ``until``). One that
    waits for its admission (a query added live) lets this worker's other consumers
    step meanwhile: the one that reaches its control record first writes it, and that
    may be one of them (consumers on other workers go on by themselves)."""
    while until is None or svc.offset < until:
        if svc.step(until=until):
            continue
        if not svc.waiting_for_admission:
            return
        for other in others:
            if other is not svc:
                other.step()
        time.sleep(0.01)


class _Interrupted:
    """The ``stop`` a consumer's ``recover`` waits on in a worker: set once the
    coordinator has sent a message or is gone (the worker cannot answer while it
    retries). Each wait first reports (``report``: the consumer's stats, its error)."""

    def __init__(self, conn, parent: int, report):
        self.conn, self.parent, self.report = conn, parent, report

    def is_set(self) -> bool:
        return os.getppid() != self.parent or self.conn.poll()

    def wait(self, timeout: float) -> bool:
        self.report()
        deadline = time.monotonic() + timeout
        while not self.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.is_set()


def _report(svc: StreamingService) -> dict:
    """A query consumer's figures for the coordinator (its stats file, its page)."""
    now = time.monotonic()
    q = svc.response.names[0]
    s = svc.stats()
    return {**{k: s[k] for k in ("events_in", "payloads", "matches_out", "malformed", "late",
                                 "error", "stopped", "duplicates", "journal_lost",
                                 "dead_letters", "state_total_bytes", "checkpoint_age_s",
                                 "watermark", "output_backlog", "ticks", "event_time",
                                 "watermark_lag_s", "late_by_reason", "slowest_timelines")},
            "offset": svc.offset, "response": s["response"][q],
            "response_recent": svc.response.take_recent()[q],
            "service": svc.service_times.totals(now),
            "service_recent": svc.service_times.take_recent(now),
            "last_matches": list(svc.last_matches)}
