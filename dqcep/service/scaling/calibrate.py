"""``dqcep calibrate``: time the streaming service's own path, payload by payload, at
low load.

The events are cut into payloads of ``batch_events`` (as MQTT delivers them). A
service hosting each query alone, then one hosting them all (the shared plan), takes
them one at a time, ``gap`` seconds apart (low load, as the model's calibration asks:
a payload processed after an idle gap takes longer than one in a tight loop - caches,
the core's clock - measured in docs/capacity.md). Each run gives the mean and second
moment of the time per payload; ``dqcep.service.scaling.model.from_moments`` turns them into the
model's costs.

- **Live** (``broker``: an ``mqtt://host:port/topic`` URL): each run is a real
  ``dqcep run --input mqtt://...`` process; this process publishes the payloads and
  reads the service's own measurements from its stats (``service``: the time per
  payload of its steps; ``response``: the matches' mean response time, less the time
  per payload and the checkpoints' wait, is the model's delay: ``_waited``).
  Everything the service shares a core with (its MQTT reader, the broker) is in the
  figures. The queries alone are one run of
  ``--workers N`` (``workers``: a journal consumer per query, each measured on its
  own, as ``dqcep run --workers N`` runs them; a consumer's cost grows with the
  processes beside it, so calibrate with the count the service will run); the shared
  plan one run of the single service.
- **Offline** (no broker): a ``StreamingService`` in this process reads a journal
  holding the payloads, one payload per ``step`` (journal read, decoding, repeated
  ids, engine, match output, response-time measurement); the delay is timed on the
  MQTT source's own read-and-commit without a broker (a PUBLISH handed to it as a read
  brings it, the journal committed with fsync where ``journal_dir`` lives).

Live, ``loads`` measures the queries alone and the shared plan again with Poisson
arrivals at shares of the shared plan's capacity (default in ``dqcep calibrate
--broker``: 40% and 80%): a service that falls behind takes the waiting payloads in
one step, cheaper per payload, so the time per payload falls as the rate rises; the
model takes the costs at the rate it predicts for (``Calibration.costs``).

Both time the worker's own work per payload apart (the journal append at ingest,
decoding, repeated ids: what a worker does whatever its queries), offline, and the
shared plan's checkpoints (live: the service's own, at least ``CHECKPOINTS``;
offline: ``CHECKPOINTS`` taken after the payloads).
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Sequence

import msgpack

from dqcep._kernels.recent_ids import RecentIds
from dqcep.service.scaling.model import Calibration, from_moments, moments
from dqcep.core.errors import UserError
from dqcep.io.journal import Journal
from dqcep.io.mqtt import ArrivalTimes, MqttPublisher, MqttSource, MqttUrl
from dqcep.io.mqtt_wire import publish_packet
from dqcep.lang import parse_file
from dqcep.plan import build_plan
from dqcep.runtime import Engine
from dqcep.runtime.duplicates import RECENT_IDS
from dqcep.service import ServiceConfig, StreamingService

TOPIC = "calibrate"
CHECKPOINTS = 3  # timed per run, at least
CHECKPOINT_EVERY = ServiceConfig.checkpoint_every  # the service's interval (s)


def payloads_of(events: Sequence[dict], batch_events: int) -> list[bytes]:
    """Event maps as msgpack payloads of ``batch_events`` events (the generator's form)."""
    return [msgpack.packb({"events": list(events[i:i + batch_events])})
            for i in range(0, len(events), batch_events)]


def calibrate(queries: str, payloads: list[bytes], batch_events: int,
              journal_dir: str | Path | None = None, broker: str | None = None,
              gap: float = 0.002, commits: int = 100, workers: int = 1,
              loads: Sequence[float] = (), repeats: int = 1,
              timer: Callable[[], float] = time.perf_counter,
              sleep: Callable[[float], None] = time.sleep) -> Calibration:
    """``loads`` (live only): measure again with Poisson arrivals at these shares of
    the shared plan's capacity one payload at a time (``1 / its time per payload``).
    ``repeats`` (live only): every run that many times, the median kept (per query,
    by time per payload)."""
    names = [q.name for q in parse_file(queries).queries]
    if not payloads:
        raise UserError("no payload to calibrate with")
    if (loads or repeats > 1) and broker is None:
        raise UserError("calibrating at loads or repeatedly needs the live calibration "
                        "(a broker)")
    points = []  # (rate, alone, shared) at the loads
    with tempfile.TemporaryDirectory(prefix="dqcep-calibrate-", dir=journal_dir) as tmp:
        work = Path(tmp)
        overhead = moments(_overhead(queries, payloads, work / "ingest", gap, timer, sleep))
        if broker is None:
            run = _offline(queries, payloads, work, gap, timer, sleep)
            alone = {q: run([q], f"alone-{i}")["payload"] for i, q in enumerate(names)}
            shared = run(names, "shared")
            delay = consumer_delay = _commit_delay(work / "commit", payloads[0], commits,
                                                   gap, timer, sleep)
        else:
            live = _live(queries, payloads, work, broker, gap)

            def run(tag: str, consumers: int = 0, rate: float | None = None) -> dict:
                """The median of ``repeats`` runs (a shared machine's interference comes
                and goes; a run takes seconds)."""
                runs = [live(names, f"{tag}-{k}", consumers, rate) for k in range(repeats)]
                if consumers:
                    return {q: _median([r[q] for r in runs]) for q in names}
                return _median(runs)
            # every query alone: a journal consumer of its own (dqcep run --workers N, as
            # the service will run: a consumer's cost grows with the processes beside it)
            consumers = run("consumers", consumers=workers)
            alone = {q: c["payload"] for q, c in consumers.items()}
            # a worker takes its consumers in turn: its first one waits for no other
            firsts = [_waited(c, [o for o in consumers.values() if o["worker"] == c["worker"]])
                      for c in consumers.values() if c["first"]]
            consumer_delay = sum(firsts) / len(firsts)
            shared = run("shared")
            delay = _waited(shared, [shared])
            for i, share in enumerate(loads):
                rate = share / shared["payload"][0]  # payloads/s
                at = run(f"consumers-{i}", consumers=workers, rate=rate)
                points.append((rate, {q: c["payload"] for q, c in at.items()},
                               run(f"shared-{i}", rate=rate)["payload"]))
    return from_moments(batch_events, len(payloads), alone, shared["payload"], overhead,
                        delay, shared["checkpoint"], CHECKPOINT_EVERY, consumer_delay,
                        points)


def _offline(queries, payloads, work: Path, gap, timer, sleep):
    journal = Journal(work / "journal", fsync="never")
    for p in payloads:
        journal.append(TOPIC, p)
    journal.commit()
    journal.close()

    def run(hosted: list[str], tag: str) -> dict:
        svc = StreamingService(ServiceConfig(
            queries=queries, inputs=[f"mqtt://localhost/{TOPIC}"],
            journal=str(work / "journal"), checkpoint=str(work / f"{tag}.ck"),
            output=str(work / f"{tag}.jsonl"), dead_letter=str(work / f"{tag}.dead"),
            late=str(work / f"{tag}.late"), hosted=hosted,
            journal_retention=1 << 62))  # its checkpoints trim nothing the next run reads
        svc.arrivals = ArrivalTimes()  # the measurement is part of a payload's work
        times = []
        try:
            for offset in range(len(payloads)):
                sleep(gap)
                svc.arrivals.stamp(offset, time.time())
                started = timer()
                svc.step(until=offset + 1)
                svc.out.drain()  # the output written, as part of the payload's time
                times.append(timer() - started)
            checkpoints = []
            for _ in range(CHECKPOINTS):  # with the state the payloads left
                started = timer()
                svc.checkpoint()
                checkpoints.append(timer() - started)
        finally:
            svc.close()
        return {"payload": moments(times), "checkpoint": moments(checkpoints)}
    return run


def _live(queries, payloads, work: Path, broker: str, gap):
    url = MqttUrl.parse(broker)
    events = sum(len(msgpack.unpackb(p)["events"]) for p in payloads)
    started = [0]  # runs so far

    def run(hosted: list[str], tag: str, consumers: int = 0,
            rate: float | None = None) -> dict:
        """One service hosting ``hosted`` (the shared plan), or ``consumers`` workers
        of a consumer per query; its own measurements per payload. The payloads
        ``gap`` s apart, or at ``rate`` per second with exponential gaps (Poisson)."""
        # a live calibration is many service runs (18 with the defaults): each said
        # as it starts, so a minute and a half is not silent
        started[0] += 1
        what = (f"each query alone, {consumers} worker(s)" if consumers
                else f"{', '.join(hosted)} in one service")
        pace = f"{rate:,.0f} payloads/s" if rate else f"one payload every {gap * 1e3:g} ms"
        print(f"dqcep calibrate: run {started[0]}: {what}, {len(payloads)} payloads at "
              f"{pace}", file=sys.stderr, flush=True)
        state = work / tag
        state.mkdir()
        stats, log = state / "stats.json", state / "stderr.txt"
        # a topic of this run's own below the given one (the URL ends with its topic)
        topic = f"{broker[:len(broker) - len(url.topic)]}{url.topic}/{uuid.uuid4().hex}"
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dqcep", "run", queries, "--input", topic,
                 *(["--workers", str(consumers)] if consumers
                   else ["--queries", ",".join(hosted)]),
                 "--state", str(state),
                 "-o", str(state / "out.jsonl"), "--client-id", f"dqcep-calibrate-{tag}-"
                 + uuid.uuid4().hex[:8], "--stats-file", str(stats), "--stats-every", "0.2"],
                stderr=err)
        try:
            _wait(lambda: "listening" in log.read_text(), proc, log, "start")
            publisher = MqttPublisher(MqttUrl.parse(topic),
                                      client_id="dqcep-calibrate-" + uuid.uuid4().hex[:8])
            try:
                gaps = random.Random(7)
                due = time.monotonic()
                for p in payloads:
                    if rate is None:
                        time.sleep(gap)
                    else:  # due times, not sleeps: a late publish does not delay the rest
                        due += gaps.expovariate(rate)
                        time.sleep(max(due - time.monotonic(), 0.0))
                    publisher.publish(p)
            finally:
                publisher.close()

            def measured(s: dict) -> dict[str, dict]:
                if consumers:
                    return {q: (s.get("queries", {}).get(q) or {}).get("service") or {}
                            for q in hosted}
                return {"": s.get("service") or {}}

            def done():
                s = _read(stats)
                return s.get("events_in", 0) >= events and all(
                    m.get("payloads", 0) >= len(payloads) and
                    m.get("checkpoints", 0) >= CHECKPOINTS for m in measured(s).values())
            _wait(done, proc, log, f"take in the {len(payloads)} payloads and checkpoint "
                  f"{CHECKPOINTS} times")
            last = _read(stats)
            found = measured(last)
            worker_of = {q: i for i, w in enumerate(last.get("workers", [])) for q in w}
            firsts = {w[0] for w in last.get("workers", []) if w}
            responses = {q: (last.get("queries", {}).get(q) or {}).get("response") or {}
                         for q in hosted} if consumers else {"": last.get("response") or {}}
        finally:
            proc.terminate()
            proc.wait(60)
        if any(m["delay_ms"] is None for m in found.values()):
            raise UserError(f"the service measured no delay: {log.read_text()[-500:]}")
        out = {q: {"payload": (m["mean_ms"] / 1e3, m["m2_ms2"] / 1e6),
                   "delay": m["delay_ms"] / 1e3, "first": q in firsts,
                   "worker": worker_of.get(q), "response": _mean_response(responses[q]),
                   "checkpoint": (m["checkpoint_ms"] / 1e3, m["checkpoint_m2_ms2"] / 1e6)}
               for q, m in found.items()}
        return out if consumers else out[""]
    return run


def _waited(run: dict, checkpointing: list[dict]) -> float:
    """The model's delay from a live run: what a match waited beyond its processing, at
    low load (its mean response less the time per payload, less the checkpoints'
    mean wait ``sum(m2) / (2 * interval)``, which the model adds as a class of its
    own). It holds the commit and the wake-up, less whatever of a step comes after its
    matches are out (in the one service, the ingest threads' share of the step's time);
    the delay before the step when the run measured no response (no match)."""
    if run["response"] is None:
        return run["delay"]
    held = sum(c["checkpoint"][1] for c in checkpointing) / (2 * CHECKPOINT_EVERY)
    return max(run["response"] - run["payload"][0] - held, 0.0)


def _median(runs: list[dict]) -> dict:
    """The run with the median time per payload."""
    return sorted(runs, key=lambda m: m["payload"][0])[len(runs) // 2]


def _mean_response(response: dict) -> float | None:
    """The mean response time (s) over the matches of a service's ``response`` stats:
    one query's ``{matches, mean_ms}``, or per query of the one service."""
    parts = [response] if "matches" in response else list(response.values())
    parts = [p for p in parts if p and p.get("matches")]
    n = sum(p["matches"] for p in parts)
    return sum(p["matches"] * p["mean_ms"] for p in parts) / n / 1e3 if n else None


def _read(stats: Path) -> dict:
    try:
        return json.loads(stats.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait(condition, proc, log: Path, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise UserError(f"the service did not {what}: {log.read_text()[-1000:]}")
        time.sleep(0.05)


def _overhead(queries, payloads, journal_dir: Path, gap, timer, sleep) -> list[float]:
    """Per payload, what every worker does whatever its queries: the journal append at
    ingest, decoding into the engine's columns, the repeated-ids check."""
    query_file = parse_file(queries)
    engine = Engine(build_plan(query_file.queries, schemas=query_file.schemas,
                               tables=query_file.tables))
    decoder, recent = engine.column_decoder(), RecentIds(RECENT_IDS)
    journal = Journal(journal_dir, fsync="never")
    times = []
    try:
        for p in payloads:
            sleep(gap)
            started = timer()
            journal.append(TOPIC, p, int(time.time() * 1e6), 1)
            decoder.decode(p)
            recent.admit(decoder.take()[1])
            times.append(timer() - started)
    finally:
        journal.close()
    return times


def _commit_delay(directory: Path, payload: bytes, commits: int, gap, timer, sleep) -> float:
    """Mean time from a message's arrival to its commit, as the MQTT source's reader
    takes a read and commits it (its acks go nowhere: no broker), a journal in
    ``directory`` (fsync)."""
    journal = Journal(directory, fsync="always")
    source = MqttSource([MqttUrl.parse(f"mqtt://127.0.0.1/{TOPIC}", subscribe=True)],
                        journal)
    total = 0.0
    try:
        for mid in range(1, commits + 1):
            sleep(gap)
            started = timer()
            source.take(publish_packet(TOPIC, payload, mid))
            if not source.commit():
                raise OSError(f"the journal in {directory} cannot be written: "
                              f"{source.write_error}")
            total += timer() - started
    finally:
        journal.close()
    return total / commits
