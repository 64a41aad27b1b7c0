"""Response times per query: which event completed a match, and when it arrived."""
import numpy as np
import pytest

from dqcep.io.mqtt import ArrivalTimes
from dqcep.service.response import ResponseTimes, ServiceTimes
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
    none_held = {"held": 0, "held_mean_ms": None}
    assert got["a"] == {"matches": 2, "unmeasured": 1, "mean_ms": 1750.0, "max_ms": 2000.0,
                        **none_held}
    assert got["b"] == {"matches": 2, "unmeasured": 0, "mean_ms": 2250.0, "max_ms": 3000.0,
                        **none_held}
    assert got["c"] == {"matches": 0, "unmeasured": 0, "mean_ms": None, "max_ms": None,
                        **none_held}
    assert rt.take_recent()["a"]["matches"] == 2
    assert rt.take_recent()["a"]["matches"] == 0  # a new period
    rt.observe(batch, batch_ids, arrival, now=5.0)
    assert rt.totals()["a"]["matches"] == 4 and rt.take_recent()["a"]["mean_ms"] == 2750.0


def test_a_held_match_is_measured_from_the_record_that_made_it_final():
    """Spec section 7: a match held (its events in earlier batches: the reorder buffer,
    a trailing NOT) comes out because an event of this batch took G to its
    detected_at + D; it is measured from that event's arrival, and held for the event
    time G moved past detected_at by then. A tick does the same for what it makes
    final. Nothing took G far enough: unmeasured (an end of stream released it)."""
    batch_ids = np.array([21, 22, 23], np.int64)
    ts = np.array([100, 2000, 5000], np.int64)       # G before the batch: 50
    arrival = np.array([1.0, 2.0, 3.0])
    batch = MatchBatch((("a", ("x",)),))
    batch.parts.append((0, np.array([1200, 900, 9000], np.int64), ids([5], [6], [7]), None))
    rt = ResponseTimes(["a"])
    rt.observe(batch, batch_ids, arrival, now=4.0, ts=ts, before=50, tolerance=1000)
    # 1200 + 1000 first reached by ts 5000 (arrived 3.0), 900 + 1000 by 2000 (2.0)
    assert rt.totals()["a"] == {"matches": 2, "unmeasured": 1, "mean_ms": 1500.0,
                                "max_ms": 2000.0, "held": 2,
                                "held_mean_ms": ((5000 - 1200) + (2000 - 900)) / 2}
    ticked = MatchBatch((("a", ("x",)),))
    ticked.parts.append((0, np.array([9000], np.int64), ids([7]), None))
    rt.observe_finalised(ticked, 3.5, now=4.0, at=10_500)
    assert rt.totals()["a"]["matches"] == 3 and rt.totals()["a"]["held"] == 3


def test_arrival_times_forget_offsets_older_than_the_ring():
    times = ArrivalTimes(size=4)
    for offset in range(6):
        times.stamp(offset, 100.0 + offset)
    got = times.at(np.array([0, 1, 2, 5, 9]))
    assert np.isnan(got[[0, 1, 4]]).all() and got[2] == 102.0 and got[3] == 105.0


def test_service_times_per_payload_delay_and_checkpoints():
    """A step of 2 payloads in 4 ms counts 2 payloads of 2 ms (m2: 4 ms^2); the delay is
    a step's first payload's; a checkpoint is counted apart, and the delay of the step
    right after it (its wait is the checkpoint's) is left out, as after another
    consumer's checkpoint in the same worker (``checkpointed``)."""
    times = ServiceTimes(since=0.0)
    times.add(0.004, 2, 0.0005)
    times.add(0.001, 1, 0.0003)
    times.add_checkpoint(0.010)
    times.add(0.001, 1, 0.012)       # waited for the checkpoint: not a delay sample
    times.add(0.001, 1, float("nan"))  # arrival unknown
    times.checkpointed()
    times.add(0.002, 1, 0.009)
    times.add(0.001, 1, 0.0004)
    t = times.totals(now=1.0)
    assert t["payloads"] == 7 and t["mean_ms"] == pytest.approx(10 / 7, abs=1e-4)  # rounded
    assert t["m2_ms2"] == pytest.approx((2 * 4 + 1 + 1 + 1 + 4 + 1) / 7, abs=1e-6)
    assert t["delay_ms"] == pytest.approx((0.5 + 0.3 + 0.4) / 3, abs=1e-4)
    assert t["checkpoints"] == 1 and t["checkpoint_ms"] == pytest.approx(10)
    assert t["utilization"] == pytest.approx(0.010)


@pytest.mark.parametrize("first,count", [(0, 3), (2, 4), (3, 9), (5, 1), (6, 0)])
def test_a_read_stamps_its_offsets_as_stamping_each_one(first, count):
    """stamp_range (one time for the records of one read), across the ring's end and
    beyond its size, as stamp offset by offset."""
    ranged, each = ArrivalTimes(size=4), ArrivalTimes(size=4)
    ranged.stamp_range(first, count, 7.5)
    for offset in range(first, first + count):
        each.stamp(offset, 7.5)
    offsets = np.arange(0, 16)
    assert np.array_equal(ranged.at(offsets), each.at(offsets), equal_nan=True)
