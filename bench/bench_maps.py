"""What reading a feed by content costs (issue 53): a Shelly-shaped feed, each
``NotifyStatus`` message holding a temperature, a humidity and a battery reading, read
by two maps, alternating over ``--repeat`` rounds:

- ``one type`` (as a map had to before): one event per message, type ``Shelly``, every
  reading flattened into it (``params_temperature:0_tC``, ...);
- ``three types``: ``examples/devices.toml`` (a ``when`` on the method and three
  ``[[topic.event]]`` tables): three events per message (Temperature, Humidity,
  Battery), each with its own attributes.

Both are read by ``TopicMap.read`` (the service's Python path: nested payloads are not
the kernel's) from journal records held in memory. Prints messages/s and events/s per
round and the median ratios of three types to one (target: events/s >= 0.8x).

    python3 bench/bench_maps.py [--messages N] [--repeat R]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dqcep.io.journal import Record  # noqa: E402
from dqcep.io.mapping import TopicMap  # noqa: E402

COMMON = """
[[topic]]
filter = "+/events/rpc"
levels = "device/_/_"
ts = "params.ts"
ts_unit = "s"
"""
ONE_TYPE = COMMON + 'type = "Shelly"\n'
# examples/devices.toml's Shelly rule: a when on the method, three event tables (its
# other rules, for other topics, are never reached here)
THREE_TYPES = (ROOT / "examples" / "devices.toml").read_text()
TARGET = 0.8


def messages(n: int) -> list[Record]:
    out = []
    for i in range(n):
        payload = {"src": f"shellyplusht-{i % 500}", "dst": "shellyplusht/events",
                   "method": "NotifyStatus", "params": {
                       "ts": 1795687200 + i / 10,
                       "temperature:0": {"id": 0, "tC": 20 + i % 10, "tF": 68 + i % 18},
                       "humidity:0": {"id": 0, "rh": 40 + i % 20},
                       "devicepower:0": {"id": 0, "battery": {"V": 5.9, "percent": 86}}}}
        out.append(Record(i, f"shellyplusht-{i % 500}/events/rpc",
                          json.dumps(payload).encode(), 1_795_687_200_000_000, None))
    return out


def run(text: str, records: list[Record]) -> tuple[float, int]:
    topic_map = TopicMap.parse(text)
    started = time.perf_counter()
    events = 0
    for r in records:
        got, bad = topic_map.read(r)
        assert not bad, bad
        events += len(got)
    return time.perf_counter() - started, events


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    records = messages(args.messages)
    ratios_msg, ratios_ev = [], []
    for k in range(args.repeat):
        rates = {}
        order = [("one type", ONE_TYPE), ("three types", THREE_TYPES)]
        for name, text in order if k % 2 == 0 else order[::-1]:
            seconds, events = run(text, records)
            rates[name] = (len(records) / seconds, events / seconds)
            print(f"round {k + 1}: {name:<12} {rates[name][0]:>10,.0f} messages/s "
                  f"{rates[name][1]:>10,.0f} events/s")
        ratios_msg.append(rates["three types"][0] / rates["one type"][0])
        ratios_ev.append(rates["three types"][1] / rates["one type"][1])
    msg, ev = statistics.median(ratios_msg), statistics.median(ratios_ev)
    print(f"three types / one type: messages/s {msg:.2f}x, events/s {ev:.2f}x "
          f"(target events/s >= {TARGET}x: {'met' if ev >= TARGET else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
