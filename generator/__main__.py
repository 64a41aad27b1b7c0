"""``python -m dqcep.generator ARGS`` is ``dqcep generate ARGS``: one parser, one entry point."""
import sys

from dqcep.cli import main

sys.exit(main(["generate", *sys.argv[1:]]))
