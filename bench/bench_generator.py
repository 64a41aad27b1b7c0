"""Generator throughput to a file, per profile and format, on one core.

Runs in one process pinned to one CPU: generate N events and write them to a
temporary file (the same path as `dqcep generate --output FILE`, without the
progress bar). Prints events/s and MB/s per (profile, format), best of 3.
The target from the generator issue: >= 2 million events/s to msgpack.

    python3 bench/bench_generator.py [--events N] [--formats msgpack,jsonl]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from dqcep.io.event_writers import BatchEncoder, ParquetSink
from dqcep.generator import GeneratorConfig, StreamGenerator


def once(profile: str, fmt: str, events: int, path: str) -> tuple[float, int]:
    gen = StreamGenerator(GeneratorConfig(profile=profile, events=events, seed=1))
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        if fmt == "parquet":
            sink = ParquetSink(gen.schema, f)
            for batch in gen.batches():
                sink.write(batch)
            sink.close()
        else:
            enc = BatchEncoder(gen.schema, fmt)
            for batch in gen.batches():
                f.write(enc.encode(batch))
    return time.perf_counter() - t0, os.path.getsize(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--profiles", default="uniform,iot,stock")
    ap.add_argument("--formats", default="msgpack,jsonl")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    print(f"events={args.events}, one core, best of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            for profile in args.profiles.split(","):
                path = os.path.join(tmp, f"out.{fmt}")
                best, size = min(once(profile, fmt, args.events, path)
                                 for _ in range(args.repeat))
                print(f"{profile:8s} {fmt:8s} {args.events / best / 1e6:7.2f} M events/s "
                      f"{size / best / 1e6:8.1f} MB/s  {size / args.events:6.1f} bytes/event")


if __name__ == "__main__":
    main()
