"""Query texts and streams more than one test module runs: section 5 of the spec
(Kleene items, strategies), a query that runs away on a rising stream (the budget), and
the door stream of examples/iot-kleene.cep with its one match, events a declared
schema refuses."""
import json

SECTION5 = """
QUERY rising PATTERN SEQ(Temperature+ t[], Smoke s)
WHERE [room] AND t[i].value > t[i-1].value AND count(t) >= 2 WITHIN 3 s
RETURN t, max(t.value);
QUERY forced_door PATTERN SEQ(Door+ f[], Door o)
WHERE [room] AND f.open = false AND o.open = true WITHIN 2 min USING skip-till-next-match;
QUERY smoke_after_door PATTERN SEQ(Door d, NOT Motion m, Smoke s)
WHERE [room] WITHIN 20 s USING skip-till-next-match;
QUERY next_unkeyed PATTERN SEQ(Motion m, Door+ d[]) WITHIN 4 s USING skip-till-next-match;
QUERY strict PATTERN SEQ(Temperature a, Humidity+ b[]) WHERE [room] WITHIN 2 s
USING strict-contiguity;
QUERY by_room PATTERN SEQ(Motion m, Light l) WHERE [room] WITHIN 10 s
USING partition-contiguity;
-- sliced, section 4: the streaming job's parts once dropped an event that came a
-- micro-batch after a later one of its part, within the lateness (motion 1127)
QUERY unkeyed_any PATTERN SEQ(Motion m, Door d) WITHIN 4 s
"""


# Kleene lists that double with each rising reading: what the state budget stops
RUNAWAY_QUERIES = """
QUERY rising PATTERN SEQ(Temperature+ t[], Smoke s) WHERE [room] WITHIN 10 min;
QUERY hot PATTERN SEQ(Temperature t, Smoke s) WHERE [room] AND t.value > 50 WITHIN 10 min;
QUERY dry PATTERN SEQ(Temperature t, NOT Humidity h) WHERE [room] WITHIN 5 s;
"""


def runaway_events(rooms=("r1", "r2"), n=27) -> list[dict]:
    """Rising temperatures in each room, then smoke: "rising"'s lists double with each."""
    out, i = [], 0
    for k, room in enumerate(rooms):
        for j in range(n):
            i += 1
            out.append({"id": i, "type": "Temperature", "ts": 1000 * j + k, "room": room,
                        "value": 40.0 + j})
        i += 1
        out.append({"id": i, "type": "Smoke", "ts": 1000 * n + k, "room": room,
                    "density": 5.0})
    out.sort(key=lambda e: (e["ts"], e["id"]))
    return out


# examples/iot-kleene.cep's forced_door on three closed readings, then an open one: one
# match, on every engine (tests/cli/test_cli.py) and on the Spark batch job (tests/spark/test_spark.py)
FORCED_DOOR_EVENTS = "".join(
    f'{{"id": {i}, "type": "Door", "ts": {i * 1000}, "room": "r1", "open": {o}}}\n'
    for i, o in enumerate(["false", "false", "false", "true"], 1))
FORCED_DOOR_MATCHES = [
    '{"query": "forced_door", "detected_at": 4000, "events": {"f": [1, 2, 3], "o": 4}}']


# EVENT A(x INT): events 2 and 3 are bad events (x with a fraction, s a boolean); the
# one match is A 1 then B 5 (tests/cli/test_cli.py on dqcep run's engines, tests/spark/test_spark.py
# on the batch job)
MISDECLARED_QUERY = "EVENT A(x INT, s STRING);\nPATTERN SEQ(A a, B b) WHERE a.x < b.y WITHIN 10"
MISDECLARED_EVENTS = "".join(json.dumps(e) + "\n" for e in [
    {"id": 1, "type": "A", "ts": 0, "x": 1}, {"id": 2, "type": "A", "ts": 1, "x": 1.5},
    {"id": 3, "type": "A", "ts": 2, "x": 2.0, "s": True}, {"id": 4, "type": "A", "ts": 3},
    {"id": 5, "type": "B", "ts": 5, "y": 3}])
