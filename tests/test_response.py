"""Response times per query: which event completed a match, and when it arrived."""
import numpy as np

from dqcep.io.mqtt import ArrivalTimes
from dqcep.response import ResponseTimes
from dqcep.runtime.eventtime import LIST_ID, MatchBatch, MatchLists


def ids(*rows):
    return np.array(rows, np.int64)


def test_the_latest_arriving_event_of_a_match_sets_its_response_time():
    # the batch's events 10, 11, 12, 13 arrived at 1.0, 2.0, 2.5, NaN (a replayed payload)
    batch_ids = np.array([13, 10, 12, 11], np.int64)
    arrival = np.array([np.nan, 1.0, 2.5, 2.0])
    batch = MatchBatch((("a", ("x", "y")), ("b", ("x", "y", "z"))))
    # a: (10, 11) completed by 11 (2.0); (5, 12) by 12 - event 5 is of an earlier batch;
    #    (5, 6): no event of this batch (released later): unmeasured
    batch.parts.append((0, np.zeros(3, np.int64), ids([10, 11], [5, 12], [5, 6]), None))
    # b: x=10, y unbound, z a Kleene list 11, 12 (ts order: 12 last) -> 2.5;
    #    x=13 (arrival unknown: replayed, so it came before any live one), z=[10] -> 1.0
    lists = MatchLists((2,), np.array([0, 2, 3], np.int64), np.array([11, 12, 10], np.int64))
    batch.parts.append((1, np.zeros(2, np.int64), ids([10, -1, LIST_ID], [13, -1, LIST_ID]),
                        lists))
    rt = ResponseTimes(["a", "b", "c"])
    rt.observe(batch, batch_ids, arrival, now=4.0)
    got = rt.totals()
    assert got["a"] == {"matches": 2, "unmeasured": 1, "mean_ms": 1750.0, "max_ms": 2000.0}
    assert got["b"] == {"matches": 2, "unmeasured": 0, "mean_ms": 2250.0, "max_ms": 3000.0}
    assert got["c"] == {"matches": 0, "unmeasured": 0, "mean_ms": None, "max_ms": None}
    assert rt.take_recent()["a"]["matches"] == 2
    assert rt.take_recent()["a"]["matches"] == 0  # a new period
    rt.observe(batch, batch_ids, arrival, now=5.0)
    assert rt.totals()["a"]["matches"] == 4 and rt.take_recent()["a"]["mean_ms"] == 2750.0


def test_arrival_times_forget_offsets_older_than_the_ring():
    times = ArrivalTimes(size=4)
    for offset in range(6):
        times.stamp(offset, 100.0 + offset)
    got = times.at(np.array([0, 1, 2, 5, 9]))
    assert np.isnan(got[[0, 1, 4]]).all() and got[2] == 102.0 and got[3] == 105.0
