"""``dqcep status URL``: a running service's ``/status`` as a terminal summary."""
from __future__ import annotations

import json
import sys

from dqcep.core.errors import UserError


def add_parser(sub) -> None:
    """``dqcep status``."""
    status = sub.add_parser(
        "status", help="show how a running service is doing (its --http address)",
        description="Read GET URL/status of a service started with --http and print it "
        "as a summary: events in and out, lag, late events, repeats and dead letters by "
        "reason, state bytes, checkpoint age, and per query its matches, response times "
        "and state (docs/operations.md).")
    status.add_argument("url", metavar="URL", help="the service's --http address, e.g. "
                        "http://127.0.0.1:8080/")
    status.add_argument("--token-file", metavar="FILE",
                        help="the service's --http-token-file (needed off loopback)")
    status.add_argument("--json", action="store_true", help="print /status as it is")
    status.set_defaults(func=command)


def command(args) -> int:
    from dqcep.service.client import ServiceClient

    status = ServiceClient(args.url, args.token_file).get_json("status")
    if args.json:
        json.dump(status, sys.stdout, indent=2)
        print()
        return 0
    sys.stdout.write(summary(status, args.url))
    return 0


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""


def summary(s: dict, url: str) -> str:
    """The terminal summary of one status snapshot."""
    if not s:
        raise UserError(f"{url}: the service has not published its figures yet; try again")
    dead = s.get("dead_letters") or {}
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(dead.items()) if v)
    lines = [
        f"dqcep service at {url.rstrip('/')}/: up {s.get('uptime_s', 0):,.0f} s, inputs "
        f"{', '.join(s.get('inputs') or []) or '-'}",
        f"events in {_n(s.get('events_in'))} ({s.get('events_per_s', 0):,.0f} events/s "
        f"since start), matches out {_n(s.get('matches_out'))}, lag "
        f"{_n(s.get('lag_records'))} records, watermark {_n(s.get('watermark'))}",
        f"late {_n(s.get('late'))}, repeats {_n(s.get('duplicates'))}, dead letters "
        f"{sum(dead.values()):,}" + (f" ({reasons})" if reasons else ""),
        f"engine state {_bytes(s.get('state_total_bytes'))}, journal "
        f"{_bytes(s.get('journal_bytes'))}, last checkpoint "
        + ("-" if s.get("checkpoint_age_s") is None else f"{s['checkpoint_age_s']:.1f} s ago"),
    ]
    if s.get("error"):
        lines.append(f"FAILING: {s['error']}")
    for w in s.get("worker_status") or []:
        lines.append(f"worker {w['worker']}: {'up' if w['up'] else 'DOWN'}, queries "
                     f"{', '.join(w['queries']) or '-'}")
    names = [q["name"] for q in s.get("queries") or []]
    width = max([len("query")] + [len(n) for n in names])
    lines.append(f"{'query':<{width}}  {'matches':>10}  {'mean ms':>9}  {'max ms':>9}  "
                 f"{'state':>11}  status")
    for name in names:
        r = (s.get("response") or {}).get(name) or {}
        stopped = (s.get("stopped") or {}).get(name)

        def ms(x):
            return "-" if x is None else f"{x:.1f}"
        lines.append(f"{name:<{width}}  {_n((s.get('matches_by_query') or {}).get(name)):>10}"
                     f"  {ms(r.get('mean_ms')):>9}  {ms(r.get('max_ms')):>9}  "
                     f"{_bytes((s.get('state_bytes') or {}).get(name)):>11}  "
                     + (f"STOPPED: {stopped}" if stopped else "running"))
    return "\n".join(lines) + "\n"
