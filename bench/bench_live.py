"""The stall of a live change: how long the service's consumption stops to add (or
remove) a query while it holds many partial matches (issue 39's target: < 100 ms
with 10^5 partial matches).

A journal of N events (type A in 100 rooms, one every millisecond; msgpack batches
of 1000) is consumed by an in-process ``StreamingService`` running
``SEQ(A a, B b) WHERE [room] WITHIN 10 min``: every A waits in the SEQ vertex's left
queue, N partial matches. Then a control record that adds a query sharing that
vertex (and one with a vertex of its own), and later one that removes it, are
journaled and consumed; each ``step()`` that applies one is timed: that is the time
no event is processed (ingestion goes on meanwhile: the MQTT source journals).

    python3 bench/bench_live.py [--events N] [--repeat K]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgpack

QUERIES = """QUERY pairs
PATTERN SEQ(A a, B b)
WHERE [room]
WITHIN 10 min
"""
ADDED = """QUERY pairs2
PATTERN SEQ(A x, B y)
WHERE [room]
WITHIN 10 min;
QUERY hot
PATTERN SEQ(A a, NOT C c, B b)
WHERE [room] AND a.v > 5
WITHIN 1 min
"""
TARGET_MS = 100.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from dqcep.io.journal import Journal
    from dqcep.service import ServiceConfig, StreamingService
    from dqcep.service.changes import CONTROL_TOPIC, control_record

    adds, removes, held = [], [], 0
    for run in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            (tmp / "q.cep").write_text(QUERIES)
            journal = Journal(tmp / "journal", fsync="never")
            for start in range(0, args.events, 1000):
                events = [{"id": i + 1, "type": "A", "ts": 1_700_000_000_000 + i,
                           "room": f"r{i % 100}", "v": i % 10}
                          for i in range(start, min(start + 1000, args.events))]
                journal.append("sensors", msgpack.packb({"events": events}))
            journal.commit()
            journal.close()
            svc = StreamingService(ServiceConfig(
                queries=str(tmp / "q.cep"), inputs=["mqtt://127.0.0.1:1/sensors"],
                journal=str(tmp / "journal"), checkpoint=str(tmp / "ck.bin"),
                output=str(tmp / "out.jsonl"), dead_letter=str(tmp / "dead.jsonl"),
                late=str(tmp / "late.jsonl")))
            while svc.step():
                pass
            held = sum(len(q) for q in svc.engine.state.left_q.values())
            timings = {}
            for name, payload in (("add", control_record("add", text=ADDED)),
                                  ("remove", control_record("remove", name="pairs2"))):
                svc.journal.append(CONTROL_TOPIC, payload)
                svc.journal.commit()
                started = time.perf_counter()
                assert svc.step() == 1
                timings[name] = (time.perf_counter() - started) * 1e3
            assert svc.query_set.names == ["pairs", "hot"], svc.query_set.names
            adds.append(timings["add"])
            removes.append(timings["remove"])
            svc.close()
    print(f"events={args.events:,} partial matches held={held:,} runs={args.repeat}")
    print("add 2 queries  " + "  ".join(f"{t:7.1f}" for t in adds)
          + f"   median {statistics.median(adds):.1f} ms")
    print("remove 1 query " + "  ".join(f"{t:7.1f}" for t in removes)
          + f"   median {statistics.median(removes):.1f} ms")
    print(f"target < {TARGET_MS:g} ms: add {statistics.median(adds) / TARGET_MS:.2f}x of it")


if __name__ == "__main__":
    sys.exit(main())
