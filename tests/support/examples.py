"""How many examples a property test runs, under the Hypothesis profile loaded.

The counts in the tests' ``@settings(max_examples=examples(N))`` are the full run's:
under Hypothesis's ``default`` and ``ci`` profiles (100 examples a test) a test runs N.
The ``dev`` profile (``--hypothesis-profile dev``, registered in conftest.py; the
README's quick command) runs a tenth of each, at least two."""
from hypothesis import settings

FULL = 100  # max_examples of the default and ci profiles: the counts as written
DEV = 10


def examples(n: int) -> int:
    return max(2, n * settings().max_examples // FULL)
