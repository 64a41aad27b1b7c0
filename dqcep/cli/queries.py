"""``dqcep queries list|add|remove URL``: a running service's query set, changed live."""
from __future__ import annotations

import json
import sys

from dqcep.core.errors import UserError


def add_parser(sub) -> None:
    """``dqcep queries``."""
    queries = sub.add_parser(
        "queries", help="list, add or remove the queries of a running service",
        description="Change a running service's queries without a restart (its --http "
        "address; changes need its token): add the queries of a file, remove one by "
        "name, or list them. A change is journaled and applied in its place in the "
        "stream: an added query matches the events that arrive from then on, a removed "
        "one outputs nothing more (docs/operations.md).")
    ops = queries.add_subparsers(dest="op", required=True, metavar="OP")
    for name, help_ in (("list", "the queries the service runs"),
                        ("add", "add the queries of FILE (- for stdin)"),
                        ("remove", "remove the query NAME")):
        op = ops.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        op.add_argument("url", metavar="URL", help="the service's --http address")
        if name == "add":
            op.add_argument("file", metavar="FILE", help="a query file (QUERY ...; no EVENT "
                            "or TABLE declarations: the service's file has those)")
        if name == "remove":
            op.add_argument("name", metavar="NAME", help="the query to remove")
        op.add_argument("--token-file", metavar="FILE",
                        help="the service's --http-token-file (changes need it)")
        op.set_defaults(func=command)


def command(args) -> int:
    from dqcep.service.client import ServiceClient

    client = ServiceClient(args.url, args.token_file)
    if args.op == "list":
        for q in client.get_json("queries")["queries"]:
            since = "from the start" if q.get("added_at") is None else \
                f"added at journal record {q['added_at']}"
            print(f"{q['name']} ({since})")
            print("    " + (q.get("text") or "").replace("\n", "\n    "))
        return 0
    if args.op == "add":
        source = "<stdin>" if args.file == "-" else args.file
        try:
            text = sys.stdin.read() if args.file == "-" else open(args.file,
                                                                   encoding="utf-8").read()
        except OSError as err:
            raise UserError(f"cannot read {args.file}: {err.strerror}") from None
        code, body = client.request("POST", "queries", text.encode())
    else:
        source = args.name
        code, body = client.request("DELETE", f"queries/{args.name}")
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {"error": body.decode(errors="replace").strip()}
    if code not in (200, 202):
        message = answer.get("error", answer)
        if args.op == "add" and isinstance(message, str):  # positions are the file's
            message = message.replace("<request>", source)
        raise UserError(f"{args.url}: {code}: {message}")
    verb = "added" if args.op == "add" else "removed"
    when = "applied" if answer["applied"] else "journaled (not yet applied: the service " \
        "is catching up)"
    print(f"{verb} {', '.join(answer['queries'])} at journal record "
          f"{answer['journal_offset']}: {when}; running {', '.join(answer['running'])}")
    return 0
