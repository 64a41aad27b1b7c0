"""``dqcep run ... --input mqtt://... --workers N``: the streaming service as worker
processes.

    coordinator: MQTT (QoS 1) -> journal (fsync, then PUBACK); placement; stats
        -> worker 1: a consumer per query it hosts (journal -> engine -> sinks)
        -> worker 2: ...

The coordinator writes the one journal, as the single service does, and after each
commit publishes the durable offset (a shared value) and wakes the workers; the
arrival time of every offset is in shared memory, so workers measure response times.
Each **query** is a consumer of the journal of its own (``StreamingService`` hosting
that query, reading through a ``JournalView``) with its own checkpoint, dead-letter
and late files under ``STATE/queries/NAME/`` and its own output (``OUT.NAME.jsonl``
beside a file output; a topic output is shared). A worker hosts any number of them.

Moving a query is its checkpoint: the worker that hosts it checkpoints it and lets
it go; the worker that takes it over restores that checkpoint and goes on from its
journal offset. The engine is deterministic and the output is cut back to the
checkpoint's length, so nothing is lost or repeated across a move, as across a
restart. Queries placed on different workers share no vertex; one worker does not
share vertices between its queries either (each query's state moves alone).

With ``--target`` and ``--calibration`` the coordinator re-plans: every
``replan_every`` seconds it places the queries by the model (``dqcep.service.scaling.model``) for
the arrival rate measured over that time (the journal's records, not what the
workers take in, which includes catching up after a move), one worker more than the
model says when a query's measured response time is above its high water-mark, and
applies a new placement by moving queries and starting or stopping workers; it scales
down only when every query has been below its low water-mark for ``down_after``
re-plans in a row. The responses measured in the re-plan right after a new placement
show its moves, not the placement: they neither add nor remove a worker.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path

from dqcep.service.scaling.model import Calibration, in_turn_order
from dqcep.core.errors import UserError
from dqcep.io.checkpoint import read_checkpoint
from dqcep.io.journal import Journal, JournalView, forget_consumer
from dqcep.io.mqtt import ArrivalTimes, MqttSource, MqttUrl
from dqcep.io.sinks import is_remote
from dqcep.lang import parse_file, to_source
from dqcep.plan import build_plan, explain_dot
from dqcep.service.changes import (CONTROL_TOPIC, ChangeMailbox, ChangeRefused, QuerySet,
                                   read_control, requested_change)
from dqcep.service.http import LAST_MATCHES, PUBLISH_EVERY, Board, HttpServer
from dqcep.service.stats import (query_entries, source_figures, stream_figures,
                                 write_stats_file)
from dqcep.service.recovery import CHECKPOINT_VERSION
from dqcep.service.streaming import ServiceConfig, StreamingService
from dqcep.service.worker import (ARRIVALS, Failed, Host, Hosted, Order, Release, Released,
                                  Report, Stop, Stopped, Wake, query_config, query_home,
                                  query_output, removed_home, set_up_added, worker_main)

LIVE_SET = "live-queries.json"  # beside the checkpoints: the query set after live changes
RESTARTS = 3        # a worker that dies more often than this ...
RESTART_WINDOW = 60.0  # ... within this many seconds ends the service (exit 1)


@dataclass
class Scaling:
    """Response-time targets (s) per query, the calibration, water-marks."""

    targets: dict[str, float]
    calibration: Calibration
    lw: float = -0.5
    hw: float = 0.0
    rho_max: float = 0.8
    replan_every: float = 2.0
    max_workers: int = 8
    down_after: int = 3  # re-plans in a row with every query below lw before fewer workers
    calibration_path: str | None = None  # read again for a query added live


@dataclass
class _Worker:
    process: mp.Process
    conn: object
    wake: Wake
    queries: list[str] = field(default_factory=list)  # in the order it steps them
    deaths: list[float] = field(default_factory=list)  # when it died (time.monotonic)


class _WorkerDied(Exception):
    """A worker died where it cannot be restarted (while answering the coordinator, or
    too often): the service ends with this reason, exit 1."""


class Coordinator:
    def __init__(self, cfg: ServiceConfig, placement: list[list[str]],
                 scaling: Scaling | None = None):
        self.cfg, self.scaling = cfg, scaling
        query_file = parse_file(cfg.queries)
        self.file_set = QuerySet(list(query_file.queries), {}, query_file.schemas,
                                 query_file.tables)
        self.set_path = Path(cfg.checkpoint).parent / LIVE_SET
        self.query_set, through = self._read_set()
        self.ctx = mp.get_context("spawn")
        low = 0
        for q in self.query_set.names:
            state = read_checkpoint(query_config(cfg, q).checkpoint, CHECKPOINT_VERSION)
            if state is not None:
                low = max(low, state["offset"], state["journal_end"])
        self.journal = Journal(cfg.journal, cfg.journal_segment_bytes, min_next_offset=low)
        self.reports: dict[str, dict] = {}
        # changes journaled after the set was last written (a crash between the two): a
        # removed query's consumer first takes the records up to its removal
        for record in self.journal.read(through + 1):
            if record.topic == CONTROL_TOPIC:
                change = read_control(record.payload)
                if change["op"] == "remove":
                    self._drain(change["name"], record.offset)
                    self._let_go(change["name"], record.offset)
                self._change_set(record.offset, change)
        self._use_set(self.query_set)
        if scaling is not None:  # the queries added live are placed by their calibration
            self._calibrated(scaling.calibration, self.names)
            for q in self.names:
                scaling.targets.setdefault(q, float("inf"))
        if self.names != [q.name for q in query_file.queries]:
            placement = round_robin(self.names, max(1, min(len(placement), len(self.names))))
        self.source: MqttSource | None = None
        self.mailbox = ChangeMailbox()  # changes from the HTTP side (``_apply_changes``)
        self.durable = self.ctx.Value("q", self.journal.durable_offset, lock=False)
        self.memory = shared_memory.SharedMemory(create=True,
                                                 size=ArrivalTimes.nbytes(ARRIVALS))
        self.arrivals = ArrivalTimes(ARRIVALS, self.memory.buf)
        self.workers: list[_Worker] = []
        self.plans: list[dict] = []
        self._responses: dict[str, tuple[int, float]] = {}  # (matches, mean ms) at the last plan
        self.failure: str | None = None
        self._settling, self._below = False, 0  # see _replan
        self.started = time.monotonic()
        if scaling is not None:  # in the order the model serves them: tightest target first
            consumers = scaling.calibration.consumer_costs()
            model = scaling.calibration.consumer_model(self.names)
            placement = [[c.name for c in in_turn_order([consumers[q] for q in p],
                                                        scaling.targets, model)]
                         for p in placement]
        self._apply([list(p) for p in placement if p], why="start")

    # -------------------------------------------------------------- live changes
    def _read_set(self) -> tuple[QuerySet, int]:
        """The query set the last live change left (the file's when none was made),
        and the journal offset of that change (-1: none)."""
        try:
            saved = json.loads(self.set_path.read_text())
        except FileNotFoundError:
            return self.file_set, -1
        return QuerySet.from_obj(saved["set"], self.file_set, str(self.set_path)), \
            saved["through"]

    def _use_set(self, query_set: QuerySet) -> None:
        self.query_set, self.names = query_set, query_set.names
        self.query_texts = {q.name: to_source(q) for q in query_set.queries}
        # the HTTP side: each query runs alone on its worker, so the page draws each
        # query's own plan (no vertex is shared across queries here)
        plan_dot = separate_plans_dot(query_set, self.cfg)
        if self.cfg.http is not None:
            if getattr(self, "board", None) is None:
                self.board = Board(plan_dot)
            self.board.set_plan(plan_dot)
        else:
            self.board = None

    def _change_set(self, offset: int, change: dict, added=None) -> tuple[QuerySet, list[str]]:
        """The set after the control record at ``offset``, written down with what a
        consumer of an added query starts from (its text, its first offset), or with a
        removed query's state put aside. Returns (the new set, the queries changed).
        ``added``: an add's queries as its request was parsed (a replay parses them)."""
        old = self.query_set
        new, names = old.after(change, offset, added)
        if change["op"] == "add":
            for q in names:
                self._set_output_aside(q, offset)
                set_up_added(self.cfg, q, offset, old.with_declarations(change["text"]))
        tmp = self.set_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"set": new.to_obj(), "through": offset}))
        os.replace(tmp, self.set_path)
        self.query_set = new
        return new, names

    def http_change(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        """As the single service's (``StreamingService.http_change``): handed to the
        coordinator's loop (``_apply_changes``), which checks, journals and applies it:
        an added query gets a consumer on the worker with the fewest queries, from its
        control record on; a removed one's consumer takes the records up to it, then
        is let go."""
        if self.source is None:
            return 503, {"error": "the service is not running"}
        return self.mailbox.request(method, path, body)

    def _calibrated(self, calibration: Calibration, names: list[str]) -> None:
        missing = [q for q in names if q not in calibration.alone]
        if missing:
            raise UserError(
                f"the calibration {self.scaling.calibration_path} has no cost of "
                f"{', '.join(missing)}: with --target a query is placed by its calibration; "
                "run dqcep calibrate on a query file that has it")

    def _place_by_model(self, why: str) -> None:
        """Every query placed again by the capacity model on the workers there are, at
        the rate measured since the start (a query added live goes where the model
        says)."""
        from dqcep.service.scaling.model import place
        s = self.scaling
        cal = s.calibration
        rate = self.journal.durable_offset / max(time.monotonic() - self.started, 1e-9) \
            * self._events_per_record()
        consumers = cal.consumer_costs(rate / cal.batch_events)
        plan = place([consumers[q] for q in self.names],
                     {q: rate / cal.batch_events for q in self.names}, s.targets,
                     workers=len(self.workers), lw=s.lw, hw=s.hw, rho_max=s.rho_max,
                     model=cal.consumer_model(self.names))
        self._apply([[c.name for c in w.queries] for w in plan.workers if w.queries], why)

    def _drain(self, q: str, offset: int) -> None:
        """At a restart, a query removed at ``offset`` whose consumer had not reached its
        removal (the coordinator was killed meanwhile): its consumer, here, takes the
        records up to it and checkpoints, so its matches before the removal are out."""
        if removed_home(self.cfg, q, offset).exists() or not query_home(self.cfg, q).exists():
            return  # let go already / never had a consumer
        svc = StreamingService(query_config(self.cfg, q), journal=JournalView(
            self.cfg.journal, lambda: self.journal.durable_offset))
        try:
            while svc.offset < offset and svc.step(until=offset):
                pass
            svc.checkpoint()
        finally:
            svc.close()

    def _remove(self, q: str, offset: int) -> None:
        """A query removed at journal ``offset``: its consumer takes the records up to
        the removal, checkpoints and is let go. A worker that dies meanwhile is started
        again (it hosts the query from its checkpoint) and asked again: a change in the
        journal is always applied (else the restarted worker ran it past its removal)."""
        while True:
            w = next((w for w in self.workers if q in w.queries), None)
            if w is None:
                break
            try:
                w.conn.send(Release(q, until=offset))
                self._expect(w, Released)
                w.queries.remove(q)
                break
            except (_WorkerDied, OSError):
                w.process.join(10)
                self._restart_dead()  # too many deaths: _WorkerDied, the service ends
        self._let_go(q, offset)

    def _let_go(self, q: str, offset: int) -> None:
        """A removed query's consumer is gone: retention no longer waits for it, its
        files are kept aside (``NAME.removed-OFFSET``), its output stays where it is
        until a query of that name is added again (``_set_output_aside``)."""
        forget_consumer(self.cfg.journal, f"query-{q}")
        home = query_home(self.cfg, q)
        if home.exists():
            home.rename(removed_home(self.cfg, q, offset))
        self.reports.pop(q, None)

    def _set_output_aside(self, q: str, offset: int) -> None:
        """A query added at ``offset`` under the name of one removed before: the removed
        one's output file is moved to ``OUT.NAME.removed-OFFSET.jsonl`` (the offset of
        its removal, as its home's), for the new one writes its own from nothing (it
        was cut to 0 lines). Run before the new consumer exists: at a replay of the
        change the file is still the removed query's."""
        out = Path(query_output(self.cfg, q))
        if is_remote(self.cfg.output) or not out.exists():
            return
        removals = [int(p.name.rsplit("-", 1)[1]) for p in
                    query_home(self.cfg, q).parent.glob(f"{q}.removed-*")
                    if p.name.rsplit("-", 1)[1].isdigit()]
        out.rename(query_output(self.cfg, f"{q}.removed-{max(removals, default=offset)}"))

    def _apply_changes(self) -> None:
        """In the coordinator's loop: the change requests from the HTTP side, each
        checked against the set, journaled and applied at once, in the order they came
        (a query added live is placed by its calibration, which is read again here)."""
        while (req := self.mailbox.take()) is not None:
            try:
                requested = requested_change(req.method, req.path, req.body,
                                             self.query_set)
                calibration = None
                if self.scaling is not None and requested.op == "add":  # by its calibration
                    calibration = Calibration.load(self.scaling.calibration_path)
                    self._calibrated(calibration, requested.names)
            except ChangeRefused as err:
                req.answer(err.code, {"error": err.message})
                continue
            except UserError as err:
                req.answer(409, {"error": str(err)})
                continue
            try:
                offset = self.source.journal_record(CONTROL_TOPIC, requested.payload)
            except (UserError, OSError) as err:
                req.answer(503, {"error": f"cannot write the journal: {err}"})
                continue
            req.journaled_at(offset, requested, self.names)
            change = read_control(requested.payload)
            try:
                if change["op"] == "remove":  # the set says removed once it is
                    self._remove(change["name"], offset)
                new, names = self._change_set(offset, change, requested.added)
                self._use_set(new)
                if change["op"] == "add":
                    for q in names:
                        w = min(self.workers, key=lambda w: len(w.queries))
                        w.conn.send(Host(q))
                        self._expect(w, Hosted)
                        w.queries.append(q)
                    if self.scaling is not None:  # then where the model says
                        self.scaling.calibration = calibration
                        for q in names:
                            self.scaling.targets.setdefault(q, float("inf"))
                        self._place_by_model(f"{', '.join(names)} added")
                print(f"dqcep: queries {'added' if change['op'] == 'add' else 'removed'} "
                      f"{', '.join(names)} at journal record {offset}; running "
                      f"{', '.join(self.names)}", file=sys.stderr, flush=True)
                req.applied(names, self.names)
            except Exception as err:  # noqa: BLE001 - said to the request, the loop goes on
                req.answer(500, {"error": f"{type(err).__name__}: {err}"})

    # -------------------------------------------------------------- workers
    def _spawn(self, index: int) -> _Worker:
        parent, child = self.ctx.Pipe()
        wake = Wake(self.ctx)
        process = self.ctx.Process(
            target=worker_main, args=(index, self.cfg, self.durable, wake.reader,
                                      self.memory.name, child),
            name=f"dqcep-worker-{index + 1}", daemon=False)
        process.start()
        child.close()
        return _Worker(process, parent, wake)

    def _start_worker(self) -> _Worker:
        worker = self._spawn(len(self.workers))
        self.workers.append(worker)
        return worker

    def _restart_dead(self) -> None:
        """A worker that died (SIGKILL, the OOM killer, a crash) is started again and
        hosts its queries from their checkpoints, as after a restart of the whole
        service: their outputs are cut back to the checkpoints and the journal replayed
        from there, so nothing is lost or written twice. One that dies more than
        RESTARTS times within RESTART_WINDOW s ends the service with the reason."""
        for i, w in enumerate(self.workers):
            if w.process.is_alive():
                continue
            w.process.join()
            code = w.process.exitcode
            how = f"killed by signal {-code}" if code is not None and code < 0 else \
                f"exit code {code}"
            now = time.monotonic()
            deaths = [t for t in w.deaths if now - t < RESTART_WINDOW] + [now]
            if len(deaths) > RESTARTS:
                raise _WorkerDied(f"worker {i + 1} died ({how}) {len(deaths)} times within "
                                  f"{RESTART_WINDOW:g} s; not restarted again")
            print(f"dqcep: worker {i + 1} died ({how}); restarting it from the checkpoints "
                  f"of {', '.join(w.queries) or 'no query'}", file=sys.stderr, flush=True)
            w.conn.close()
            w.wake.close()
            fresh = self._spawn(i)
            fresh.deaths, fresh.queries = deaths, list(w.queries)
            self.workers[i] = fresh
            try:
                for q in fresh.queries:
                    fresh.conn.send(Host(q))
                    self._expect(fresh, Hosted)
                if len(fresh.queries) > 1:
                    fresh.conn.send(Order(tuple(fresh.queries)))
            except (_WorkerDied, OSError):
                continue  # died again while taking its queries: the next pass counts it
            fresh.wake.set()  # what was committed meanwhile

    def _expect(self, worker: _Worker, kind: type, timeout: float = 120.0):
        """The worker's next answer of ``kind`` (stats that come first are kept); a
        worker that died meanwhile is said at once, not waited for."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise UserError(f"worker {self.workers.index(worker) + 1} did not answer "
                                f"({kind.__name__}) within {timeout:g} s")
            if not worker.conn.poll(min(left, 0.2)):
                if not worker.process.is_alive() and not worker.conn.poll():
                    raise _WorkerDied(f"worker {self.workers.index(worker) + 1} died "
                                      f"(exit code {worker.process.exitcode}) before it "
                                      f"answered ({kind.__name__})")
                continue
            try:
                message = worker.conn.recv()
            except (EOFError, ConnectionError):
                raise _WorkerDied(f"worker {self.workers.index(worker) + 1} died before it "
                                  f"answered ({kind.__name__})") from None
            if isinstance(message, kind):
                return message
            self._take(message)

    def _take(self, message) -> None:
        if isinstance(message, Report):
            self.reports.update(message.reports)
        elif isinstance(message, Failed):
            self.failure = f"worker {message.worker + 1} failed: {message.reason}"

    def _apply(self, placement: list[list[str]], why: str) -> None:
        """Move queries and start or stop workers so that worker i hosts placement[i]
        (the new parts matched to the workers they overlap most, to move the least),
        and steps them in that part's order."""
        parts = sorted(placement, key=len, reverse=True)
        free = list(range(len(self.workers)))
        target: dict[int, list[str]] = {}
        for part in parts:  # the existing workers first, each the part it overlaps most
            if free:
                best = max(free, key=lambda i: len(set(self.workers[i].queries) & set(part)))
                free.remove(best)
            else:
                self._start_worker()
                best = len(self.workers) - 1
            target[best] = part
        for i in free:  # workers left without queries: theirs go, then they stop
            target[i] = []
        released = {}
        for i, part in target.items():  # let go first: a query is hosted once at a time
            w = self.workers[i]
            for q in sorted(set(w.queries) - set(part)):
                w.conn.send(Release(q))
                released[q] = self._expect(w, Released).offset
                w.queries.remove(q)
        moved = {}
        for i, part in target.items():
            w = self.workers[i]
            for q in sorted(set(part) - set(w.queries)):
                w.conn.send(Host(q))
                offset = self._expect(w, Hosted).offset
                if q in released and offset != released[q]:
                    raise UserError(f"query {q} was let go at journal offset {released[q]} "
                                    f"but taken over at {offset}")
                if q in released:
                    moved[q] = offset
                w.queries.append(q)
            if part and w.queries != part:
                w.conn.send(Order(tuple(part)))
                w.queries = list(part)
        for i in sorted(free, reverse=True):
            self._stop_worker(self.workers[i], end_of_stream=False)
            del self.workers[i]
        self._settling, self._below = True, 0
        self.plans.append({"at": round(time.monotonic() - self.started, 3), "why": why,
                           "workers": [list(w.queries) for w in self.workers],
                           "moved": moved})  # query -> the journal offset it moved at
        print(f"dqcep: {len(self.workers)} worker(s) ({why}): "
              + "; ".join(",".join(w.queries) for w in self.workers),
              file=sys.stderr, flush=True)

    def _stop_worker(self, worker: _Worker, end_of_stream: bool) -> None:
        worker.conn.send(Stop(end_of_stream))
        self.reports.update(self._expect(worker, Stopped).reports)
        worker.process.join(60)
        worker.wake.close()

    def _wake(self, durable: int) -> None:
        self.durable.value = durable
        for w in self.workers:
            w.wake.set()

    # -------------------------------------------------------------- re-planning
    def _replan(self, rate: float) -> None:
        from dqcep.service.scaling.model import deviation, place
        s = self.scaling
        cal = s.calibration
        measured = self._responses_since_last_plan()
        # the responses since a new placement hold its moves (a checkpoint, a restore,
        # catching up): they show the move, not the placement, so they do not count
        settling, self._settling = self._settling, False
        above = [] if settling else [q for q, w in measured.items()
                                     if deviation(w, s.targets[q]) > s.hw]
        # a query without a match since the last plan shows no lateness: it counts as below
        low = not settling and all(deviation(w, s.targets[q]) < s.lw
                                   for q, w in measured.items())
        self._below = self._below + 1 if low else 0
        below = self._below >= s.down_after  # fewer workers only after a while below
        consumers = cal.consumer_costs(rate / cal.batch_events)  # at the measured rate
        costs = [consumers[q] for q in self.names]
        rates = {q: rate / cal.batch_events for q in self.names}
        model = cal.consumer_model(self.names)
        plan = place(costs, rates, s.targets, lw=s.lw, hw=s.hw, rho_max=s.rho_max,
                     model=model)
        need = len(plan.workers) + (1 if above else 0)
        need = max(1, min(need, s.max_workers, len(self.names)))
        if need == len(self.workers) or (need < len(self.workers) and not below):
            return
        if need != len(plan.workers):
            plan = place(costs, rates, s.targets, workers=need, lw=s.lw, hw=s.hw,
                         rho_max=s.rho_max, model=model)
        why = (f"{rate:,.0f} events/s; " + (f"above target: {', '.join(above)}" if above
                                          else "all below the low water-mark" if below
                                          else "the model's placement"))
        self._apply([[c.name for c in w.queries] for w in plan.workers], why)

    def _events_per_record(self) -> float:
        """Events per journal record (payload) so far, as a query's consumer counted
        them; the calibration's payload size before any was."""
        counted = [(r.get("events_in", 0), r.get("payloads", 0)) for r in self.reports.values()]
        events, records = max(counted, default=(0, 0))
        return events / records if records else self.scaling.calibration.batch_events

    def _responses_since_last_plan(self) -> dict[str, float]:
        """Per query with matches since the last call, their mean response time (s)."""
        out = {}
        for q in self.names:
            r = (self.reports.get(q) or {}).get("response") or {}
            n, mean = r.get("matches", 0), r.get("mean_ms") or 0.0
            n0, mean0 = self._responses.get(q, (0, 0.0))
            if n > n0:
                out[q] = (mean * n - mean0 * n0) / (n - n0) / 1e3
            self._responses[q] = (n, mean)
        return out

    # -------------------------------------------------------------- stats
    def stats(self) -> dict:
        reports = [self.reports.get(q, {}) for q in self.names]
        # events in: what every consumer has taken in, of those that read the stream
        # from its start (one added live counts only what came after it)
        whole = [self.reports.get(q, {}) for q in self.names
                 if not self.query_set.epochs.get(q)] or reports
        # time as the consumer furthest behind sees it (the others have taken as much)
        slowest = min((r for r in reports if r.get("watermark") is not None),
                      key=lambda r: r["watermark"], default={})
        reasons = {k for r in reports for k in r.get("late_by_reason") or {}}
        return {"events_in": min((r.get("events_in", 0) for r in whole), default=0),
                "ticks": max((r.get("ticks", 0) for r in reports), default=0),
                "event_time": slowest.get("event_time"),
                "watermark": slowest.get("watermark"),
                "watermark_lag_s": slowest.get("watermark_lag_s"),
                "slowest_timelines": slowest.get("slowest_timelines", []),
                "late_by_reason": {k: max((r.get("late_by_reason") or {}).get(k, 0)
                                          for r in reports) for k in sorted(reasons)},
                "matches_out": sum(r.get("matches_out", 0) for r in reports),
                "output_backlog": sum(r.get("output_backlog", 0) for r in reports),
                "lag_records": self.journal.durable_offset - min(
                    (r.get("offset", 0) for r in reports), default=0),
                "workers": [list(w.queries) for w in self.workers],  # in step order
                "plans": self.plans,
                "error": self.failure or next((r["error"] for r in reports if r.get("error")),
                                              None),
                "stopped": {q: why for r in reports for q, why in r.get("stopped", {}).items()},
                "queries": {q: self.reports.get(q, {}) for q in self.names},
                "response": {q: self.reports.get(q, {}).get("response") for q in self.names}}

    def status(self, source: MqttSource | None = None) -> dict:
        """``/status`` of the workers: the figures of the stream (those every query's
        consumer counts alike, as its furthest consumer counted them), of each query
        (its consumer's), and of each worker process."""
        s = self.stats()
        reports = {q: self.reports.get(q, {}) for q in self.names}
        dead: dict[str, int] = {}
        for r in reports.values():  # each consumer dead-letters the stream's bad input
            for reason, n in (r.get("dead_letters") or {}).items():
                dead[reason] = n + dead.get(reason, 0) if reason == "stopped" else \
                    max(n, dead.get(reason, 0))
        ages = [r["checkpoint_age_s"] for r in reports.values()
                if r.get("checkpoint_age_s") is not None]
        last = sorted((m for r in reports.values() for m in r.get("last_matches") or []),
                      key=lambda m: m["detected_at"])[-LAST_MATCHES:]
        now = time.monotonic()
        s.update({
            "payloads": max((r.get("payloads", 0) for r in reports.values()), default=0),
            "late": max((r.get("late", 0) for r in reports.values()), default=0),
            "duplicates": max((r.get("duplicates", 0) for r in reports.values()), default=0),
            "journal_lost": max((r.get("journal_lost", 0) for r in reports.values()),
                                default=0),
            "malformed": max((r.get("malformed", 0) for r in reports.values()), default=0),
            "dead_letters": dead,
            "matches_by_query": {q: r.get("matches_out", 0) for q, r in reports.items()},
            "state_bytes": {q: r.get("state_total_bytes", 0) for q, r in reports.items()},
            "state_total_bytes": sum(r.get("state_total_bytes", 0)
                                     for r in reports.values()),
            "checkpoint_age_s": max(ages) if ages else None,
            **stream_figures(names=self.names, events_in=s["events_in"],
                             stopped=s["stopped"], error=s["error"], started=self.started,
                             now=now, inputs=self.cfg.inputs, state=self.cfg.state,
                             journal=self.cfg.journal),
            "worker_status": [{"worker": i + 1, "up": int(w.process.is_alive()),
                               "pid": w.process.pid, "queries": list(w.queries)}
                              for i, w in enumerate(self.workers)],
            "workers_up": {str(i + 1): int(w.process.is_alive())
                           for i, w in enumerate(self.workers)},
            "queries": query_entries(self.query_set, self.query_texts, self.names),
            "queries_by_name": s["queries"],
            "last_matches": last,
            "plan_version": "workers"})
        return source_figures(s, source)

    def _write_stats(self) -> None:
        s = self.stats()
        print(f"dqcep: {len(self.workers)} worker(s), events in {s['events_in']}, matches "
              f"out {s['matches_out']}, lag {s['lag_records']} records"
              + (f"; FAILING: {s['error']}" if s["error"] else ""), file=sys.stderr,
              flush=True)
        write_stats_file(self.cfg.stats_file, s)

    # -------------------------------------------------------------- run
    def run(self, stop: threading.Event, end_of_stream: threading.Event) -> int:
        urls = [MqttUrl.parse(u, subscribe=True) for u in self.cfg.inputs]
        source = self.source = MqttSource(urls, self.journal, self.cfg.client_id)
        source.arrivals = self.arrivals
        source.on_commit.append(self._wake)
        http = None
        if self.board is not None:
            http = HttpServer(self.board, self.cfg.http, self.http_change)
            self.board.publish(self.status())
        source.start()
        where = f"; http on {http.url}" if http is not None else ""
        print(f"dqcep: listening on {', '.join(self.cfg.inputs)}; {len(self.workers)} "
              f"worker(s){where}", file=sys.stderr, flush=True)
        if http is not None:
            http.start()
        last_stats = last_plan = last_input = last_publish = time.monotonic()
        # the arrival rate is the journal's: what the workers take in includes their
        # catching up after a move or a restart, which is no arrival
        records_at_plan = seen = self.journal.durable_offset
        try:
            while not stop.is_set() and not end_of_stream.is_set() and self.failure is None:
                if source.failure:
                    self.failure = source.failure
                    break
                for w in self.workers:
                    try:
                        while w.conn.poll():
                            self._take(w.conn.recv())
                    except (EOFError, ConnectionError):
                        pass  # it died: restarted below
                self._restart_dead()
                if self.failure is not None:
                    break
                now = time.monotonic()
                source.tick_if_silent(self.cfg.tick)
                if self.journal.durable_offset - source.ticks_written != seen:  # not a tick
                    seen, last_input = self.journal.durable_offset - source.ticks_written, now
                elif self.cfg.until_idle is not None and \
                        now - last_input >= self.cfg.until_idle:
                    end_of_stream.set()
                if self.scaling and now - last_plan >= self.scaling.replan_every:
                    records = self.journal.durable_offset
                    if len(self.reports) == len(self.names):
                        self._replan((records - records_at_plan) / (now - last_plan)
                                     * self._events_per_record())
                    records_at_plan, last_plan = records, time.monotonic()
                if now - last_stats >= self.cfg.stats_every:
                    self._write_stats()
                    last_stats = now
                self._apply_changes()
                if self.board is not None and now - last_publish >= PUBLISH_EVERY:
                    self.board.publish(self.status(source))
                    last_publish = now
                stop.wait(0.05)
        except _WorkerDied as err:
            self.failure = str(err)
        finally:
            committed = source.stop()
            if http is not None:
                http.close()
            self._wake(self.journal.durable_offset)
            for w in self.workers:
                if w.process.is_alive():
                    try:
                        self._stop_worker(w, end_of_stream.is_set() and self.failure is None)
                    except (UserError, OSError, _WorkerDied) as err:
                        self.failure = self.failure or str(err)
                else:
                    w.process.join()
            self._write_stats()
            self.journal.close()
            self.memory.close()
            self.memory.unlink()
        if self.failure is None and not committed:
            self.failure = (f"{source.write_error}: messages not journaled were not "
                            "acknowledged; the broker sends them again to the next run")
        if self.failure is not None:
            print(f"dqcep: {self.failure}", file=sys.stderr, flush=True)
            return 1
        return 0


def serve_workers(cfg: ServiceConfig, placement: list[list[str]],
                  scaling: Scaling | None = None) -> int:
    stop, end_of_stream = threading.Event(), threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: end_of_stream.set())
    try:
        coordinator = Coordinator(cfg, placement, scaling)
    except _WorkerDied as err:
        print(f"dqcep: {err}", file=sys.stderr, flush=True)
        return 1
    return coordinator.run(stop, end_of_stream)


def separate_plans_dot(query_file, cfg: ServiceConfig) -> str:
    """Each query's own plan (as ``dqcep explain --dot`` draws it) in a box of its own,
    in one graph: what the workers run (one query per consumer, nothing shared)."""
    out = ["digraph dqcep_plans {", "  rankdir=BT;", '  node [fontname="Helvetica"];']
    for i, q in enumerate(query_file.queries):
        plan = build_plan([q], cfg.rates, materialize=cfg.materialize,
                          schemas=query_file.schemas, tables=query_file.tables)
        body = explain_dot(plan).splitlines()[3:-1]  # the graph's lines without its frame
        out.append(f'  subgraph cluster_{i} {{ label="{q.name} (alone)";')
        out += [re.sub(r"\bv(\d+)\b(?= \[| ->|$|;)", rf"q{i}v\1", line.replace(
            " -> v", f" -> q{i}v")) for line in body]
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def round_robin(names: list[str], workers: int) -> list[list[str]]:
    return [names[i::workers] for i in range(workers)]

