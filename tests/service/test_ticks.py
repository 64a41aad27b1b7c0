"""Spec section 7 through the real broker: ticks let time pass in a silent stream (a
door left open alerts with no other message), and timelines keep a device-timed
sensor's readings next to an arrival-timed backlog."""
import json
import time

import pytest

from tests.support.service import Workers, publish_all

# Each test here starts a broker and the service: the quick run leaves them out.
pytestmark = pytest.mark.integration

W, L, D, TICK = 3000, 500, 1000, 500  # window, lateness, skew, tick (ms)
DOORS = ("QUERY left_open PATTERN SEQ(Door o, NOT Door c) WHERE o.open = true "
         f"AND c.open = false AND c.device = o.device WITHIN {W} ms")


def lines_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()] \
        if path.exists() else []


@pytest.mark.parametrize("workers", [None, 2], ids=["service", "workers"])
@pytest.mark.parametrize("kill", [False, True], ids=["running", "killed"])
def test_a_door_left_open_in_a_silent_building_alerts_once_it_is_final(
        mosquitto, tmp_path, workers, kill):
    """A door opens and nothing else comes. Its alert is final once G - D > ts + W; the
    service's ticks move G with its clock, so the alert comes out by W + D + tick + 1 s
    of wall clock after the door opened, and not before W + D. SIGKILLed during the
    silence and restarted, the service writes the same single alert."""
    host, port = mosquitto
    queries = tmp_path / "doors.cep"
    queries.write_text(DOORS)
    svc = Workers(tmp_path, f"mqtt://{host}:{port}/doors", "--lateness", str(L),
                  "--skew", str(D), "--tick", str(TICK),
                  "--client-id", f"doors-{workers}-{kill}",
                  *(["--workers", str(workers)] if workers else []), queries=queries)
    out = tmp_path / ("out.left_open.jsonl" if workers else "out.jsonl")
    svc.start()
    try:
        opened = int(time.time() * 1000)
        publish_all(host, port, "doors", [json.dumps(
            {"id": 1, "type": "Door", "ts": opened, "device": "door-3", "open": True})])
        svc.wait_for(1)
        if kill:  # during the silence, before the alert is final
            assert not lines_of(out)
            svc.proc.kill()
            svc.proc.wait()
            with open(tmp_path / "stderr.txt", "a") as log:
                log.write("--- restart ---\n")
            svc.start()
        deadline = time.monotonic() + 30
        while not lines_of(out) and time.monotonic() < deadline:
            time.sleep(0.02)
        written = time.time() * 1000
        assert lines_of(out) == [{"query": "left_open", "detected_at": opened + W,
                                  "events": {"o": 1}}], svc.stderr()
        assert written - opened >= W + D  # not before it is final
        if not kill:
            assert written - opened <= W + D + TICK + 1000, (written - opened)
        time.sleep(2 * TICK / 1000)  # more ticks: nothing more
        assert len(lines_of(out)) == 1
        assert svc.stats()["ticks"] >= 1
        # measured from the tick's arrival, held W + D or more in event time
        response = svc.stats()["response"]["left_open"]
        assert response["matches"] == 1 and response["held"] == 1, response
        assert response["held_mean_ms"] > D and response["max_ms"] < 1000 + TICK
        if not kill:  # ticks keep the watermark within D and a tick of the clock
            assert svc.stats()["watermark_lag_s"] <= (D + TICK) / 1000 + 1
    finally:
        svc.finish()
    assert len(lines_of(out)) == 1


def test_a_restart_backlog_next_to_a_device_timed_sensor_loses_none_of_its_readings(
        mosquitto, tmp_path):
    """An arrival-timed source (no ts: the journal's arrival) and a Shelly-like sensor
    with its own clock 5 s behind. With one timeline the sensor's in-order readings are
    late (5 s behind everything, counted by reason); with --timeline device and a skew
    covering the difference none is, and each pair of its rising readings matches."""
    host, port = mosquitto
    queries = tmp_path / "rise.cep"
    queries.write_text("QUERY rise PATTERN SEQ(T a, T b) WHERE b.device = a.device "
                       "AND b.v > a.v WITHIN 60 s RETURN a.device")
    maps = tmp_path / "map.toml"
    maps.write_text('[[topic]]\nfilter = "ha/+"\nlevels = "_/device"\ntype = "T"\n\n'
                    '[[topic]]\nfilter = "shelly/+"\nlevels = "_/device"\ntype = "T"\n'
                    'ts = "ts"\n')
    for args, late in ((["--lateness", "500"], 10),
                       (["--lateness", "500", "--skew", "20000", "--timeline", "device"], 0)):
        run = tmp_path / f"late{late}"
        run.mkdir()
        svc = Workers(run, f"mqtt://{host}:{port}/ha/+", "--input",
                      f"mqtt://{host}:{port}/shelly/+", "--map", str(maps), "--tick", "0",
                      "--returns", "--client-id", f"backlog-{late}", *args, queries=queries)
        svc.start()
        try:
            publish_all(host, port, "ha/hall", [json.dumps({"v": i}) for i in range(50)])
            svc.wait_for(50)
            now = int(time.time() * 1000)
            publish_all(host, port, "shelly/kitchen", [json.dumps(
                {"v": i, "ts": now - 5000 + 100 * i}) for i in range(10)])
            svc.wait_for(60)
            svc.finish()
        finally:
            if svc.proc.poll() is None:
                svc.proc.kill()
        late_lines = lines_of(run / "state" / "late.jsonl")
        assert len(late_lines) == late, svc.stderr()
        assert all(e["reason"] == "lateness" for e in late_lines)
        assert svc.stats()["late"] == late
        # every pair of the sensor's rising readings, none lost
        kitchen = [m for m in lines_of(run / "out.jsonl")
                   if m["return"]["a.device"] == "kitchen"]
        assert len(kitchen) == (45 if not late else 0)
