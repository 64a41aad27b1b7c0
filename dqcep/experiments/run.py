"""``dqcep experiment fig3|fig4|sharing|latency|all --out DIR``.

Each experiment runs its points (``dqcep.experiments.point``, one process each,
forked from a server that imported dqcep once) behind a progress bar and writes,
under DIR, ``<name>.csv``, ``<name>.png`` (matplotlib) and ``<name>.md`` (a table
and what it shows).
The same command with the same seed writes the same CSV values apart from the
measured columns (seconds, events/s, latency, RSS): the streams, matches,
engine state bytes and plan vertices are deterministic.
"""
from __future__ import annotations

import csv
import importlib.util
import math
import multiprocessing
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from dqcep.core.errors import UserError
from dqcep.experiments.workloads import SHARING, WORKLOADS

EXPERIMENTS = ("fig3", "fig4", "sharing", "latency")


@dataclass(frozen=True)
class Sizes:
    events: tuple[int, ...]        # fig3 / fig4
    reference_max: int             # the reference matcher runs up to this size
    repeat: int                    # fig4: median of this many runs
    per_query_events: int          # fig4: each query of a workload alone, at this size
    sharing_k: tuple[int, ...]
    sharing_events: int
    latency_events: int
    latency_chunk: int


FULL = Sizes((10_000, 100_000, 1_000_000, 3_000_000, 10_000_000), 10_000, 3, 1_000_000,
             (1, 2, 5, 10, 25, 50, 100), 100_000, 300_000, 1000)
QUICK = Sizes((10_000, 30_000), 10_000, 3, 10_000, (1, 5, 20), 10_000, 20_000, 1000)


# What a point imports, imported once by the fork server: a point's process is forked
# from it instead of starting Python and importing these again (0.9 s of each quick
# point was that start). Its peak RSS starts from the server's, which is what a fresh
# process had after these imports (``rss_base``).
POINT_MODULES = ["dqcep.experiments.point", "dqcep.experiments.workloads", "dqcep.lang",
                 "dqcep.plan", "dqcep.runtime", "dqcep.baseline.sase",
                 "dqcep.baseline.reference", "dqcep.generator"]


def _points() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(POINT_MODULES)
    return context


def _run_point(spec: dict, results) -> None:
    """A point's process: its result, or the traceback of what stopped it."""
    from dqcep.experiments.point import run_point
    try:
        results.send(("result", run_point(spec)))
    except BaseException:  # noqa: BLE001 - the orchestrator reports it
        results.send(("failed", traceback.format_exc()))
    finally:
        results.close()


def _point(points, spec: dict) -> dict:
    """One point in a process of its own, so that its peak RSS is its own."""
    receive, send = points.Pipe(duplex=False)
    proc = points.Process(target=_run_point, args=(spec, send))
    proc.start()
    send.close()
    try:
        kind, value = receive.recv()
    except EOFError:  # it died without a word: killed (the OOM killer), or a crash
        proc.join()
        raise RuntimeError(f"experiment point {spec} ended with exit code {proc.exitcode}")
    finally:
        receive.close()
    proc.join()
    if kind == "failed":
        raise RuntimeError(f"experiment point {spec} failed:\n{value[-3000:]}")
    return value


def _measure(name: str, specs: list[dict], row) -> list[dict]:
    """Run the points behind a progress bar; ``row(spec, result)`` makes a CSV row."""
    from tqdm import tqdm
    points = _points()
    rows = []
    with tqdm(total=len(specs), desc=name, unit="point", file=sys.stderr) as bar:
        for spec in specs:
            rows.append(row(spec, _point(points, spec)))
            bar.update()
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _slope(xs, ys) -> float:
    """Least-squares slope of log(y) on log(x): 1.0 means linear."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else float("nan")


def _table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _plot(path: Path, panels: list[tuple[str, str, str, list[tuple[str, list, list]]]]) -> None:
    """One PNG, a log-log panel per (title, x label, y label, [(label, xs, ys)])."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (title, xlabel, ylabel, series) in zip(axes[0], panels):
        for label, xs, ys in series:
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# the native engine as planned by default, and with joins built on demand
NATIVE = ("native", "on-demand")
LABEL = {"native": "dqcep", "on-demand": "dqcep, joins on demand", "sase": "SASE",
         "reference": "reference"}


def _series(rows, key, engines=NATIVE + ("sase", "reference")):
    out = []
    for w in WORKLOADS:
        for eng in engines:
            pts = [(r["events"], r[key]) for r in rows
                   if r["workload"] == w and r["engine"] == eng and r.get("query", "all") == "all"]
            if pts:
                out.append((f"{LABEL[eng]} / {w}", [p[0] for p in pts], [p[1] for p in pts]))
    return out


# -------------------------------------------------------------- experiments

def fig3(out: Path, sizes: Sizes, seed: int, command: str) -> None:
    """Memory vs number of basic events, dqcep and the SASE baseline."""
    specs = [{"engine": e, "workload": w, "events": n, "seed": seed, "repeat": 1}
             for w in WORKLOADS for n in sizes.events for e in NATIVE + ("sase",)]
    rows = _measure("fig3", specs, lambda s, r: {
        "workload": s["workload"], "engine": s["engine"], "events": s["events"],
        "matches": r["matches"], "peak_state_bytes": r["peak_state_bytes"],
        "rss_base_bytes": r["rss_base"], "rss_peak_bytes": r["rss_peak"],
        "rss_growth_bytes": r["rss_peak"] - r["rss_base"]})
    _write_csv(out / "fig3.csv", rows)
    _plot(out / "fig3.png", [
        ("Peak engine state", "basic events", "bytes", _series(rows, "peak_state_bytes")),
        ("Peak RSS of the process", "basic events", "bytes", _series(rows, "rss_peak_bytes"))])
    lines = ["# Fig. 3: memory vs number of basic events\n", f"Command: `{command}`\n",
             _table(rows, ["workload", "engine", "events", "matches", "peak_state_bytes",
                           "rss_peak_bytes"]), ""]
    small, n = min(sizes.events), max(sizes.events)
    for w in WORKLOADS:
        by = {(r["engine"], r["events"]): r for r in rows if r["workload"] == w}

        def ratio(key, a, b):
            return a[key] / max(b[key], 1)
        nat, od, sase = by[("native", n)], by[("on-demand", n)], by[("sase", n)]
        lines.append(f"- {w}, {n:,} events: SASE / dqcep peak state = "
                     f"{ratio('peak_state_bytes', sase, nat):.2f}x (joins on demand: "
                     f"{ratio('peak_state_bytes', sase, od):.2f}x); peak RSS "
                     f"{ratio('rss_peak_bytes', sase, nat):.2f}x; state growth from {small:,} "
                     f"to {n:,} events: dqcep "
                     f"{ratio('peak_state_bytes', nat, by[('native', small)]):.2f}x, SASE "
                     f"{ratio('peak_state_bytes', sase, by[('sase', small)]):.2f}x")
    (out / "fig3.md").write_text("\n".join(lines) + "\n")


def fig4(out: Path, sizes: Sizes, seed: int, command: str) -> None:
    """Execution time vs number of basic events (median of several runs), and each
    query of a workload alone at one size (where the difference comes from)."""
    from dqcep.lang import parse
    specs = [{"engine": e, "workload": w, "events": n, "seed": seed, "repeat": sizes.repeat}
             for w in WORKLOADS for n in sizes.events for e in NATIVE + ("sase",)]
    specs += [{"engine": "reference", "workload": w, "events": n, "seed": seed, "repeat": 1}
              for w in WORKLOADS for n in sizes.events if n <= sizes.reference_max]
    specs += [{"engine": e, "workload": w, "query": q.name, "events": sizes.per_query_events,
               "seed": seed, "repeat": sizes.repeat}
              for w in WORKLOADS for q in parse(WORKLOADS[w].queries).queries
              for e in NATIVE + ("sase",)]

    def row(s, r):
        sec = median(r["seconds"])
        return {"workload": s["workload"], "query": s.get("query", "all"),
                "engine": s["engine"], "events": s["events"], "matches": r["matches"],
                "runs": len(r["seconds"]), "seconds_median": sec,
                "seconds_min": min(r["seconds"]), "seconds_max": max(r["seconds"]),
                "events_per_s": s["events"] / sec if sec > 0 else 0.0}
    rows = _measure("fig4", specs, row)
    _write_csv(out / "fig4.csv", rows)
    whole = [r for r in rows if r["query"] == "all"]
    _plot(out / "fig4.png", [
        ("Execution time", "basic events", "seconds (median)", _series(whole, "seconds_median")),
        ("Throughput", "basic events", "events/s", _series(whole, "events_per_s"))])
    lines = ["# Fig. 4: execution time vs number of basic events\n", f"Command: `{command}`\n",
             _table(whole, ["workload", "engine", "events", "matches", "runs", "seconds_median",
                            "events_per_s"]), "",
             "Slope of log(time) on log(events) (1.0 = linear), and SASE / dqcep time at "
             "the largest size:", ""]
    for w in WORKLOADS:
        for eng in NATIVE + ("sase",):
            pts = [(r["events"], r["seconds_median"]) for r in whole
                   if r["workload"] == w and r["engine"] == eng]
            lines.append(f"- {w}, {LABEL[eng]}: slope {_slope(*zip(*pts)):.2f}")
        n = max(sizes.events)
        t = {r["engine"]: r["seconds_median"] for r in whole
             if r["workload"] == w and r["events"] == n}
        lines.append(f"- {w}, {n:,} events: SASE / dqcep time = "
                     f"{t['sase'] / max(t['native'], 1e-9):.2f}x (joins on demand: "
                     f"{t['sase'] / max(t['on-demand'], 1e-9):.2f}x)")
    per_query = []
    for w in WORKLOADS:
        for q in dict.fromkeys(r["query"] for r in rows
                               if r["workload"] == w and r["query"] != "all"):
            t = {r["engine"]: r for r in rows if r["workload"] == w and r["query"] == q}
            per_query.append({"workload": w, "query": q, "matches": t["native"]["matches"],
                              "dqcep_s": t["native"]["seconds_median"],
                              "on_demand_s": t["on-demand"]["seconds_median"],
                              "sase_s": t["sase"]["seconds_median"],
                              "sase_over_dqcep": t["sase"]["seconds_median"]
                              / max(t["native"]["seconds_median"], 1e-9),
                              "sase_over_on_demand": t["sase"]["seconds_median"]
                              / max(t["on-demand"]["seconds_median"], 1e-9)})
    lines += ["", f"Each query alone, {sizes.per_query_events:,} events (median of "
              f"{sizes.repeat}):", "",
              _table(per_query, ["workload", "query", "matches", "dqcep_s", "on_demand_s",
                                 "sase_s", "sase_over_dqcep", "sase_over_on_demand"]), ""]
    mismatched = sorted({(r["workload"], r["query"], r["events"]) for r in rows
                         if len({x["matches"] for x in rows if (x["workload"], x["query"],
                                 x["events"]) == (r["workload"], r["query"], r["events"])}) != 1})
    lines.append("- every engine found the same number of matches at every point" if not
                 mismatched else f"- MATCH COUNTS DIFFER at {mismatched}")
    (out / "fig4.md").write_text("\n".join(lines) + "\n")


def sharing(out: Path, sizes: Sizes, seed: int, command: str) -> None:
    """1..100 queries with a common sub-pattern: one shared plan, one plan per
    query, and the SASE baseline (one NFA per query)."""
    specs = [{"engine": e, "workload": "sharing", "queries": k, "events": sizes.sharing_events,
              "seed": seed, "repeat": sizes.repeat}
             for k in sizes.sharing_k for e in ("native", "separate", "sase")]
    rows = _measure("sharing", specs, lambda s, r: {
        "queries": s["queries"], "engine": s["engine"], "events": s["events"],
        "matches": r["matches"], "vertices": r.get("vertices", ""),
        "peak_state_bytes": r["peak_state_bytes"], "seconds_median": median(r["seconds"])})
    _write_csv(out / "sharing.csv", rows)
    label = {"native": "dqcep, shared plan", "separate": "dqcep, one plan per query",
             "sase": "SASE, one NFA per query"}

    def series(key, engines):
        return [(label[e], [r["queries"] for r in rows if r["engine"] == e],
                 [r[key] for r in rows if r["engine"] == e]) for e in engines]
    _plot(out / "sharing.png", [
        ("Plan vertices", "queries", "vertices", series("vertices", ("native", "separate"))),
        ("Execution time", "queries", "seconds (median)",
         series("seconds_median", ("native", "separate", "sase"))),
        ("Peak engine state", "queries", "bytes",
         series("peak_state_bytes", ("native", "separate", "sase")))])
    k = max(sizes.sharing_k)
    at = {r["engine"]: r for r in rows if r["queries"] == k}
    lines = [f"# Sharing: 1 to {k} queries with a common sub-pattern\n",
             f"Workload: {SHARING.description}; {sizes.sharing_events:,} events.\n",
             f"Command: `{command}`\n",
             _table(rows, ["queries", "engine", "matches", "vertices", "peak_state_bytes",
                           "seconds_median"]), "",
             f"- {k} queries: {at['native']['vertices']} vertices shared vs "
             f"{at['separate']['vertices']} unshared; time unshared / shared = "
             f"{at['separate']['seconds_median'] / max(at['native']['seconds_median'], 1e-9):.2f}x, "
             f"SASE / shared = "
             f"{at['sase']['seconds_median'] / max(at['native']['seconds_median'], 1e-9):.2f}x"]
    same = all(len({r["matches"] for r in rows if r["queries"] == q}) == 1
               for q in sizes.sharing_k)
    lines.append("- the three set-ups found the same matches (counts) at every point" if same
                 else "- MATCH COUNTS DIFFER between set-ups")
    (out / "sharing.md").write_text("\n".join(lines) + "\n")


def latency(out: Path, sizes: Sizes, seed: int, command: str) -> None:
    """Per-match detection latency p50/p99 and throughput, both engines."""
    specs = [{"engine": e, "workload": w, "events": sizes.latency_events, "seed": seed,
              "latency_chunk": sizes.latency_chunk}
             for w in WORKLOADS for e in ("native", "sase")]
    rows = _measure("latency", specs, lambda s, r: {
        "workload": s["workload"], "engine": s["engine"], "events": s["events"],
        "chunk": s["latency_chunk"], "matches": r["matches"], "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"], "events_per_s": r["events_per_s"]})
    _write_csv(out / "latency.csv", rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [f"{'dqcep' if r['engine'] == 'native' else 'SASE'}\n{r['workload']}" for r in rows]
    x = range(len(rows))
    axes[0].bar([i - 0.2 for i in x], [r["p50_ms"] for r in rows], 0.4, label="p50")
    axes[0].bar([i + 0.2 for i in x], [r["p99_ms"] for r in rows], 0.4, label="p99")
    axes[0].set_xticks(list(x), names, fontsize=8)
    axes[0].set_ylabel("detection latency (ms)")
    axes[0].legend()
    axes[1].bar(list(x), [r["events_per_s"] for r in rows])
    axes[1].set_xticks(list(x), names, fontsize=8)
    axes[1].set_ylabel("events/s")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    lines = ["# Detection latency and throughput\n",
             f"{sizes.latency_events:,} events per run, handed over in chunks of "
             f"{sizes.latency_chunk:,} at full speed; latency = from the arrival of the "
             f"chunk holding a match's last needed event (for a trailing NOT: the first "
             f"event after start + W) to the return of the call that emitted it.\n",
             f"Command: `{command}`\n",
             _table(rows, ["workload", "engine", "matches", "p50_ms", "p99_ms",
                           "events_per_s"])]
    (out / "latency.md").write_text("\n".join(lines) + "\n")


RUNNERS = {"fig3": fig3, "fig4": fig4, "sharing": sharing, "latency": latency}


def run_experiments(name: str, out: str, quick: bool = False, seed: int = 1,
                    sizes: list[int] | None = None, command: str = "") -> list[Path]:
    """Run one experiment or all; returns the files written."""
    if name not in RUNNERS and name != "all":
        raise UserError(f"unknown experiment {name!r}; expected one of "
                        f"{', '.join(EXPERIMENTS)} or all")
    if importlib.util.find_spec("matplotlib") is None:
        raise UserError("dqcep experiment draws its plots with matplotlib: "
                        "pip install 'dqcep[experiments]'")
    chosen = QUICK if quick else FULL
    if sizes:
        if any(n < 1 for n in sizes):
            raise UserError("--sizes must be positive event counts")
        chosen = Sizes(tuple(sorted(set(sizes))), chosen.reference_max, chosen.repeat,
                       chosen.per_query_events, chosen.sharing_k, chosen.sharing_events, chosen.latency_events,
                       chosen.latency_chunk)
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    names = EXPERIMENTS if name == "all" else (name,)
    for n in names:
        RUNNERS[n](directory, chosen, seed, command)
    return [directory / f"{n}.{ext}" for n in names for ext in ("csv", "png", "md")]
