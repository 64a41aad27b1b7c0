"""``dqcep capacity``: response times predicted, queries placed on workers, Spark's
executor bounds."""
from __future__ import annotations

from dqcep.cli.common import MAX_WORKERS, check_water_marks, load_queries, named_values
from dqcep.core.errors import UserError
from dqcep.core.limits import ANY, POSITIVE, SHARE
from dqcep.service.scaling.model import Calibration


def add_parser(sub) -> None:
    """``dqcep capacity``."""
    cap = sub.add_parser(
        "capacity", help="predict response times and place queries on workers",
        description="From a calibration (dqcep calibrate), the stream's arrival rate (or "
        "each query's) and the response-time targets: the payloads each worker reads as a "
        "multi-class M/G/1 queue (Pollaczek-Khinchine), its queries placed by first-fit "
        "decreasing on the fewest workers that keep every query's deviation (W - T) / T <= --hw and every worker's load <= "
        "--rho-max, or on --workers N; prints each worker's queries, load and predicted "
        "mean response times (docs/capacity.md).")
    cap.add_argument("queries", metavar="QUERIES.cep", help="query file")
    cap.add_argument("--calibration", required=True, metavar="FILE",
                     help="written by dqcep calibrate")
    cap.add_argument("--rate", action="append", metavar="[QUERY=]EVENTS_PER_S",
                     help="events/s of the stream every query reads (N or *=N); QUERY=N: "
                     "that query reads a stream of its own at N")
    cap.add_argument("--target", action="append", metavar="QUERY=MS",
                     help="a query's mean response-time target (*=MS for every query)")
    cap.add_argument("--workers", type=int, metavar="N",
                     help="place on N workers (default: the fewest that meet every target)")
    cap.add_argument("--separate", action="store_true",
                     help="cost each query as if alone (default: charged from the shared plan)")
    cap.add_argument("--consumers", action="store_true",
                     help="as dqcep run --workers / --target runs the queries: a journal "
                     "consumer per query, a worker's consumers served in turn, the tightest "
                     "target first (default: each worker runs its queries as one plan)")
    cap.add_argument("--lw", type=ANY.option, default=-0.5, help="low water-mark (default -0.5)")
    cap.add_argument("--hw", type=ANY.option, default=0.0, help="high water-mark (default 0)")
    cap.add_argument("--rho-max", type=SHARE.option, default=0.8,
                     help="load threshold per worker (default 0.8)")
    cap.add_argument("--spark", action="store_true",
                     help="print spark.dynamicAllocation's bounds instead: executors of one "
                     "core for the tightest --target, --rate the peak, the stream divided "
                     "evenly among them (docs/capacity.md)")
    cap.add_argument("--rate-low", type=POSITIVE.option, metavar="EVENTS_PER_S",
                     help="with --spark: the lowest rate, for minExecutors (default: 1)")
    cap.add_argument("--json", action="store_true", help="print JSON instead of text")
    cap.set_defaults(func=command)


def command(args) -> int:
    import json
    import math

    from dqcep.service.scaling.model import deviation, place

    check_water_marks(args)
    query_file = load_queries(args.queries)
    names = [q.name for q in query_file.queries]
    calibration = Calibration.load(args.calibration)
    if args.consumers and (args.separate or args.spark):
        raise UserError("--consumers is how dqcep run --workers runs the queries; it "
                        "takes neither --separate nor --spark")
    missing = [n for n in names if n not in calibration.alone]
    if missing:
        raise UserError(f"{args.calibration} has no calibration of {', '.join(missing)} "
                        f"(run dqcep calibrate {args.queries} ...)")
    # --rate N (or *=N): the one stream the service reads, for every query without a
    # rate of its own; --rate Q=N: Q reads a stream of its own
    items = [("*=" + r if "=" not in r else r) for r in args.rate or []]
    common = [r for r in items if r.startswith("*=")]
    if len(common) > 1:
        raise UserError("--rate N (the stream every query reads) was given twice")
    stream = named_values(common, "rate", names)
    own = named_values([r for r in items if not r.startswith("*=")], "rate", names)
    rates = {**stream, **own}
    if set(rates) != set(names):
        raise UserError("give the stream's arrival rate in events/s (--rate N), or each "
                        "query's: --rate " + " ".join(f"{n}=N" for n in names
                                                     if n not in rates))
    if args.consumers and own:
        raise UserError("with --consumers every query reads the one journal: give the "
                        "stream's rate (--rate N), not a query's own")
    stream_of = {n: "the stream" for n in names if n not in own}
    targets = {q: ms / 1000 for q, ms in named_values(args.target, "target", names).items()}
    targets = {n: targets.get(n, math.inf) for n in names}
    if args.spark:
        return _spark_bounds(args, calibration, stream, own, targets)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be >= 1 and <= {MAX_WORKERS}")
    # the model's customer is a payload of the calibration's batch_events events; the
    # costs are those at that rate (measured at several: the time per payload falls)
    payload_rates = {n: r / calibration.batch_events for n, r in rates.items()}
    costs = calibration.consumer_costs(payload_rates[names[0]]) if args.consumers else \
        calibration.costs(not args.separate, payload_rates)
    placement = place([costs[n] for n in names], payload_rates, targets,
                      workers=args.workers, lw=args.lw, hw=args.hw, rho_max=args.rho_max,
                      model=calibration.consumer_model(names) if args.consumers
                      else calibration.model(stream_of))
    report = {"met": placement.met, "below_lw": placement.below_lw, "workers": [
        {"load": w.load, "saturated": w.load >= 1, "queries": [
            {"name": c.name, "rate": rates[c.name],
             "stream": stream_of.get(c.name, "its own"), "b_ms": c.b * 1e3,
             "predicted_ms": w.response[c.name] * 1e3,
             "target_ms": None if math.isinf(targets[c.name]) else targets[c.name] * 1e3,
             "deviation": None if math.isinf(targets[c.name])
             else deviation(w.response[c.name], targets[c.name])}
            for c in w.queries]} for w in placement.workers]}
    model = calibration.consumer_model(names) if args.consumers else \
        calibration.model(stream_of)
    report["missed"] = _missed_targets(report, costs, targets, model, args)
    if args.json:  # a saturated worker's queries never answer: null, not JSON's missing inf
        for q in (q for w in report["workers"] for q in w["queries"]):
            q.update({k: None for k in ("predicted_ms", "deviation")
                      if q[k] is not None and math.isinf(q[k])})
        print(json.dumps(report, indent=2, allow_nan=False, default=str))
        return 0 if placement.met else 1
    how = (f"on {args.workers} worker(s)" if args.workers is not None else
           f"on {len(placement.workers)} worker(s), the fewest that meet every target")
    if args.consumers:
        how += ", a consumer per query, served in the order listed"
    print(f"{len(names)} queries {how} (load <= {args.rho_max}, deviation <= {args.hw}); "
          f"{'every target met' if placement.met else 'NOT every target met'}")
    for i, w in enumerate(report["workers"], 1):
        print(f"worker {i}: load {w['load']:.3f}")
        for q in w["queries"]:
            target = "no target" if q["target_ms"] is None else \
                f"target {q['target_ms']:g} ms, deviation {q['deviation']:+.2f}"
            print(f"  {q['name']:<20} {q['rate']:>10,.0f} events/s  predicted "
                  f"{q['predicted_ms']:.3f} ms  ({target})")
    if placement.below_lw:
        print(f"further below their targets than --lw {args.lw}: "
              f"{', '.join(placement.below_lw)}")
    for why in report["missed"]:
        print(f"missed: {why}")
    return 0 if placement.met else 1


def _missed_targets(report: dict, costs: dict, targets: dict, model, args) -> list[str]:
    """Why a placement does not meet every target, one line per worker over --rho-max
    and per query above its target (what its response is made of)."""
    from dqcep.service.scaling.model import deviation, response_times
    out = []
    for i, w in enumerate(report["workers"], 1):
        if w["load"] >= 1:
            out.append(f"worker {i} is saturated (load {w['load']:.3f} >= 1): its queries "
                       "never catch up; more workers (--workers) or a lower rate")
        elif w["load"] > args.rho_max:
            out.append(f"worker {i}'s load {w['load']:.3f} exceeds --rho-max {args.rho_max}")
        for q in w["queries"]:
            if q["deviation"] is None or q["deviation"] <= args.hw or w["load"] >= 1:
                continue
            name = q["name"]
            # what the query takes alone on an idle worker: the calibrated delay and its
            # own processing; no placement answers sooner
            idle = response_times([costs[name]], {name: 0.0}, model)[name] * 1e3
            why = (f"alone on an idle worker it answers in {idle:.3f} ms (the calibrated "
                   f"delay {model.delay * 1e3:.3f} ms and its processing "
                   f"{costs[name].b * 1e3:.3f} ms): no placement meets the target"
                   if deviation(idle, q["target_ms"]) > args.hw else
                   f"waiting behind worker {i}'s other work (load {w['load']:.3f}) adds "
                   f"{q['predicted_ms'] - idle:.3f} ms: more workers (--workers) or a "
                   "looser target")
            out.append(f"{name}: predicted {q['predicted_ms']:.3f} ms, target "
                       f"{q['target_ms']:g} ms (deviation {q['deviation']:+.2f} > --hw "
                       f"{args.hw}); {why}")
    return out


def _spark_bounds(args, calibration, stream: dict, own: dict, targets: dict) -> int:
    """dqcep capacity --spark: spark.dynamicAllocation's bounds for the tightest target,
    the stream divided evenly among executors of one core (docs/capacity.md)."""
    import json
    import math

    from dqcep.service.scaling.model import executors

    if own or not stream:
        raise UserError("--spark sizes the one stream the Spark jobs read: give --rate N "
                        "(events/s at the peak), not a rate per query")
    target = min(targets.values())
    if math.isinf(target):
        raise UserError("--spark needs a response-time target: --target QUERY=MS")
    peak = next(iter(stream.values()))
    if args.rate_low is not None and not 0 < args.rate_low <= peak:
        raise UserError("--rate-low must be > 0 and at most --rate")
    most = executors(calibration, peak, target, args.hw, args.rho_max)
    if most is None:
        raise UserError(f"no number of executors meets {target * 1000:g} ms: one payload "
                        f"of {calibration.batch_events} events takes "
                        f"{calibration.shared_b * 1000:.3f} ms after a delay of "
                        f"{calibration.delay * 1000:.3f} ms")
    least = executors(calibration, args.rate_low, target, args.hw, args.rho_max) \
        if args.rate_low is not None else 1
    conf = {"spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.minExecutors": str(least),
            "spark.dynamicAllocation.maxExecutors": str(most),
            "spark.executor.cores": "1"}
    if args.json:
        print(json.dumps({"target_ms": target * 1000, "rate": peak,
                          "rate_low": args.rate_low, "conf": conf}, indent=2))
        return 0
    low = f"{args.rate_low:,.0f}" if args.rate_low is not None else "none given"
    print(f"Spark executors of one core for {target * 1000:g} ms (the tightest target): "
          f"{most} at {peak:,.0f} events/s, {least} at the low rate ({low})")
    print(" ".join(f"--conf {k}={v}" for k, v in conf.items()))
    return 0
