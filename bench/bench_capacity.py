"""Predicted against measured response times (issue 21).

Calibrates the IoT queries live (``dqcep.service.scaling.calibrate``: each query alone and the
shared plan as ``dqcep run`` processes, on the first ``--calibrate`` events), then for
each load from 10% to 90% of one worker's predicted capacity runs the streaming
service against a Mosquitto of its own - as one service (the shared plan) and as
``--workers 2`` (a consumer per query, placed round robin) - and publishes payloads of
200 IoT events with Poisson arrivals (exponential gaps) at that rate. The service measures each query's mean response time (arrival of the
payload holding a match's completing event to its output; docs/streaming.md); the
first ``--warmup`` of each run's payloads are left out (the difference of the stats
totals). The model (``dqcep.service.scaling.model``) predicts the same from the calibration. Every
run is a fresh service (its own client id and state), so one stream of distinct
events serves every load.

Prints a table (workers, load, rate, per query predicted and measured ms, error),
writes a plot (``--plot``, PNG), the error per worker count, and ends with
``prediction error: median X%, max Y% over N points`` (the points below 80% load;
target: median <= 20%).

    python3 bench/bench_capacity.py [--payloads N] [--loads 0.1,0.2,...] [--workers 1,2]
                                    [--plot FILE]
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import free_port, wait_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "dqcep" / "data" / "iot.cep"
BATCH = 200


def generate(path: Path, events: int) -> tuple[list[bytes], list[int]]:
    """Payloads of the IoT stream, and the events before each (cumulative counts)."""
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                    str(events), "--seed", "3", "--batch-size", str(BATCH), "--quiet",
                    "--chunk-size", str(BATCH * 1000), "-o", str(path)], check=True)
    payloads, before = [], [0]
    with open(path, "rb") as f:
        for obj in msgpack.Unpacker(f, raw=False):
            payloads.append(msgpack.packb(obj))
            before.append(before[-1] + len(obj["events"]))
    return payloads, before


class Service:
    def __init__(self, state: Path, url: str, client_id: str, workers: int = 1,
                 extra: tuple = ()):
        state.mkdir()
        self.stats, self.log = state / "stats.json", state / "stderr.txt"
        self.cmd = [sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input", url,
                    "--client-id", client_id, "--state", str(state), "-o",
                    str(state / "out.jsonl"), "--stats-file", str(self.stats),
                    "--stats-every", "0.1", *extra] + (["--workers", str(workers)]
                                                       if workers > 1 else [])
        with open(self.log, "w") as log:  # a file: a pipe nobody reads would fill
            self.proc = subprocess.Popen(self.cmd, stderr=log)
        deadline = time.monotonic() + 30
        while "listening" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service did not start: {self.log.read_text()}")
            time.sleep(0.02)

    def read(self) -> dict:
        try:
            return json.loads(self.stats.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_events(self, n: int, timeout: float = 120) -> dict:
        """The stats once ``n`` events are in and a stats period has passed after."""
        deadline = time.monotonic() + timeout
        while self.read().get("events_in", 0) < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise SystemExit(f"the service did not take in {n} events: "
                                 f"{self.read()} {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        time.sleep(0.25)
        return self.read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def poisson_publish(url: str, payloads: list[bytes], rate: float, seed: int) -> float:
    """Publish with exponential gaps of mean 1/rate s; returns the achieved rate."""
    from dqcep.io.mqtt import MqttPublisher, MqttUrl
    pub = MqttPublisher(MqttUrl.parse(url), client_id=f"bench-pub-{seed}")
    rng = random.Random(seed)
    start = time.monotonic()
    due = start
    for p in payloads:
        due += rng.expovariate(rate)
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        pub.publish(p)
    took = time.monotonic() - start
    pub.close()
    return len(payloads) / took


def measured_service(before: dict, after: dict) -> tuple[float, float, float]:
    """The service's own figures between two stats totals (``service``): time per
    payload (ms), delay from a step's first payload's arrival to its start (ms), the
    share of the time in steps."""
    a, b = after["service"], before["service"]
    n = a["payloads"] - b["payloads"]
    step = (a["mean_ms"] * a["payloads"] - b["mean_ms"] * b["payloads"]) / n
    return step, a["delay_ms"], a["utilization"]


def measured_means(before: dict, after: dict) -> dict[str, float | None]:
    """Per query, the mean response (ms) of the matches between two stats totals."""
    out = {}
    for q, a in after["response"].items():
        b = before.get("response", {}).get(q, {"matches": 0, "mean_ms": None})
        n = a["matches"] - b["matches"]
        total = (a["mean_ms"] or 0) * a["matches"] - (b["mean_ms"] or 0) * b["matches"]
        out[q] = total / n if n > 0 else None
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payloads", type=int, default=3000, help="payloads per load point")
    ap.add_argument("--warmup", type=float, default=0.2,
                    help="share of each run's payloads left out (default 0.2)")
    ap.add_argument("--calibrate", type=int, default=0, metavar="N",
                    help="payloads the calibration runs over: the first N the runs measure "
                    "(default 0: all of them; the IoT stream's match rate rises over its "
                    "first hours, so a shorter stretch is cheaper than the runs)")
    ap.add_argument("--cal-loads", default="0.4,0.8",
                    help="the calibration's loads (dqcep calibrate --loads; '' for one payload "
                    "at a time only)")
    ap.add_argument("--offline", action="store_true",
                    help="calibrate in this process, without the broker")
    ap.add_argument("--loads", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--workers", default="1,2",
                    help="worker counts to run (1: the one service, shared plan; N: dqcep run "
                    "--workers N, a consumer per query)")
    ap.add_argument("--plot", metavar="FILE.png")
    ap.add_argument("--detail", action="store_true",
                    help="after each row, what the service measured of its own: per service "
                    "(one per query with workers) its time per payload, the delay before a "
                    "step (the whole run's) and its utilization, beside the calibrated cost")
    step = ap.add_argument_group("rate step (--step: instead of the loads)")
    step.add_argument("--step", action="store_true",
                      help="one service with --target: a step from --step-from to --step-to "
                      "of one worker's capacity; the time until every query is back within "
                      "its target, the workers started, and matches lost or repeated")
    step.add_argument("--step-from", type=float, default=0.2)
    step.add_argument("--step-to", type=float, default=1.5)
    step.add_argument("--step-seconds", type=float, default=4.0,
                      help="seconds at each rate (default 4)")
    step.add_argument("--target-ms", type=float, default=5.0,
                      help="every query's target in the step (default 5 ms)")
    step.add_argument("--window", type=float, default=1.0,
                      help="a query is within its target when its mean response over the "
                      "last WINDOW s is (default 1 s, the re-plan interval)")
    args = ap.parse_args(argv)
    args.cal_loads = [float(x) for x in args.cal_loads.split(",") if x]
    if args.step:
        return rate_step(args)
    from dqcep.service.scaling.calibrate import calibrate
    from dqcep.service.scaling.model import response_times
    from dqcep.lang import parse_file

    loads = [float(x) for x in args.loads.split(",")]
    names = [q.name for q in parse_file(str(QUERIES)).queries]
    binary = "/usr/sbin/mosquitto"
    rows, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        payloads, before = generate(tmp / "iot.msgpack", args.payloads * BATCH)
        port = free_port()
        (tmp / "m.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                                    "max_queued_messages 0\npersistence false\n")
        broker = subprocess.Popen([binary, "-c", str(tmp / "m.conf")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)
        url = f"mqtt://127.0.0.1:{port}/bench"
        try:
            # the payloads the runs measure (after the warm-up), with their match rates
            warm = int(len(payloads) * args.warmup)
            sample = payloads[warm:warm + args.calibrate if args.calibrate else None]
            cal = calibrate(str(QUERIES), sample, BATCH, tmp,
                            broker=None if args.offline else url + "/calibrate",
                            loads=() if args.offline else args.cal_loads,
                            repeats=1 if args.offline else 3)
        except BaseException:
            broker.terminate()
            raise
        model = cal.model({q: "the stream" for q in names})
        # events/s at which the one worker's load is 1 (checkpoints take their share)
        capacity = BATCH * (1 - cal.checkpoint.b / cal.checkpoint_every) / cal.shared_b
        print(f"calibration: {cal.payloads} payloads of {BATCH} events; per payload: "
              f"shared plan {cal.shared_b * 1e3:.3f} ms (own work "
              f"{cal.overhead.b * 1e3:.3f} ms), delay {cal.delay * 1e3:.3f} ms, "
              f"a checkpoint {cal.checkpoint.b * 1e3:.1f} ms every {cal.checkpoint_every:g} s; "
              f"one worker's capacity {capacity:,.0f} events/s")
        consumer_cal = {}  # per worker count: the consumers calibrated as they run
        print(f"{'workers':>7} {'load':>5} {'events/s':>10} {'sent/s':>10} "
              + " ".join(f"{q[:11]:>11} {'meas':>7} {'err':>6}" for q in names))
        try:
            for workers in [int(w) for w in args.workers.split(",")]:
                for i, rho in enumerate(loads):
                    rate = rho * capacity
                    tag = f"w{workers}-{i}"
                    svc = Service(tmp / tag, url, f"bench-capacity-{tag}", workers)
                    try:
                        sent = poisson_publish(url, payloads[:warm], rate / BATCH, 2 * i)
                        start = svc.wait_events(before[warm])
                        sent = poisson_publish(url, payloads[warm:], rate / BATCH, 2 * i + 1)
                        end = svc.wait_events(before[-1])
                    finally:
                        svc.stop()
                    measured = measured_means(start, end)
                    rates = {q: rate / BATCH for q in names}
                    if workers == 1:  # the one service: the shared plan, costs at the rate
                        costs = list(cal.costs(True, rates).values())
                        predicted = response_times(costs, rates, model)
                    else:  # a consumer per query, on the workers the service placed them
                        if workers not in consumer_cal:  # calibrated as it will run
                            consumer_cal[workers] = calibrate(
                                str(QUERIES), sample, BATCH, tmp,
                                broker=url + f"/calibrate-{workers}", workers=workers,
                                loads=args.cal_loads, repeats=3)
                        cw = consumer_cal[workers]
                        predicted, consumers = {}, cw.consumer_costs(rate / BATCH)
                        for hosted in end["workers"]:
                            predicted.update(response_times(
                                [consumers[q] for q in hosted], rates,
                                cw.consumer_model(hosted)))
                    cells = []
                    for q in names:
                        p, m = predicted[q] * 1e3, measured[q]
                        err = abs(p - m) / m if m else None
                        if err is not None and rho < 0.8:
                            errors.append((workers, err))
                        rows.append((workers, rho, q, p, m))
                        cells.append(f"{p:>11.3f} "
                                     f"{m if m is not None else float('nan'):>7.3f} "
                                     + (f"{err:>6.0%}" if err is not None else f"{'-':>6}"))
                    print(f"{workers:>7} {rho:>5.0%} {rate:>10,.0f} {sent * BATCH:>10,.0f} "
                          + " ".join(cells), flush=True)
                    if args.detail:
                        parts = [("the service", start, end,
                                  sum(c.b for c in costs) + cal.overhead.b)] \
                            if workers == 1 else [
                                (q, start["queries"][q], end["queries"][q], consumers[q].b)
                                for q in names]
                        for who, a, b, cost in parts:
                            step, delay, busy = measured_service(a, b)
                            print(f"{'':>13}{who}: {step:.3f} ms per payload (calibrated "
                                  f"{cost * 1e3:.3f} at this rate), delay {delay:.3f} ms, "
                                  f"utilization {busy:.2f}")
        finally:
            broker.terminate()
            broker.wait(10)
    if args.plot:
        plot(rows, names, args.plot)
    for workers in sorted({w for w, _ in errors}):
        some = [e for w, e in errors if w == workers]
        print(f"{workers} worker(s): median {statistics.median(some):.0%}, max "
              f"{max(some):.0%} over {len(some)} points")
    if errors:
        every = [e for _, e in errors]
        print(f"prediction error: median {statistics.median(every):.0%}, max "
              f"{max(every):.0%} over {len(every)} points")


def rate_step(args) -> None:
    """The service with --target through a rate step (see --step)."""
    import threading

    from dqcep.service.scaling.calibrate import calibrate
    from dqcep.lang import parse_file

    names = [q.name for q in parse_file(str(QUERIES)).queries]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        port = free_port()
        (tmp / "m.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                                    "max_queued_messages 0\npersistence false\n")
        broker = subprocess.Popen(["/usr/sbin/mosquitto", "-c", str(tmp / "m.conf")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)
        url = f"mqtt://127.0.0.1:{port}/bench"
        try:
            # the stream's payloads past its first hours (its match rate rises over them;
            # the step stream is the same stream, longer)
            sample, _ = generate(tmp / "calibration.msgpack", 3000 * BATCH)
            sample = sample[600:600 + args.calibrate if args.calibrate else None]
            cal = calibrate(str(QUERIES), sample, BATCH, tmp, broker=url + "/calibrate",
                            loads=args.cal_loads, repeats=3)
            (tmp / "cal.json").write_text(json.dumps(cal.to_json()))
            capacity = BATCH * (1 - cal.checkpoint.b / cal.checkpoint_every) / cal.shared_b
            low, high = args.step_from * capacity, args.step_to * capacity
            n_low = int(low * args.step_seconds / BATCH)
            n_high = int(high * args.step_seconds / BATCH)
            payloads, before = generate(tmp / "step.msgpack", (n_low + n_high) * BATCH)
            print(f"one worker's capacity {capacity:,.0f} events/s; step {low:,.0f} -> "
                  f"{high:,.0f} events/s after {args.step_seconds:g} s; target "
                  f"{args.target_ms:g} ms for every query")
            svc = Service(tmp / "step", url, "bench-step", 1, (
                "--target", f"*={args.target_ms}", "--calibration", str(tmp / "cal.json"),
                "--replan-every", "1"))
            samples, watching = [], threading.Event()

            def watch():
                while not watching.is_set():
                    s = svc.read()
                    if s.get("queries"):  # the totals: (matches, mean ms) per query
                        samples.append((time.monotonic(), len(s["workers"]), {
                            q: ((s["queries"][q].get("response") or {}).get("matches", 0),
                                (s["queries"][q].get("response") or {}).get("mean_ms") or 0.0)
                            for q in names}))
                    time.sleep(0.1)
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            try:
                poisson_publish(url, payloads[:n_low], low / BATCH, 1)
                stepped = time.monotonic()
                poisson_publish(url, payloads[n_low:], high / BATCH, 2)
                sent = time.monotonic()
                end = svc.wait_events(before[-1], timeout=600)
                drained = time.monotonic()
            finally:
                watching.set()
                watcher.join()
                svc.proc.send_signal(signal.SIGUSR1)  # the end of the stream
                svc.proc.wait(120)
            # the same events through dqcep run from the file: what must come out
            subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                            str(tmp / "step.msgpack"), "-o", str(tmp / "want.jsonl")],
                           check=True)
            want = (tmp / "want.jsonl").read_text().splitlines()
            got = [line for q in names for line in
                   (tmp / "step" / f"out.{q}.jsonl").read_text().splitlines()]
        finally:
            broker.terminate()
            broker.wait(10)
    target = args.target_ms
    late_since, back = None, None
    for i, (t, _, totals) in enumerate(samples):
        if t < stepped:
            continue
        # each query's mean over the last --window s (the totals' difference)
        j = max((k for k in range(i) if samples[k][0] <= t - args.window), default=None)
        if j is None:
            continue
        means = {}
        for q, (n, mean) in totals.items():
            n0, mean0 = samples[j][2][q]
            means[q] = (n * mean - n0 * mean0) / (n - n0) if n > n0 else None
        within = all(m is None or m <= target for m in means.values())
        if not within and late_since is None:
            late_since = t
        if late_since is not None and within and back is None:
            back = t
        if not within:
            back = None
    workers = [w for t, w, _ in samples]
    before_step = [w for t, w, _ in samples if t < stepped]
    added = next((t for t, w, _ in samples if t >= stepped and before_step
                  and w > before_step[-1]), None)
    plans = end.get("plans", [])
    for p in plans:
        print(f"  plan at {p['at']:7.1f} s: {len(p['workers'])} worker(s) {p['workers']} "
              f"({p['why']}); moved {p['moved']}")
    lost, repeated = len(set(want) - set(got)), len(got) - len(set(got))
    extra = len(set(got) - set(want))
    print(f"workers: {workers[0] if workers else '?'} before the step, {max(workers)} at most,"
          f" {workers[-1] if workers else '?'} at the end; "
          + (f"more workers {added - stepped:.1f} s after the step; " if added else "")
          + f"published until {sent - stepped:.1f} s after the step, drained at "
          f"{drained - stepped:.1f} s")
    if late_since is None:
        print("every query stayed within its target through the step")
    elif back is None:
        print(f"a query left its target {late_since - stepped:.1f} s after the step and was "
              f"not back within it while measured ({samples[-1][0] - stepped:.1f} s)")
    else:
        print(f"back within every target {back - stepped:.1f} s after the step (out since "
              f"{late_since - stepped:.1f} s)" + (
                  "; only once the publisher had stopped" if back >= sent else
                  "; while the high rate went on"))
    print(f"matches: {len(set(got)):,} of {len(set(want)):,} expected; lost {lost}, "
          f"repeated {repeated}, unexpected {extra}")


def plot(rows, names, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    counts = sorted({w for w, *_ in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(6 * len(counts), 4), squeeze=False)
    for ax, workers in zip(axes[0], counts):
        for q in names:
            pts = [(r, p, m) for w, r, name, p, m in rows if name == q and w == workers]
            line, = ax.plot([r for r, _, _ in pts], [p for _, p, _ in pts], "--",
                            label=f"{q} predicted")
            ax.plot([r for r, _, _ in pts], [m for _, _, m in pts], "o-",
                    color=line.get_color(), label=f"{q} measured")
        ax.set_title(f"{workers} worker(s)")
        ax.set_xlabel("arrival rate (share of one worker's predicted capacity)")
        ax.set_ylabel("mean response time (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
