"""ArrivalIndex.latest against the rule written out: per match, the latest known arrival
of its candidates found among the batch's ids (-inf: none)."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dqcep._kernels.arrivals import ArrivalIndex
from tests.support.examples import examples


@settings(max_examples=examples(300), deadline=None)
@given(st.data())
def test_the_latest_arrivals_follow_the_rule(data):
    ids = data.draw(st.lists(st.integers(0, 40), unique=True, max_size=20))
    arrival = data.draw(st.lists(st.one_of(st.floats(0, 100), st.just(math.nan)),
                                 min_size=len(ids), max_size=len(ids)))
    width = data.draw(st.integers(0, 4))
    rows = data.draw(st.lists(st.lists(st.integers(-1, 45), min_size=width, max_size=width),
                              max_size=12))
    cand = np.array(rows, np.int64).reshape(len(rows), width)
    got = ArrivalIndex(np.array(ids, np.int64), np.array(arrival, np.float64)).latest(cand)
    at = dict(zip(ids, arrival))
    want = [max([at[x] for x in row if x >= 0 and x in at and not math.isnan(at[x])],
                default=-math.inf) for row in rows]
    assert got.tolist() == want
