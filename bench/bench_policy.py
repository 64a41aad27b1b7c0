"""A Kleene rising run with and without ``AFTER MATCH SKIP PAST LAST EVENT`` (spec 6).

Every room's temperature rises for the whole stream (R rooms in turn, one
reading a millisecond: a reading per room every R ms), every fourth reading of a
room is smoke, and the query is the fire alert of docs/language.md section 7
under skip-till-any-match:

    PATTERN SEQ(Temperature+ t[], Smoke s) WHERE [room] AND t[i].value > t[i-1].value
            AND count(t) >= 3 WITHIN W [AFTER MATCH SKIP PAST LAST EVENT]

Without the policy every rising sub-list of the window's temperatures (2^k lists a
room for k of them in W, across the smokes) is a match with each later smoke;
with it a room gets one alert per smoke, and the engine drops the lists that
start before the last accepted alert's smoke, so its state depends on neither the
window's lists nor the stream's length. The native engine runs both (``Engine.process`` over the columns in
batches of R events, then ``flush``; the events are made as columns, not read,
so the figures are the engine's), on N events and, with the policy, on 10 N. It
prints events/s, matches and the peak state of each; on a prefix both agree with
the reference matcher. Then the user's figure: the same N events as a JSON lines
file through ``dqcep run --stats`` (reading, chunks of 65,536 events, the adaptive
engine, the output file: what a user of the fire alert gets), its events/s and peak
state as it prints them.

    python3 bench/bench_policy.py [--events N] [--rooms R] [--window-ms W] [--batch B]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

QUERY = """QUERY fire
PATTERN SEQ(Temperature+ t[], Smoke s)
WHERE [room] AND t[i].value > t[i-1].value AND count(t) >= 3
WITHIN {window} ms{policy}
"""
POLICY = " AFTER MATCH SKIP PAST LAST EVENT"


def columns(engine, first: int, n: int, rooms: int):
    """Events first .. first + n - 1 as the engine's columns: event i is room i % R's
    reading number j = i // R (its value), at ts i: smoke when j % 4 == 3."""
    from dqcep.runtime.compile import KIND_NUM, KIND_STR
    from dqcep.runtime.eventtime import EventColumns
    i = np.arange(first, first + n, dtype=np.int64)
    val = np.zeros((n, len(engine.attrs)), np.float64)
    kind = np.full((n, len(engine.attrs)), KIND_NUM, np.int8)
    codes = np.array([engine.dictionary.code(f"r{r}") for r in range(rooms)], np.float64)
    room, value = engine.attr_index["room"], engine.attr_index["value"]
    val[:, room], kind[:, room] = codes[i % rooms], KIND_STR
    val[:, value] = i // rooms
    types = np.where((i // rooms) % 4 == 3, engine.type_code["Smoke"],
                     engine.type_code["Temperature"]).astype(np.int32)
    return EventColumns(i, i + 1, types, val, kind)


def run(policy: bool, n: int, rooms: int, window: int, batch: int | None = None) -> dict:
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    text = QUERY.format(window=window, policy=POLICY if policy else "")
    engine = Engine(build_plan(parse(text).queries))
    matches = 0
    started = time.perf_counter()
    batch = batch or rooms
    for first in range(0, n, batch):
        matches += len(engine.process(columns(engine, first, min(batch, n - first), rooms)))
    matches += len(engine.flush())
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "matches": matches, "peak": engine.state.peak_state_bytes,
            "stopped": engine.stopped}


def dqcep_run(n: int, rooms: int, window: int) -> dict:
    """``dqcep run --stats`` with the policy over the events as a JSON lines file."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "fire.cep").write_text(QUERY.format(window=window, policy=POLICY))
        with open(tmp / "events.jsonl", "w") as f:
            for i in range(n):
                j = i // rooms
                f.write(json.dumps({"type": "Smoke" if j % 4 == 3 else "Temperature",
                                    "ts": i, "id": i + 1, "room": f"r{i % rooms}",
                                    "value": j}) + "\n")
        done = subprocess.run([sys.executable, "-m", "dqcep", "run", str(tmp / "fire.cep"),
                               "--input", str(tmp / "events.jsonl"), "-o",
                               str(tmp / "out.jsonl"), "--stats"],
                              capture_output=True, text=True, check=True)
        found = re.search(r"events: (\d+) in ([\d.]+) s .*peak state (\d+) bytes",
                          done.stderr)
        matches = sum(1 for _ in open(tmp / "out.jsonl"))
    return {"seconds": float(found[2]), "matches": matches, "peak": int(found[3]),
            "stopped": {}}


def agrees(policy: bool, n: int, rooms: int, window: int) -> bool:
    """The native engine's matches equal the reference's on the first n events."""
    from dqcep.core.events import Event
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.baseline.reference import ReferenceMatcher
    from dqcep.runtime import run_events
    queries = parse(QUERY.format(window=window, policy=POLICY if policy else "")).queries
    events = [Event(i + 1, "Smoke" if (i // rooms) % 4 == 3 else "Temperature", i,
                    {"room": f"r{i % rooms}", "value": i // rooms}) for i in range(n)]
    got, _ = run_events(build_plan(queries), [events[i:i + rooms]
                                              for i in range(0, n, rooms)])
    want = ReferenceMatcher(queries).run(events)
    return {(m.events, m.detected_at) for m in got.to_matches()} == \
        {(m.events, m.detected_at) for m in want}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rooms", type=int, default=1000)
    ap.add_argument("--window-ms", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=None,
                    help="events per engine call (default R; the service's calls hold 2-20)")
    args = ap.parse_args(argv)
    n, rooms, w, b = args.events, args.rooms, args.window_ms, args.batch or args.rooms
    small = min(n, 6 * rooms)
    print(f"{rooms} rooms, a reading per room every {rooms} ms, rising; WITHIN {w} ms "
          f"({w // rooms} readings a room); batches of {b} events")
    print(f"agrees with the reference on {small:,} events: without "
          f"{agrees(False, min(small, 3 * rooms), rooms, w)}, with {agrees(True, small, rooms, w)}")
    rows = [("without policy", n, run(False, n, rooms, w, b)),
            ("with policy", n, run(True, n, rooms, w, b)),
            ("with policy", 10 * n, run(True, 10 * n, rooms, w, b)),
            ("dqcep run", n, dqcep_run(n, rooms, w))]
    print(f"{'run':<16} {'events':>11} {'seconds':>8} {'events/s':>10} {'matches':>12} "
          f"{'peak state':>11}")
    for name, events, r in rows:
        print(f"{name:<16} {events:>11,} {r['seconds']:>8.2f} {events / r['seconds']:>10,.0f} "
              f"{r['matches']:>12,} {r['peak'] / 1e6:>8.2f} MB"
              + (f"  STOPPED: {next(iter(r['stopped'].values()))[:60]}..." if r["stopped"]
                 else ""))
    without, with_, longer, user = (r for _, _, r in rows)
    print(f"peak state without / with the policy at {n:,} events: "
          f"{without['peak'] / with_['peak']:.1f}x; with the policy, {10 * n:,} / {n:,} events: "
          f"{longer['peak'] / with_['peak']:.2f}x; events/s with / without: "
          f"{without['seconds'] / with_['seconds']:.1f}x; dqcep run / the engine: events/s "
          f"{with_['seconds'] / user['seconds']:.2f}x, peak state "
          f"{user['peak'] / with_['peak']:.2f}x")


if __name__ == "__main__":
    main()
