"""``dqcep run ... --input mqtt://...``: the options of the streaming service, checked,
and the service (or its workers) started."""
from __future__ import annotations

from dqcep.cli.common import (MAX_WORKERS, adapt_of, admission_rule_of, check_water_marks,
                              load_queries, load_rates, materialize_of, named_values,
                              warn_plan)
from dqcep.core.admission import TICK_MS
from dqcep.core.errors import UserError
from dqcep.core.events import MAX_FUTURE_MS
from dqcep.service.scaling.model import Calibration


def _state_dir(args):
    """Where the service keeps its journal, checkpoint, dead letters and late events
    unless each is named: ``--state DIR``, else beside a file output
    (``matches.jsonl`` -> ``matches.state``); None when all four are named."""
    from pathlib import Path

    from dqcep.io.database import is_database
    from dqcep.io.sinks import is_remote
    if args.state:
        return Path(args.state)
    if args.journal and args.checkpoint and args.dead_letter and args.late:
        return None
    if is_remote(args.output) or is_database(args.output):
        raise UserError(f"with --output {args.output.split(':', 1)[0]}://..., say where the "
                        "service keeps its state: --state DIR")
    out = Path(args.output)
    return out.with_name(out.stem + ".state")


def start_service(args) -> int:
    """The service (or its workers) for ``dqcep run`` with MQTT inputs."""
    from pathlib import Path

    from dqcep.service import ServiceConfig, serve

    if not all(i.startswith(("mqtt://", "mqtts://")) for i in args.input):
        raise UserError("MQTT inputs cannot be mixed with files")
    if args.engine != "native":
        raise UserError("the streaming service runs the native engine")
    if not args.output or args.output == "-":
        raise UserError("an MQTT input needs --output FILE or mqtt://... (not stdout: a restart "
                        "cuts a file back to the checkpoint)")
    state = _state_dir(args)
    named = Path(".") if state is None else state  # every path named: nothing derived
    from dqcep.io.mapping import TopicMap
    # parsed once, here: a bad rule is refused before anything starts, and the service
    # (its workers too) reads with this map
    topic_map = TopicMap.load(args.topic_map) if args.topic_map else None
    fmt = args.format
    if fmt not in (None, "msgpack", "json"):
        raise UserError("MQTT payloads are msgpack or json (--format; omitted: each "
                        "payload's own)")
    http = None
    if (args.http_token_file or args.http_host) and not args.http:
        raise UserError(f"{'--http-token-file' if args.http_token_file else '--http-host'} "
                        "goes with --http HOST:PORT")
    if args.http:
        from dqcep.service.http import http_access
        http = http_access(args.http, args.http_token_file, args.http_host or ())
    rule = admission_rule_of(args)  # refused before anything starts
    query_file = load_queries(args.queries)  # positioned errors before anything starts
    warn_plan(query_file, load_rates(args.rates))
    cfg = ServiceConfig(
        queries=args.queries, inputs=args.input,
        journal=args.journal or str(named / "journal"),
        checkpoint=args.checkpoint or str(named / "checkpoint.bin"), output=args.output,
        dead_letter=args.dead_letter or str(named / "dead-letter.jsonl"),
        late=args.late or str(named / "late.jsonl"), state=state and str(state),
        fmt=fmt, lateness=rule.lateness, skew=rule.skew, timeline=rule.timeline,
        tick=TICK_MS if args.tick is None else args.tick, topic_map=topic_map,
        max_future=MAX_FUTURE_MS if args.max_future is None else args.max_future,
        output_format=args.output_format, output_token_file=args.output_token_file,
        client_id=args.client_id,
        stats_every=args.stats_every, stats_file=args.stats_file,
        until_idle=args.until_idle, journal_retention=args.journal_retention,
        journal_segment_bytes=args.journal_segment, materialize=materialize_of(args, running=True),
        adapt=adapt_of(args),
        rates=load_rates(args.rates), budget=args.max_partial_matches,
        returns=args.returns, http=http,
        hosted=args.queries_hosted.split(",") if args.queries_hosted else None)
    if args.workers is None and not args.target:
        return serve(cfg)
    return _serve_workers(args, cfg, [q.name for q in query_file.queries])


def _serve_workers(args, cfg, names: list[str]) -> int:
    """--workers N and/or --target Q=MS --calibration FILE: the service as workers."""
    from dqcep.io.database import is_database
    from dqcep.service.coordinator import Scaling, round_robin, serve_workers

    if is_database(cfg.output):
        raise UserError("--workers and --target write a file or a topic (--output); a "
                        "database output takes one service")
    if cfg.hosted is not None:
        raise UserError("--queries runs one service; with --workers every query of the "
                        "file is placed")
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be >= 1 and <= {MAX_WORKERS}")
    check_water_marks(args)
    if bool(args.target) != bool(args.calibration):
        raise UserError("--target needs --calibration FILE (dqcep calibrate) to place the "
                        "queries by" if args.target else
                        "--calibration is what --target places by; give --target QUERY=MS")
    scaling = None
    if args.target:
        targets = {q: ms / 1000 for q, ms in named_values(args.target, "target",
                                                           names).items()}
        scaling = Scaling({n: targets.get(n, float("inf")) for n in names},
                          Calibration.load(args.calibration), lw=args.lw, hw=args.hw,
                          replan_every=args.replan_every,
                          calibration_path=args.calibration)
    workers = args.workers or 1
    return serve_workers(cfg, round_robin(names, min(workers, len(names))), scaling)
