"""``dqcep experiment``: the DQCEP paper's experiments."""
from __future__ import annotations

import sys

from dqcep.core.errors import UserError


def add_parser(sub) -> None:
    """``dqcep experiment``."""
    exp = sub.add_parser(
        "experiment", help="reproduce the DQCEP paper's experiments (dqcep vs SASE)",
        description="Run the experiments of docs/experiments.md on generated workloads: "
        "fig3 (memory vs number of basic events), fig4 (execution time vs number of basic "
        "events), sharing (1..100 queries with a common sub-pattern), latency (detection "
        "latency p50/p99 and throughput), or all. Each point runs in a process of its own; each "
        "experiment writes NAME.csv, NAME.png and NAME.md under --out.")
    exp.add_argument("name", choices=("fig3", "fig4", "sharing", "latency", "all"))
    exp.add_argument("--out", required=True, metavar="DIR", help="directory for the results")
    exp.add_argument("--quick", action="store_true",
                     help="small sizes (10^4 and 3x10^4 events; a few minutes in all)")
    exp.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    exp.add_argument("--sizes", metavar="N,N,...",
                     help="fig3/fig4 event counts instead of the default "
                     "(10^4, 10^5, 10^6, 3x10^6, 10^7; with --quick 10^4, 3x10^4)")
    exp.set_defaults(func=command)


def command(args) -> int:
    from dqcep.experiments.run import run_experiments

    sizes = None
    if args.sizes:
        try:
            sizes = [int(float(x)) for x in args.sizes.split(",")]
        except ValueError:
            raise UserError(f"--sizes: expected comma-separated event counts, got "
                            f"{args.sizes!r}") from None
    command = "dqcep experiment " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["experiment"] \
        else f"dqcep experiment {args.name} --out {args.out}"
    for path in run_experiments(args.name, args.out, args.quick, args.seed, sizes, command):
        print(path)
    return 0
