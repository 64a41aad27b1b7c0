"""The streaming service's own work: ``StreamingService.step()`` over a journal.

Builds a journal of N IoT events (``dqcep generate --profile iot --seed 3 --plant
dqcep/data/iot.cep --plant-every 150000``, msgpack batches of 1000 events, one
journal record per batch, as MQTT payloads arrive), then times the service
draining it in-process: decode (ColumnDecoder kernel), repeated ids, engine,
match output to a file, one checkpoint at the end. No broker: this is the
service's ceiling; ``bench_ingest.py`` measures it behind Mosquitto. The
engine alone on the same events is timed in the same run for the ratio, with every
join kept and as the service builds it (an ``AdaptiveEngine`` under ``auto``).

Target (columnar-path issue): >= 2 M events/s.

``--output sqlite`` or ``--output postgresql`` writes the matches into a table
instead (issue 20: one transaction per batch with the journal offset it covers;
PostgreSQL on a server of its own, as bench_database.py starts one).
``--payload json --per-record 1`` journals one JSON reading per record, as a device
publishes it (read in Python by the service's PayloadReader, not the kernel).

    python3 bench/bench_service.py [--events N] [--output file|sqlite|postgresql]
        [--payload msgpack|json] [--per-record N]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_paths import QUERIES, engine, generate  # noqa: E402 - the same stream

TARGET = 2_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--output", choices=("file", "sqlite", "postgresql"), default="file")
    ap.add_argument("--payload", choices=("msgpack", "json"), default="msgpack")
    ap.add_argument("--per-record", type=int, default=1000,
                    help="events per journal record (payload); default 1000")
    args = ap.parse_args()
    import json
    from bench_database import postgresql
    from dqcep.io.columnar import read_columns
    from dqcep.io.journal import Journal
    from dqcep.runtime import EventColumns
    from dqcep.service import ServiceConfig, StreamingService

    with tempfile.TemporaryDirectory() as tmp, (
            postgresql(None) if args.output == "postgresql" else contextlib.nullcontext()) as pg:
        tmp = Path(tmp)
        output = {"file": str(tmp / "matches.jsonl"), "sqlite": f"sqlite:///{tmp}/m.db",
                  "postgresql": pg}[args.output]
        events = tmp / "iot.msgpack"
        generate(events, args.events)
        journal = Journal(tmp / "state" / "journal", fsync="never")
        with open(events, "rb") as f:
            read = [e for obj in msgpack.Unpacker(f, raw=False) for e in obj["events"]]
        for a in range(0, len(read), args.per_record):
            chunk = read[a:a + args.per_record]
            obj = chunk[0] if len(chunk) == 1 else {"events": chunk}
            journal.append("sensors", json.dumps(obj).encode() if args.payload == "json"
                           else msgpack.packb(obj))
        journal.commit()
        journal.close()

        def engine_alone(e) -> float:
            """The engine over the events, decoded first by its own decoder (its
            string codes: another engine's would match nothing)."""
            pieces = [EventColumns(*p) for p in read_columns(str(events), None, e)]
            started = time.perf_counter()
            for p in pieces:
                e.process(p)
            e.flush()
            return args.events / (time.perf_counter() - started)
        alone = engine_alone(engine())
        # the service's own engine (dqcep run's): planned by the cost model, adapting
        from dqcep.lang import parse_file
        from dqcep.runtime import AdaptiveEngine
        adaptive = AdaptiveEngine(parse_file(str(QUERIES)).queries, materialize="auto")
        alone_adaptive = engine_alone(adaptive)

        state = tmp / "state"
        svc = StreamingService(ServiceConfig(
            queries=str(QUERIES), inputs=["mqtt://127.0.0.1:1/sensors"],
            journal=str(state / "journal"), checkpoint=str(state / "checkpoint.bin"),
            output=output, dead_letter=str(state / "dead.jsonl"),
            late=str(state / "late.jsonl")))
        started = time.perf_counter()
        records = svc.step()
        stepped = time.perf_counter() - started
        svc.checkpoint()
        total = time.perf_counter() - started
        svc.close()
        n = svc.counts["events_in"]
        print(f"events={n:,} records={records:,} ({args.payload}) "
              f"matches={svc.counts['matches_out']:,} into {args.output}")
        print(f"engine alone      {alone:>12,.0f} events/s  (every join kept)")
        print(f"adaptive alone    {alone_adaptive:>12,.0f} events/s  (auto, as the service; "
              f"{len(adaptive.moves)} moves, ends as {adaptive.constructions})")
        print(f"service's engine: {len(svc.engine.moves)} moves, ends as "
              f"{svc.engine.constructions}")
        print(f"service step()    {n / stepped:>12,.0f} events/s  ({n / stepped / alone:.2f}x "
              f"the engine; with the checkpoint {n / total:,.0f} events/s)")
        print(f"target {TARGET:,}: {n / stepped / TARGET:.2f}x")


if __name__ == "__main__":
    main()
