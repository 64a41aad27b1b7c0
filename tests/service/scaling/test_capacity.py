"""The response-time model (dqcep.service.scaling.model): the Pollaczek-Khinchine formula on cases
computed by hand, and the placement against the optimum found by trying every
partition of a few queries."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqcep.service.scaling.model import (Calibration, QueryCost, WorkerModel, deviation, from_moments,
                            in_turn_order, load, place, response_times)
from tests.support.examples import examples


def test_one_query_is_the_m_g_1_formula():
    """Exponential processing (m2 = 2 b^2) at 50% load: W = b / (1 - rho) = 2 b."""
    c = QueryCost("q", b=0.002, m2=2 * 0.002 ** 2)
    assert response_times([c], {"q": 250})["q"] == pytest.approx(0.004)
    # deterministic processing (m2 = b^2) waits half as long: W = b + b rho / (2 (1 - rho))
    d = QueryCost("q", b=0.002, m2=0.002 ** 2)
    assert response_times([d], {"q": 250})["q"] == pytest.approx(0.003)


def test_two_classes_share_one_wait():
    """100/s of 2 ms (m2 8e-6) and 50/s of 4 ms (m2 3.2e-5): rho 0.4, Wq = (8e-4 +
    1.6e-3) / 1.2 = 2 ms; W = 4 ms and 6 ms."""
    costs = [QueryCost("a", 0.002, 8e-6), QueryCost("b", 0.004, 3.2e-5)]
    rates = {"a": 100, "b": 50}
    assert load(costs, rates) == pytest.approx(0.4)
    assert response_times(costs, rates) == pytest.approx({"a": 0.004, "b": 0.006})
    assert deviation(0.006, 0.005) == pytest.approx(0.2)


def test_a_saturated_worker_never_answers():
    c = QueryCost("q", 0.01, 1e-4)
    assert response_times([c], {"q": 100}) == {"q": math.inf}
    with pytest.raises(ValueError, match="m2 >= b"):
        QueryCost("x", 0.01, 1e-5)


def test_queries_of_one_stream_are_one_class_with_the_workers_own_work():
    """Two queries read one stream of 100 payloads/s: each payload costs the worker's
    own work (1 ms, m2 1e-6) and both queries' (2 ms, m2 9e-6; 3 ms, m2 1.6e-5) before
    its matches go out: E[S] = 6 ms, E[S^2] = (1 + 3 + 4)^2 ms^2 = 6.4e-5 s^2 (the
    parts grow together), rho = 0.6, Wq = 100 * 6.4e-5 / 0.8 = 8 ms; with a 0.5 ms
    delay before processing every query answers in 0.5 + 6 + 8 = 14.5 ms."""
    model = WorkerModel(QueryCost("overhead", 0.001, 1e-6), 0.0005, {"a": "s", "b": "s"})
    costs = [QueryCost("a", 0.002, 9e-6), QueryCost("b", 0.003, 1.6e-5)]
    rates = {"a": 100, "b": 100}
    assert load(costs, rates, model) == pytest.approx(0.6)
    assert response_times(costs, rates, model) == pytest.approx({"a": 0.0145, "b": 0.0145})
    # each on a stream of its own (the paper's classes): the own work twice, each
    # query out after its own payload: rho 0.7, Wq = 100 (1.6e-5 + 2.5e-5) / 0.6
    apart = WorkerModel(model.overhead, 0.0005, {})
    wait = 100 * (1.6e-5 + 2.5e-5) / 0.6
    assert response_times(costs, rates, apart) == pytest.approx(
        {"a": 0.0005 + 0.003 + wait, "b": 0.0005 + 0.004 + wait})
    with pytest.raises(ValueError, match="need one rate"):
        response_times(costs, {"a": 100, "b": 50}, model)
    # checkpoints of 20 ms (m2 5e-4) every 0.5 s: a class of 2/s, rho 0.64,
    # Wq = (6.4e-3 + 1e-3) / 0.72
    checkpointing = WorkerModel(model.overhead, 0.0005, model.stream_of,
                                QueryCost("checkpoint", 0.02, 5e-4), 0.5)
    assert load(costs, rates, checkpointing) == pytest.approx(0.64)
    assert response_times(costs, rates, checkpointing)["a"] == pytest.approx(
        0.0065 + 7.4e-3 / 0.72)


def test_consumers_in_turn_answer_one_after_the_other():
    """A worker of two journal consumers of one stream (dqcep run --workers): the same
    class as above without the own work (it is in each consumer's cost), E[S] = 5 ms,
    E[S^2] = (3 + 4)^2 ms^2, rho 0.5, Wq = 100 * 4.9e-5 / 1 = 4.9 ms; the first
    consumer answers after its own 2 ms, the second after 2 + 3 ms."""
    model = WorkerModel(None, 0.0005, {"a": "s", "b": "s"}, in_turn=True)
    costs = [QueryCost("a", 0.002, 9e-6), QueryCost("b", 0.003, 1.6e-5)]
    rates = {"a": 100, "b": 100}
    assert load(costs, rates, model) == pytest.approx(0.5)
    assert response_times(costs, rates, model) == pytest.approx(
        {"a": 0.0005 + 0.002 + 0.0049, "b": 0.0005 + 0.005 + 0.0049})
    assert response_times(costs[::-1], rates, model) == pytest.approx(
        {"b": 0.0005 + 0.003 + 0.0049, "a": 0.0005 + 0.005 + 0.0049})
    # the tightest target first, then the cheapest; one plan keeps the order given
    assert [c.name for c in in_turn_order(costs, {"a": 0.01, "b": 0.008}, model)] == \
        ["b", "a"]
    assert [c.name for c in in_turn_order(costs, {"a": 0.01, "b": 0.01}, model)] == \
        ["a", "b"]
    assert in_turn_order(costs[::-1], {"a": 0.01, "b": 0.008}, WorkerModel()) == costs[::-1]


def test_placement_orders_a_workers_consumers_by_target():
    """b's 8.5 ms target holds only if b goes first (3.5 + 4.9 = 8.4 ms; second: 10.4
    ms); a's 12 ms holds either way. On one worker the placement puts b first and
    meets both; the same two as one plan (all answer after 5 ms of work) miss b's."""
    model = WorkerModel(None, 0.0005, {"a": "s", "b": "s"}, in_turn=True)
    costs = [QueryCost("a", 0.002, 9e-6), QueryCost("b", 0.003, 1.6e-5)]
    rates, targets = {"a": 100, "b": 100}, {"a": 0.012, "b": 0.0085}
    p = place(costs, rates, targets, rho_max=0.6, model=model)
    assert p.met and len(p.workers) == 1
    assert [c.name for c in p.workers[0].queries] == ["b", "a"]
    assert p.workers[0].response == pytest.approx({"b": 0.0084, "a": 0.0104})
    plan = WorkerModel(None, 0.0005, {"a": "s", "b": "s"})
    assert len(place(costs, rates, targets, rho_max=0.6, model=plan).workers) == 2


def test_a_cheaper_shared_plan_predicts_no_worse_than_separate_queries():
    """calibrate's charge rule (from_moments): three queries alone take 1.1 ms per
    payload each, the shared plan 1.6 ms, the worker's own work 0.1 ms of either: each
    query is charged (1.1 - 0.1) * (1.6 - 0.1) / 3 = 0.5 ms, the charges and the own
    work add up to the shared plan, and every query's predicted response time is lower
    than with the costs alone."""
    run = (0.0011, 0.0011 ** 2 * 1.5)
    cal = from_moments(200, 50, {q: run for q in "abc"}, (0.0016, 0.0016 ** 2 * 1.5),
                       (0.0001, 0.0001 ** 2), 0.0004)
    assert {q: c.b for q, c in cal.alone.items()} == pytest.approx({q: 0.001 for q in "abc"})
    assert {q: c.b for q, c in cal.shared.items()} == pytest.approx({q: 0.0005 for q in "abc"})
    assert sum(c.b for c in cal.shared.values()) + cal.overhead.b == \
        pytest.approx(cal.shared_b)
    # m2 less a constant overhead: 1.815e-6 - 2 * 1e-4 * 1.1e-3 + 1e-8 = 1.605e-6
    assert cal.alone["a"].m2 == pytest.approx(1.605e-6)
    assert cal.shared["a"].m2 == pytest.approx(1.605e-6 * 0.25)
    model = cal.model({q: "the stream" for q in "abc"})
    rates = {q: 300 for q in "abc"}
    together = response_times(list(cal.costs(shared=True).values()), rates, model)
    separate = response_times(list(cal.costs(shared=False).values()), rates, model)
    assert all(together[q] < separate[q] for q in "abc")


def test_costs_at_a_rate_are_interpolated_between_load_points():
    """Measured one payload at a time (rate 0) a query alone takes 1.1 ms per payload
    with the own work (0.1 ms), at 400 payloads/s 0.7 ms, at 800/s 0.5 ms (steps take
    the waiting payloads together); the shared plan 1.6, 1.0, 0.7 ms. At 200/s the cost
    alone is halfway, (1.0 + 0.6) / 2 = 0.8 ms; at 600/s 0.5 ms; above 800/s the last
    point's 0.4 ms; charged from the shared plan by the same rule at every point. The
    points go through JSON; a calibration of format 2 (none) keeps one cost."""
    def run(b):
        return (b, b * b * 1.5)
    points = [(800.0, {"a": run(0.0005)}, run(0.0007)),
              (400.0, {"a": run(0.0007)}, run(0.0010))]
    cal = from_moments(200, 50, {"a": run(0.0011)}, run(0.0016), (0.0001, 1e-8), 0.0004,
                       points=points)
    assert [p.rate for p in cal.points] == [400.0, 800.0]
    assert cal.costs(False, {"a": 200})["a"].b == pytest.approx(0.0008)
    assert cal.costs(False, {"a": 600})["a"].b == pytest.approx(0.0005)
    assert cal.costs(False, {"a": 5000})["a"].b == pytest.approx(0.0004)
    assert cal.costs(False)["a"].b == cal.costs(False, {"a": 0})["a"].b == \
        pytest.approx(0.001)
    # one query: the shared plan less the own work is all its charge
    assert cal.costs(True, {"a": 400})["a"].b == pytest.approx(0.0009)
    assert cal.consumer_costs(600)["a"].b == pytest.approx(0.0006)
    m2 = cal.costs(False, {"a": 600})["a"].m2
    assert m2 >= 0.0005 ** 2 and m2 == pytest.approx(
        (cal.points[0].alone["a"].m2 + cal.points[1].alone["a"].m2) / 2)
    again = Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    assert again.points == cal.points
    old = cal.to_json()
    old["version"] = 2
    del old["points"]
    assert Calibration.from_json(old).costs(False, {"a": 600}) == cal.costs(False)


def fewest_workers(costs, rates, targets, hw, rho_max) -> int:
    """The optimum: the smallest partition of the queries whose every part is viable."""
    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for p in partitions(rest):
            yield [[first]] + p
            for i in range(len(p)):
                yield p[:i] + [[first] + p[i]] + p[i + 1:]

    def viable(part):
        response = response_times(part, rates)
        return load(part, rates) <= rho_max and all(
            deviation(response[c.name], targets[c.name]) <= hw for c in part)
    return min(len(p) for p in partitions(list(costs)) if all(map(viable, p)))


@pytest.mark.parametrize("loads, rho_max, optimum", [
    ([0.3, 0.3, 0.3, 0.3], 0.7, 2),
    ([0.5, 0.4, 0.3, 0.2, 0.1], 0.8, 2),
    ([0.6, 0.5, 0.4, 0.3, 0.2], 0.8, 3),
    ([0.2] * 6, 0.65, 2),
])
def test_placement_finds_the_fewest_workers_on_known_cases(loads, rho_max, optimum):
    """Targets loose enough that the load threshold decides: the optimum is the
    classic bin packing's."""
    costs = [QueryCost(f"q{i}", 0.001, 2e-6) for i in range(len(loads))]
    rates = {c.name: rho / c.b for c, rho in zip(costs, loads)}
    targets = {c.name: 1.0 for c in costs}
    p = place(costs, rates, targets, rho_max=rho_max)
    assert p.met and len(p.workers) == optimum
    assert fewest_workers(costs, rates, targets, 0.0, rho_max) == optimum
    assert all(w.load <= rho_max for w in p.workers)


def test_a_tight_target_keeps_a_query_apart():
    """A 1.2 ms target for a 1 ms query: alone it answers in 1.11 ms, beside a (rho 0.4)
    in 1.67 ms; so it gets a worker of its own, a and b share one."""
    costs = [QueryCost("tight", 0.001, 2e-6), QueryCost("a", 0.001, 2e-6),
             QueryCost("b", 0.001, 2e-6)]
    rates = {"tight": 100, "a": 300, "b": 300}
    targets = {"tight": 0.0012, "a": 1.0, "b": 1.0}
    p = place(costs, rates, targets)
    assert p.met and len(p.workers) == 2 == fewest_workers(costs, rates, targets, 0.0, 0.8)
    assert p.worker_of("a") == p.worker_of("b") != p.worker_of("tight")
    assert p.workers[p.worker_of("tight")].response["tight"] == pytest.approx(0.001 + 1 / 9000)
    one = place(costs, rates, targets, workers=1)   # all on one: the tight target fails
    assert not one.met and len(one.workers) == 1


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.floats(0.0005, 0.005), st.floats(1, 3), st.floats(10, 300),
                          st.floats(0.002, 0.05)), min_size=1, max_size=6))
def test_placement_is_viable_and_near_the_optimum(specs):
    """Whatever the queries: every worker meets the conditions, and first-fit
    decreasing uses at most the optimum's workers * 11/9 + 1 (its bound for classic
    bin packing; the response-time condition is not additive, so here it is checked,
    not proven)."""
    costs = [QueryCost(f"q{i}", b, k * b * b) for i, (b, k, _, _) in enumerate(specs)]
    rates = {c.name: r for c, (_, _, r, _) in zip(costs, specs)}
    targets = {c.name: t for c, (_, _, _, t) in zip(costs, specs)}
    alone = [response_times([c], rates)[c.name] for c in costs]
    if any(load([c], rates) > 0.8 or deviation(w, targets[c.name]) > 0 for c, w in
           zip(costs, alone)):
        return  # no placement can meet this query's target
    p = place(costs, rates, targets)
    assert p.met
    optimum = fewest_workers(costs, rates, targets, 0.0, 0.8)
    assert optimum <= len(p.workers) <= optimum * 11 / 9 + 1
    assert sorted(c.name for w in p.workers for c in w.queries) == sorted(rates)


# ------------------------------------------------------------------ the commands

SHARING = """QUERY a PATTERN SEQ(Temperature t, Smoke s, Door d) WHERE [room] WITHIN 30 s;
QUERY b PATTERN SEQ(Temperature t, Smoke s, Motion m) WHERE [room] WITHIN 30 s;
QUERY c PATTERN SEQ(Temperature t, Smoke s) WHERE [room] AND t.value > 30 WITHIN 30 s
"""


def dqcep(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dqcep", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def check_calibration(cal, names, payloads):
    assert set(cal.alone) == set(cal.shared) == set(names) and cal.batch_events == 200
    assert cal.payloads == payloads and cal.delay >= 0 and cal.overhead.b > 0
    assert cal.checkpoint.b > 0 and cal.checkpoint_every == 1.0
    # the charges and the worker's own work add up to the shared plan
    assert sum(c.b for c in cal.shared.values()) + cal.overhead.b == \
        pytest.approx(cal.shared_b)


@pytest.mark.integration
def test_calibrate_then_capacity(tmp_path):
    """dqcep calibrate (in this process, no broker) writes every query's b and m2 per
    payload, alone and charged from the shared plan (three queries sharing
    SEQ(Temperature, Smoke) by room), the worker's own work and the delay; dqcep
    capacity places them and predicts from it, as text and JSON. (Whether the shared
    plan is cheaper is a measurement, not asserted here: docs/capacity.md.)"""
    queries = tmp_path / "shared.cep"
    queries.write_text(SHARING)
    assert dqcep("generate", "-n", 20_000, "--seed", 3, "--quiet", "-o", "iot.jsonl",
                 cwd=tmp_path).returncode == 0
    r = dqcep("calibrate", queries, "--input", "iot.jsonl", "--gap", 0.5, "-o", "cal.json",
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:3] == ["per", "payload", "(ms)"]
    cal = Calibration.from_json(json.loads((tmp_path / "cal.json").read_text()))
    check_calibration(cal, "abc", 100)
    assert cal.delay > 0  # offline: the commit timed on the MQTT source's committer
    # a rate the calibration puts at a fifth of one worker (a loaded machine measures
    # higher costs: a fixed rate saturated a worker there)
    rate = round(0.2 / sum(c.b for c in cal.shared.values()) * 200)
    args = ("capacity", queries, "--calibration", "cal.json", "--rate", str(rate),
            "--target", "*=100", "--target", "a=50")
    # whether the targets hold is the measurement's (a loaded machine measures more):
    # what is asserted is that the text, the JSON and the exit code say the same
    r = dqcep(*args, cwd=tmp_path)
    report = json.loads(dqcep(*args, "--json", cwd=tmp_path).stdout)
    assert r.returncode == (0 if report["met"] else 1), r.stdout + r.stderr
    assert ("NOT every target met" in r.stdout) == (not report["met"]), r.stdout
    assert bool(report["missed"]) == (not report["met"])
    placed = {q["name"]: q for w in report["workers"] for q in w["queries"]}
    assert set(placed) == {"a", "b", "c"} and placed["a"]["target_ms"] == 50
    model = cal.model({q: "the stream" for q in "abc"})
    rates = {q: rate / 200 for q in "abc"}  # payloads/s
    for w in report["workers"]:  # what it prints is the model's, worker by worker
        hosted = [cal.shared[q["name"]] for q in w["queries"]]
        predicted = response_times(hosted, rates, model)
        assert w["load"] == pytest.approx(load(hosted, rates, model))
        assert all(q["predicted_ms"] == pytest.approx(predicted[q["name"]] * 1000)
                   and q["stream"] == "the stream" for q in w["queries"])
    r = dqcep(*args, "--workers", "2", "--json", cwd=tmp_path)
    assert len(json.loads(r.stdout)["workers"]) == 2
    # a saturated worker: its queries never answer (JSON has no inf: null)
    r = dqcep(*args[:4], "--rate", "1e9", *args[6:], "--workers", "1", "--json",
              cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # targets missed
    [w] = json.loads(r.stdout)["workers"]
    assert w["saturated"] and all(q["predicted_ms"] is None and q["deviation"] is None
                                  for q in w["queries"])
    assert "predicted inf ms" in dqcep(*args[:4], "--rate", "1e9", *args[6:], "--workers",
                                       "1", cwd=tmp_path).stdout
    # --consumers: as dqcep run --workers runs them, a consumer per query in turn,
    # listed in the order served (the tightest target, a's, first)
    r = dqcep(*args[:4], "--rate", "2000", *args[6:], "--workers", "1", "--consumers",
              "--json", cwd=tmp_path)
    [w] = json.loads(r.stdout)["workers"]
    assert [q["name"] for q in w["queries"]][0] == "a"
    consumers, model = cal.consumer_costs(), cal.consumer_model("abc")
    rates = {q: 2000 / 200 for q in "abc"}
    served = [consumers[q["name"]] for q in w["queries"]]
    predicted = response_times(served, rates, model)
    assert all(q["predicted_ms"] == pytest.approx(predicted[q["name"]] * 1000)
               and q["b_ms"] == pytest.approx(consumers[q["name"]].b * 1000)
               for q in w["queries"])
    assert predicted[served[0].name] < predicted[served[1].name] < predicted[served[2].name]
    # a query on a stream of its own is a class of its own
    r = dqcep(*args, "--rate", "a=5000", "--json", cwd=tmp_path)
    placed = {q["name"]: q for w in json.loads(r.stdout)["workers"] for q in w["queries"]}
    assert placed["a"]["stream"] == "its own" and placed["a"]["rate"] == 5000


def test_live_calibration_against_a_broker(mosquitto, tmp_path):
    """dqcep calibrate --broker --workers 2: the queries alone as a real dqcep run
    --workers 2 process, the shared plan as a dqcep run --queries ... process, fed over
    MQTT, their own measurements read from their stats, each run twice (--repeat 2,
    the median kept); with --loads 0.5 both again at half the shared plan's capacity."""
    host, port = mosquitto
    queries = tmp_path / "shared.cep"
    queries.write_text(SHARING)
    assert dqcep("generate", "-n", 4_000, "--seed", 3, "--quiet", "-o", "iot.jsonl",
                 cwd=tmp_path).returncode == 0
    r = dqcep("calibrate", queries, "--input", "iot.jsonl", "--broker",
              f"mqtt://{host}:{port}/calibration", "--workers", 2, "--loads", "0.5",
              "--repeat", 2, "-o", "cal.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cal = Calibration.from_json(json.loads((tmp_path / "cal.json").read_text()))
    check_calibration(cal, "abc", 20)
    # measured again with Poisson arrivals at half the shared plan's capacity
    [point] = cal.points
    assert point.rate == pytest.approx(0.5 / cal.shared_b)
    assert set(point.alone) == set(point.shared) == set("abc") and point.shared_b > 0
    assert f"at {point.rate * 200:,.0f} events/s: shared plan" in r.stdout
    # every service run said as it starts (93 s were silent): (1 + 1) x 2 repeats x 2 rates
    assert r.stderr.count("dqcep calibrate: run ") == 8, r.stderr
    for extra, message in ((("--workers", 2), "is for the live calibration, with --broker"),
                           (("--loads", "0.5"), "--loads is for the live calibration"),
                           (("--broker", "mqtt://h:1/t", "--loads", "x"),
                            "--loads x: give shares such as 0.4,0.8"),
                           (("--broker", "mqtt://h:1/t", "--loads", "0.5,2"),
                            "each share must be above 0 and below 1.5"),
                           (("--repeat", "2"), "--repeat N (>= 1) is for the live"),
                           (("--broker", "mqtt://h:1/t", "--repeat", "0"),
                            "--repeat N (>= 1) is for the live")):
        r = dqcep("calibrate", queries, "--input", "iot.jsonl", *extra, cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.parametrize("extra, message", [
    (("--rate", "a=10"), "give the stream's arrival rate in events/s (--rate N), or each "
                         "query's: --rate b=N"),
    (("--rate", "10", "--rate", "zz=3"), "--rate zz=3: no query 'zz'"),
    (("--rate", "10", "--rate", "*=3"), "--rate N (the stream every query reads) was given "
                                        "twice"),
    (("--rate", "ten"), "give QUERY=NUMBER"),
    (("--rate", "*=10", "--workers", "0"), "--workers must be >= 1"),
    (("--rate", "10", "--consumers", "--separate"), "--consumers is how dqcep run "
                                                    "--workers runs the queries"),
    (("--rate", "10", "--rate", "a=5", "--consumers"), "with --consumers every query "
                                                       "reads the one journal"),
])
@pytest.mark.integration
def test_capacity_options_are_checked(tmp_path, extra, message):
    queries = tmp_path / "q.cep"
    queries.write_text("QUERY a PATTERN A x WITHIN 1 s; QUERY b PATTERN B y WITHIN 1 s")
    (tmp_path / "cal.json").write_text(json.dumps(Calibration(
        200, 1000, {q: QueryCost(q, 1e-6, 2e-12) for q in "ab"},
        {q: QueryCost(q, 1e-6, 2e-12) for q in "ab"}, 2e-6, QueryCost("overhead", 0, 0),
        1e-4, QueryCost("checkpoint", 0.01, 1e-4), 1.0, 1e-4).to_json()))
    r = dqcep("capacity", queries, "--calibration", "cal.json", *extra, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    (tmp_path / "bad.json").write_text('{"version": 2}')
    r = dqcep("capacity", queries, "--calibration", "bad.json", "--rate", "*=1", cwd=tmp_path)
    assert r.returncode == 2 and "not a calibration written by dqcep calibrate" in r.stderr


@pytest.mark.integration
def test_capacity_says_which_target_is_missed_and_why(tmp_path):
    """Hand-made calibration: a query costs 1 ms per payload of 200 events, the delay is
    2 ms, no own work or checkpoints. A 2.5 ms target is missed whatever the placement
    (alone on an idle worker: 2 + 1 = 3 ms); a 10 ms target is met alone, but two queries
    on one worker at 600 payloads/s (load 1.2) saturate it. Exit 1 and a line per
    missed target; met: exit 0 and no such line."""
    queries = tmp_path / "q.cep"
    queries.write_text("QUERY a PATTERN A x WITHIN 1 s; QUERY b PATTERN B y WITHIN 1 s")
    cost = {q: QueryCost(q, 1e-3, 1e-6) for q in "ab"}
    (tmp_path / "cal.json").write_text(json.dumps(Calibration(
        200, 1000, cost, cost, 2e-3, QueryCost("overhead", 0, 0), 2e-3,
        QueryCost("checkpoint", 0, 0), 1.0, 2e-3).to_json()))
    base = ("capacity", queries, "--calibration", "cal.json")
    r = dqcep(*base, "--rate", "20000", "--target", "a=2.5", "--target", "b=10", cwd=tmp_path)
    assert r.returncode == 1 and "NOT every target met" in r.stdout, r.stdout + r.stderr
    assert ("missed: a: predicted 3.0" in r.stdout and "alone on an idle worker it answers "
            "in 3.000 ms (the calibrated delay 2.000 ms and its processing 1.000 ms)"
            in r.stdout), r.stdout
    assert "missed: b" not in r.stdout
    r = dqcep(*base, "--rate", "120000", "--target", "*=10", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 1 and "missed: worker 1 is saturated (load 1.200 >= 1)" in \
        r.stdout, r.stdout
    r = dqcep(*base, "--rate", "1000", "--target", "*=10", "--workers", "1", "--json",
              cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["missed"] == [], r.stdout
    r = dqcep(*base, "--rate", "1000", "--target", "*=10", cwd=tmp_path)
    assert r.returncode == 0 and "every target met" in r.stdout and "NOT" not in r.stdout


@pytest.mark.integration
def test_spark_dynamic_allocation_bounds(tmp_path):
    """--spark: the shared plan costs 1.5 ms per payload of 200 events (deterministic:
    m2 = b^2), no own work, delay or checkpoints. At 10^6 events/s (5000 payloads/s)
    k executors each take 5000/k payloads/s: the load 7.5/k is under 0.8 from k = 10,
    where W = 1.5 + 500 * 2.25e-6 / 0.5 s = 3.75 ms; a 3 ms target needs k = 12 (2.75 ms;
    k = 11 gives 3.11 ms). At 10^5 events/s one executor answers in 3.75 ms, two in
    1.95 ms."""
    queries = tmp_path / "q.cep"
    queries.write_text("QUERY a PATTERN A x WITHIN 1 s; QUERY b PATTERN B y WITHIN 1 s")
    shared = {"a": QueryCost("a", 0.0005, 0.0005 ** 2), "b": QueryCost("b", 0.001, 0.001 ** 2)}
    (tmp_path / "cal.json").write_text(json.dumps(Calibration(
        200, 100, shared, shared, 0.0015, QueryCost("overhead", 0, 0), 0.0,
        QueryCost("checkpoint", 0, 0), 1.0, 0.0).to_json()))

    def bounds(*extra):
        r = dqcep("capacity", queries, "--calibration", "cal.json", "--spark", "--json",
                  *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        conf = json.loads(r.stdout)["conf"]
        return (int(conf["spark.dynamicAllocation.minExecutors"]),
                int(conf["spark.dynamicAllocation.maxExecutors"]))
    assert bounds("--rate", "1000000", "--target", "*=4", "--rate-low", "100000") == (1, 10)
    assert bounds("--rate", "1000000", "--target", "*=3", "--target", "a=5",
                  "--rate-low", "100000") == (2, 12)
    r = dqcep("capacity", queries, "--calibration", "cal.json", "--spark", "--rate",
              "1000000", "--target", "*=3", cwd=tmp_path)
    assert "spark.dynamicAllocation.maxExecutors=12" in r.stdout
    for extra, message in ((("--rate", "a=10", "--rate", "b=10", "--target", "*=3"),
                            "give --rate N"),
                           (("--rate", "10"), "needs a response-time target"),
                           (("--rate", "1000000", "--target", "*=1"),
                            "no number of executors meets 1 ms")):
        r = dqcep("capacity", queries, "--calibration", "cal.json", "--spark", *extra,
                  cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr, r.stderr
