"""``dqcep generate``: a synthetic stream (``dqcep.generator``)."""
from __future__ import annotations


def add_parser(sub) -> None:
    """``dqcep generate``."""
    from dqcep.generator.cli import DESCRIPTION, add_arguments

    generate = sub.add_parser("generate", help="write or publish a synthetic event stream",
                              description=DESCRIPTION)
    add_arguments(generate)
    generate.set_defaults(func=command)


def command(args) -> int:
    from dqcep.generator.cli import run

    return run(args)
