"""``dqcep generate`` (also ``python -m dqcep.generator``): write or publish a synthetic stream.

The command line itself is ``dqcep.cli``'s; this module adds its arguments and runs it."""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

from dqcep.core.batch import Malformed
from dqcep.core.errors import UserError
from dqcep.io.event_writers import EVENT_FORMATS, BatchEncoder, ParquetSink
from dqcep.io.publish import Pacer, add_shape_arguments
from dqcep.io.readers import TRUTH_SUFFIX
from dqcep.core.limits import COUNT, FRACTION, MILLISECONDS, NON_NEGATIVE_COUNT, POSITIVE
from dqcep.io.sinks import create_file

DESCRIPTION = """Generate a synthetic event stream (profiles iot, stock, uniform) with
optional planted pattern occurrences and imperfections, and write it as JSON Lines,
msgpack batches, CSV or Parquet to a file or stdout, or publish it as msgpack batches
(QoS 1) to an MQTT topic. The same arguments and --seed give the same bytes.
See docs/generator.md."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=("iot", "stock", "uniform"),
                   help="event profile (default: iot, or the scenario's)")
    p.add_argument("--events", "-n", type=NON_NEGATIVE_COUNT.option, help="number of distinct events (default 10000)")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--format", "-f", choices=EVENT_FORMATS,
                   help="output format (default: from the file extension, else jsonl; "
                   "msgpack for MQTT)")
    p.add_argument("--output", "-o", default="-",
                   help="file path, - for stdout (default), or mqtt://host:port/topic")
    p.add_argument("--rate", type=POSITIVE.option,
                   help="target events per second of wall-clock time (default: as fast as "
                   "possible)")
    p.add_argument("--scenario", metavar="FILE", help="JSON or TOML scenario (docs/generator.md)")
    p.add_argument("--chunk-size", type=COUNT.option, default=65_536,
                   help="events generated and written per step (bounds memory)")
    p.add_argument("--batch-size", type=COUNT.option, default=1000,
                   help="events per msgpack payload {\"events\": [...]} (default 1000)")
    plant = p.add_argument_group("planted patterns")
    plant.add_argument("--plant", metavar="QUERIES.cep",
                       help="plant occurrences of these queries' patterns")
    plant.add_argument("--plant-query", metavar="NAME", help="only this query of the file")
    plant.add_argument("--plant-every", type=COUNT.option, metavar="MS",
                       help="one occurrence per MS of event time (default 10000, or more "
                       "than 2 x (the longest window + clock skew) when that is larger)")
    plant.add_argument("--truth", metavar="FILE",
                       help="ground truth output (default: OUTPUT.truth.jsonl)")
    imp = p.add_argument_group("imperfections (fractions of events, times in ms)")
    for flag, kind, help_ in (
            ("--out-of-order", float, "share delayed by up to --slack"),
            ("--slack", int, "bound of the ordinary arrival delay"),
            ("--late", float, "share delayed beyond --slack (up to --late-max)"),
            ("--late-max", int, "longest delay of a late event"),
            ("--duplicates", float, "share sent twice"),
            ("--missing-attributes", float, "share with one attribute left out"),
            ("--malformed", float, "share written malformed (no type, bad ts, undecodable)"),
            ("--clock-skew", int, "per-source clock offset, uniform in [-skew, +skew]")):
        # a share is in [0, 1], a delay or skew a count of ms
        imp.add_argument(flag, type=(FRACTION if kind is float else MILLISECONDS).option,
                         help=help_)
    add_shape_arguments(p, ("batch", "event", "object", "value"), "batch")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")


def _overrides(args) -> dict:
    out = {"profile": args.profile, "events": args.events, "seed": args.seed,
           "plant.queries": args.plant, "plant.query": args.plant_query,
           "plant.every": args.plant_every}
    for name in ("out_of_order", "slack", "late", "late_max", "duplicates",
                 "missing_attributes", "malformed", "clock_skew"):
        out[f"imperfections.{name}"] = getattr(args, name)
    return out


# 0xc1 is the one byte msgpack never uses: a payload starting with it cannot decode.
UNDECODABLE_PAYLOAD = b"\xc1 not msgpack"


def _publish(publisher, encoder: BatchEncoder, batch) -> int:
    """Publish a batch as msgpack payloads; undecodable events go alone as broken payloads.

    Returns the bytes published.
    """
    written = 0
    if batch.malformed is not None:
        broken = batch.malformed == Malformed.UNDECODABLE
        for _ in range(int(broken.sum())):
            publisher.publish(UNDECODABLE_PAYLOAD)
            written += len(UNDECODABLE_PAYLOAD)
        batch = batch.take(~broken)
    buf, ends = encoder.msgpack_payloads(batch)
    start = 0
    for end in ends:
        publisher.publish(buf[start:end].tobytes())
        start = int(end)
    return written + len(buf)


def _publish_shaped(publisher, encoder: BatchEncoder, batch, template, shape) -> int:
    """One message per event, its topic from the template, its payload of the shape."""
    from dqcep.core.events import event_from_mapping
    from dqcep.io.publish import messages
    events = ((f"generated event {obj['id']}", event_from_mapping(obj))
              for obj, _ in encoder.rows(batch))
    written = 0
    for topic, payload in messages(events, template, shape):
        publisher.publish(payload, topic=topic)
        written += len(payload)
    return written


def run(args) -> int:
    from dqcep.generator.config import load_scenario
    from dqcep.generator.core import StreamGenerator

    if args.chunk_size < 1 or args.batch_size < 1:
        raise UserError("--chunk-size and --batch-size must be >= 1")
    cfg = load_scenario(args.scenario, _overrides(args))
    gen = StreamGenerator(cfg)
    mqtt = args.output.startswith(("mqtt://", "mqtts://"))
    fmt = args.format
    if mqtt:
        if fmt not in (None, "msgpack"):
            raise UserError("MQTT output is msgpack batches; drop --format or use msgpack")
        fmt = "msgpack"
    elif fmt is None:
        fmt = {".msgpack": "msgpack", ".mpk": "msgpack", ".csv": "csv",
               ".parquet": "parquet"}.get(Path(args.output).suffix.lower(), "jsonl")
    if fmt == "parquet" and args.output == "-":
        raise UserError("Parquet cannot be written to stdout; give --output FILE.parquet")
    truth_path = args.truth
    if cfg.plant.queries and truth_path is None:
        if args.output == "-" or mqtt:
            raise UserError("with --plant and output to stdout or MQTT, say where the ground "
                            "truth goes: --truth FILE")
        truth_path = args.output + TRUTH_SUFFIX  # a directory of events leaves it out

    encoder = BatchEncoder(gen.schema, fmt, args.batch_size)
    publisher = sink = stream = shaped = None
    if not mqtt and args.payload != "batch":
        raise UserError("--payload shapes MQTT messages; a file holds events (--format)")
    if mqtt:
        from dqcep.io.mqtt import MqttPublisher, MqttUrl
        from dqcep.io.publish import TopicTemplate, shape_from_args
        url = MqttUrl.parse(args.output)
        template = TopicTemplate(url.topic)
        if args.payload != "batch" or template.fields:
            if args.payload == "batch":
                raise UserError("a topic template sends one event per message: give "
                                "--payload event, object or value")
            if cfg.imperfections.malformed:
                raise UserError("--malformed events go out in msgpack batches "
                                "(--payload batch)")
            shaped = (template, shape_from_args(args, template))
        publisher = MqttPublisher(url)
    elif args.output == "-":
        stream = sys.stdout.buffer
    else:
        stream = create_file(args.output)
        if fmt == "parquet":
            sink = ParquetSink(gen.schema, stream)
    truth = io.TextIOWrapper(create_file(truth_path, "the ground truth"),
                             encoding="utf-8") if truth_path else None

    progress = None
    if not args.quiet:
        from tqdm import tqdm
        progress = tqdm(total=cfg.events, unit="ev", unit_scale=True, file=sys.stderr,
                        desc=f"generate {cfg.profile}", leave=False)
    pacer = Pacer(args.rate)
    written = 0
    started = time.perf_counter()
    try:
        # with --rate, steps of 1/20 s: a whole chunk at once would be a burst after a pause
        step = args.chunk_size if not args.rate else max(1, min(args.chunk_size,
                                                                int(args.rate / 20)))
        for batch in gen.batches(step):
            pacer.wait(len(batch))
            if shaped is not None:
                written += _publish_shaped(publisher, encoder, batch, *shaped)
            elif publisher is not None:
                written += _publish(publisher, encoder, batch)
            elif sink is not None:
                sink.write(batch)
            else:
                data = encoder.encode(batch)
                stream.write(data)
                written += len(data)
            if truth is not None:
                for line in gen.truth:
                    truth.write(json.dumps(line) + "\n")
                gen.truth.clear()
            if progress is not None:
                progress.update(gen.summary.events - progress.n)
    finally:
        if progress is not None:
            progress.close()
        if publisher is not None:
            publisher.close()
        if sink is not None:
            sink.close()
        if stream is not None and stream is not sys.stdout.buffer:
            stream.close()
        elif stream is not None:
            stream.flush()
        if truth is not None:
            truth.close()
    elapsed = time.perf_counter() - started
    if sink is not None:
        written = Path(args.output).stat().st_size
    s = gen.summary
    if not args.quiet:
        where = args.output if args.output != "-" else "stdout"
        print(f"generated {s.events} events ({s.planted_events} planted in {s.occurrences} "
              f"occurrences) as {s.records} {fmt} records, {written} bytes to {where} in "
              f"{elapsed:.2f} s ({s.events / elapsed if elapsed else 0:,.0f} events/s)",
              file=sys.stderr)
        print(f"imperfections: {s.imperfection_line()}; suppressed for planting "
              f"{s.suppressed}", file=sys.stderr)
        if truth_path:
            print(f"ground truth: {s.occurrences} occurrences in {truth_path}", file=sys.stderr)
    return 0

