"""``dqcep demo``: example queries over a generated stream."""
from __future__ import annotations

from dqcep.core.errors import UserError
from dqcep.core.limits import COUNT, NON_NEGATIVE_COUNT


def add_parser(sub) -> None:
    """``dqcep demo``."""
    demo = sub.add_parser(
        "demo", help="run example queries over a generated IoT stream (no services needed)",
        description="Generate an IoT sensor stream with planted occurrences of the demo "
        "queries (dqcep/data/iot.cep), run it through the native engine and print matches, "
        "recall of the planted occurrences and the engine's figures.")
    demo.add_argument("--events", "-n", type=COUNT.option, default=None,
                      help="events to generate (default 200000; 50000 with --mqtt)")
    demo.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    demo.add_argument("--show", type=NON_NEGATIVE_COUNT.option, default=10, help="matches to print (default 10)")
    demo.add_argument("--mqtt", action="store_true",
                      help="go through a real MQTT broker and the streaming service: the one "
                      "at --broker, else localhost:1883, else a Mosquitto started for the demo")
    demo.add_argument("--broker", metavar="HOST:PORT", help="the MQTT broker for --mqtt")
    demo.set_defaults(func=command)


def command(args) -> int:
    from dqcep.demo import run_demo, run_demo_mqtt

    if args.events is None:
        args.events = 50_000 if args.mqtt else 200_000
    if args.events < 1:
        raise UserError("--events must be >= 1")
    if args.mqtt:
        return run_demo_mqtt(args.events, args.seed, args.show, args.broker)
    if args.broker:
        raise UserError("--broker goes with --mqtt")
    return run_demo(args.events, args.seed, args.show)
