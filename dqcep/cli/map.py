"""``dqcep map``: what a map (``--map FILE``) makes of a device's messages."""
from __future__ import annotations

import json
import sys
import time


def add_parser(sub) -> None:
    """``dqcep map test`` and ``dqcep map watch``."""
    cmd = sub.add_parser(
        "map", help="show the events a map makes of messages",
        description="What a map file (the service's --map, docs/streaming.md) makes of "
        "MQTT messages: one JSON line per event, {\"dead_letter\": {...}} with the reason "
        "for what becomes none, as the service would journal and read them.")
    how = cmd.add_subparsers(dest="map_command", required=True, metavar="test|watch")
    test = how.add_parser(
        "test", help="one message, given on the command line",
        description="Read one message (a topic and a payload) through the map and print "
        "its events or its dead letter.")
    test.add_argument("map", metavar="MAP.toml", help="the map file")
    test.add_argument("--topic", required=True, help="the message's MQTT topic")
    payload = test.add_mutually_exclusive_group(required=True)
    payload.add_argument("--payload", metavar="TEXT", help="the payload, as text")
    payload.add_argument("--payload-file", metavar="FILE",
                         help="the payload, the bytes of a file (- for stdin)")
    test.add_argument("--arrival", type=int, metavar="MS",
                      help="its arrival, ms since the epoch (default: now): the time of "
                      "events whose rule names no time field")
    test.set_defaults(func=command_test)
    watch = how.add_parser(
        "watch", help="messages as they come from a broker",
        description="Subscribe to a broker and print what the map makes of each message "
        "that comes, until N messages have come or none came for --timeout seconds.")
    watch.add_argument("map", metavar="MAP.toml", help="the map file")
    watch.add_argument("url", metavar="mqtt://HOST:PORT/FILTER",
                       help="the broker and the topic filter to subscribe to")
    watch.add_argument("-n", type=int, default=10, metavar="N",
                       help="stop after N messages (default 10)")
    watch.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="stop when no message came for S seconds (default 60)")
    watch.set_defaults(func=command_watch)


def _print(topic_map, record, out=sys.stdout) -> None:
    """The events of one record, or its dead letter; then what no query can name."""
    from dqcep.io.payloads import dead_letter
    said = len(topic_map.unnamable)
    events, rejected = topic_map.read(record)
    for e in events:
        out.write(json.dumps(e.as_mapping(), ensure_ascii=False) + "\n")
    if rejected:
        letter = dead_letter(record.offset, record.topic, record.payload,
                             len(record.payload), rejected)
        out.write(json.dumps({"dead_letter": letter}, ensure_ascii=False) + "\n")
    out.flush()
    for line in topic_map.unnamable_lines(said):
        print(f"dqcep map: {line}", file=sys.stderr)


def command_test(args) -> int:
    from dqcep.core.errors import UserError
    from dqcep.io.journal import Record
    from dqcep.io.mapping import TopicMap
    topic_map = TopicMap.load(args.map)
    if args.payload is not None:
        data = args.payload.encode("utf-8", "surrogateescape")
    elif args.payload_file == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(args.payload_file, "rb") as f:
                data = f.read()
        except OSError as err:
            raise UserError(f"cannot read {args.payload_file}: {err.strerror}") from None
    arrival = args.arrival if args.arrival is not None else time.time_ns() // 1_000_000
    _print(topic_map, Record(0, args.topic, data, arrival * 1000, None))
    return 0


def command_watch(args) -> int:
    import queue

    import paho.mqtt.client as mqtt

    from dqcep.core.errors import UserError
    from dqcep.io.journal import Record
    from dqcep.io.mapping import TopicMap
    from dqcep.io.mqtt import MqttUrl
    topic_map = TopicMap.load(args.map)
    url = MqttUrl.parse(args.url, subscribe=True)
    messages: queue.Queue = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    url.configure(client)

    def on_connect(client, userdata, flags, reason_code, properties):
        client.subscribe(url.topic, qos=1)

    client.on_connect = on_connect
    client.on_message = lambda c, u, m: messages.put(
        (m.topic, bytes(m.payload), time.time_ns() // 1000))
    try:
        client.connect(url.host, url.port)
    except OSError as err:
        raise UserError(f"cannot reach the broker {url.host}:{url.port}: "
                        f"{err.strerror or err}") from None
    client.loop_start()
    try:
        for offset in range(args.n):
            try:
                topic, payload, arrival_us = messages.get(timeout=args.timeout)
            except queue.Empty:
                print(f"dqcep map watch: no message for {args.timeout:g} s", file=sys.stderr)
                break
            _print(topic_map, Record(offset, topic, payload, arrival_us, None))
    finally:
        client.loop_stop()
        client.disconnect()
    return 0
