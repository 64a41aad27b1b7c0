"""``dqcep calibrate``: each query's processing time per payload."""
from __future__ import annotations

import sys

from dqcep.cli.common import load_queries
from dqcep.core.errors import UserError
from dqcep.core.limits import COUNT, NON_NEGATIVE


def add_parser(sub) -> None:
    """``dqcep calibrate``."""
    cal = sub.add_parser(
        "calibrate", help="measure each query's processing time per payload (for capacity)",
        description="Cut EVENTS into payloads of --batch-size events, as MQTT delivers "
        "them, and run the streaming service's own path over them (journal read, decoding, "
        "repeated ids, engine, match output) hosting each query of QUERIES alone, then all "
        "of them (the shared plan), timed payload by payload; time the service's own work "
        "per payload without an engine and the journal's commit (fsync) in --journal. "
        "Writes each query's mean time per payload and its second moment (alone, and "
        "charged from the shared plan in proportion to its time alone), the own work and "
        "the commit to --output. docs/capacity.md says what is measured and assumed.")
    cal.add_argument("queries", metavar="QUERIES.cep", help="query file")
    cal.add_argument("--input", "-i", required=True, metavar="EVENTS", help="event file")
    cal.add_argument("--format", choices=("jsonl", "msgpack", "csv", "parquet"),
                     help="input format (default: from the extension)")
    cal.add_argument("--batch-size", type=COUNT.option, default=200, metavar="N",
                     help="events per payload (default 200)")
    cal.add_argument("--broker", metavar="mqtt://HOST:PORT/TOPIC",
                     help="calibrate live: run each service as dqcep run against this broker "
                     "and publish the payloads below TOPIC (default: in this process, no "
                     "broker)")
    cal.add_argument("--workers", type=int, default=1, metavar="N",
                     help="with --broker: measure the queries alone as dqcep run --workers N "
                     "would run them (default 1; a consumer's cost grows with the processes "
                     "beside it)")
    cal.add_argument("--gap", type=NON_NEGATIVE.option, default=2.0, metavar="MS",
                     help="idle time before each payload (default 2 ms: low load)")
    cal.add_argument("--loads", metavar="SHARES",
                     help="with --broker: measure again with Poisson arrivals at these shares "
                     "of the shared plan's capacity (default 0.4,0.8; '' for none): the time "
                     "per payload falls as the rate rises (batching)")
    cal.add_argument("--repeat", type=int, metavar="N",
                     help="with --broker: every run N times, the median kept (default 3: a "
                     "shared machine's interference comes and goes)")
    cal.add_argument("--journal", metavar="DIR",
                     help="where the service's journal will live, for the commit time "
                     "(default: the directory of --output)")
    cal.add_argument("--output", "-o", default="calibration.json", metavar="FILE",
                     help="where the calibration goes (default calibration.json)")
    cal.set_defaults(func=command)


def command(args) -> int:
    import json
    from pathlib import Path

    from dqcep.service.scaling.calibrate import calibrate, payloads_of
    from dqcep.io.readers import read_events
    from dqcep.runtime.pipeline import BadEvents

    load_queries(args.queries)  # its errors, with positions, before any work
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    if args.broker and not args.broker.startswith(("mqtt://", "mqtts://")):
        raise UserError(f"--broker {args.broker}: give mqtt://host:port/topic")
    if args.gap < 0:
        raise UserError("--gap must be >= 0")
    if args.workers < 1 or args.workers > 1 and not args.broker:
        raise UserError("--workers N (>= 1) is for the live calibration, with --broker")
    if args.loads is not None and not args.broker:
        raise UserError("--loads is for the live calibration, with --broker")
    if args.repeat is not None and (args.repeat < 1 or not args.broker):
        raise UserError("--repeat N (>= 1) is for the live calibration, with --broker")
    try:
        loads = [float(x) for x in (args.loads if args.loads is not None else
                                    "0.4,0.8" if args.broker else "").split(",") if x]
    except ValueError:
        raise UserError(f"--loads {args.loads}: give shares such as 0.4,0.8") from None
    if any(not 0 < x < 1.5 for x in loads):
        raise UserError(f"--loads {args.loads}: each share must be above 0 and below 1.5")
    bad = BadEvents("skip")
    events = [e.as_mapping() for _, e in read_events(args.input, args.format, bad)]
    if not events:
        raise UserError(f"{args.input} holds no event to calibrate with")
    journal_dir = args.journal or str(Path(args.output).resolve().parent)
    result = calibrate(args.queries, payloads_of(events, args.batch_size), args.batch_size,
                       journal_dir, broker=args.broker, gap=args.gap / 1000,
                       workers=args.workers, loads=loads,
                       repeats=args.repeat or (3 if args.broker else 1))
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result.to_json(), f, indent=2)
        f.write("\n")

    def sd(c):
        return max(c.m2 - c.b * c.b, 0.0) ** 0.5 * 1e3
    print(f"{'per payload (ms)':<20} {'alone':>9} {'sd':>9} {'charged shared':>15}")
    for name, c in result.alone.items():
        print(f"{name:<20} {c.b * 1e3:>9.4f} {sd(c):>9.4f} {result.shared[name].b * 1e3:>15.4f}")
    print(f"{'own work (overhead)':<20} {result.overhead.b * 1e3:>9.4f} "
          f"{sd(result.overhead):>9.4f}")
    print(f"{'delay':<20} {result.delay * 1e3:>9.4f}")
    print(f"{'checkpoint':<20} {result.checkpoint.b * 1e3:>9.4f} {sd(result.checkpoint):>9.4f}"
          f"  every {result.checkpoint_every:g} s")
    for p in result.points:  # the same at a higher rate
        print(f"at {p.rate * args.batch_size:,.0f} events/s: shared plan "
              f"{p.shared_b * 1e3:.4f} ms per payload; alone "
              + ", ".join(f"{q} {c.b * 1e3:.4f}" for q, c in p.alone.items()))
    total = sum(c.b for c in result.alone.values())
    plan = sum(c.b for c in result.shared.values())
    print(f"shared plan {result.shared_b * 1e3:.4f} ms per payload with the overhead "
          f"({plan / total if total else 1:.2f}x the queries alone without it); "
          f"{result.payloads:,} payloads of {args.batch_size} events; written to "
          f"{args.output}", file=sys.stderr)
    return 0
