"""``dqcep publish``: an event file to MQTT, as devices send it."""
from __future__ import annotations

import sys

from dqcep.core.limits import POSITIVE


def add_parser(sub) -> None:
    """``dqcep publish``."""
    pub = sub.add_parser(
        "publish", help="publish an event file to MQTT as devices send it",
        description="Send the events of a file (JSON Lines, msgpack, CSV, Parquet) to an "
        "MQTT broker with QoS 1, one message per event, its topic from a template "
        "(mqtt://host:port/sensors/{room}/{type}: {type}, {id}, {ts} or any attribute) and "
        "its payload of a shape (--payload): what a feed of real devices looks like, for "
        "the service's --map (docs/streaming.md). Waits until the broker has acknowledged "
        "every message.")
    pub.add_argument("input", metavar="EVENTS", help="event file, or - for stdin (JSON Lines)")
    pub.add_argument("url", metavar="mqtt://HOST:PORT/TOPIC-TEMPLATE",
                     help="the broker and the topic of each event (a template)")
    pub.add_argument("--format", choices=("jsonl", "msgpack", "csv", "parquet", "json"),
                     help="event format (default: from the file extension)")
    from dqcep.io.publish import add_shape_arguments
    add_shape_arguments(pub, ("event", "object", "value"), "event")
    pub.add_argument("--rate", type=POSITIVE.option, metavar="N",
                     help="messages per second (default: as fast as the broker acknowledges)")
    pub.add_argument("--client-id", metavar="ID", help="MQTT client id (default: the broker's)")
    pub.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    pub.set_defaults(func=command)


def command(args) -> int:
    """Publish an event file to MQTT, one message per event, as devices send them."""
    from dqcep.io.mqtt import MqttPublisher, MqttUrl
    from dqcep.io.publish import Pacer, TopicTemplate, messages, shape_from_args
    from dqcep.io.readers import read_events

    url = MqttUrl.parse(args.url)
    template = TopicTemplate(url.topic)
    shape = shape_from_args(args, template)
    pacer = Pacer(args.rate)
    # every event read and its message made before the first is sent: a bad record
    # stops it with its place, and nothing is published (a file is read twice, stdin
    # is held)
    source = "<stdin>" if args.input == "-" else args.input

    def placed():  # (FILE:LINE:COL, event)
        return ((f"{source}:{where}", e) for where, e in read_events(args.input, args.format))
    events = list(placed()) if args.input == "-" else placed()
    for _ in messages(events, template, shape):
        pass
    if args.input != "-":
        events = placed()
    progress = None
    if not args.quiet:
        from tqdm import tqdm
        progress = tqdm(unit="msg", unit_scale=True, file=sys.stderr, leave=False,
                        desc=f"publish {args.input}")
    publisher = MqttPublisher(url, client_id=args.client_id or "")
    sent = 0
    try:
        for topic, payload in messages(events, template, shape):
            pacer.wait(1)
            publisher.publish(payload, topic=topic)
            sent += 1
            if progress is not None and sent % 256 == 0:
                progress.update(256)
    finally:
        if progress is not None:
            progress.close()
        publisher.close()  # waits for every acknowledgement
    if not args.quiet:
        print(f"dqcep publish: {sent} messages to {url.host}:{url.port} ({args.payload} "
              "payloads), all acknowledged", file=sys.stderr)
    return 0
