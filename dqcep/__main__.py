import sys

from dqcep.cli import main

sys.exit(main())
