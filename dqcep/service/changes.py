"""Queries added to and removed from a running service (``POST /queries``,
``DELETE /queries/NAME``, ``dqcep queries``).

A change is a control record in the journal (topic ``CONTROL_TOPIC``, a JSON
payload), written and made durable like any message: the service applies it when
its consumption reaches it, after every record before it and before every record
after it (``dqcep.runtime.live.change_queries``). A replay after a crash therefore
applies it at the same point, and the output stays exactly once. The checkpoint
holds the query set (``QuerySet``: each query's text and epoch, the journal offset
it was added at) and the universe the engine's state is written in.

No device can write a control record: MQTT's wildcards never match a topic that
starts with ``$``, and an ``--input`` that names one is refused.
"""
from __future__ import annotations

import json
import os
import queue
import re
import threading
import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple
from pathlib import Path

import msgpack

from dqcep.core.errors import UserError
from dqcep.io.journal import SERVICE_TOPICS
from dqcep.lang import ast, parse
from dqcep.lang.printer import schema_to_source, table_to_source

CONTROL_TOPIC = SERVICE_TOPICS + "control"
CHANGE_WAIT = 60.0  # s a change request waits to be applied before it answers 202
_TRAILING_COMMENTS = re.compile(r"(?:\s*--[^\n]*)+\s*\Z")  # comments that end a text
_QUERY_KEYWORD = re.compile(r"QUERY\b", re.IGNORECASE)


# In the journal's folder: what the stream had admitted by each add's control record
ADMISSION = "admission"


@dataclass(frozen=True)
class Admission:
    """What decides whether a record's events are admitted, as the records before a
    control record left it: the largest ts that arrived, the explicit watermark and
    the recent event ids (repeats). The service's own engine goes on with it across
    a change; under ``--workers`` an added query's consumer starts at its control
    record, so a running consumer writes it down there and the new one starts from
    it: the same journal admits the same events on every path (spec section 7,
    "Admission": in arrival order, over the whole stream)."""

    max_seen: int | None
    wm: int | None
    recent: bytes  # int64 little-endian ids, oldest first
    # T(k) per timeline: [value kind, value (a string as itself: each consumer codes
    # strings its own way), T]
    timelines: list = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return msgpack.packb({"max_seen": self.max_seen, "wm": self.wm,
                              "recent": self.recent, "timelines": self.timelines})

    @classmethod
    def from_bytes(cls, data: bytes) -> "Admission":
        obj = msgpack.unpackb(data)
        return cls(obj["max_seen"], obj["wm"], obj["recent"], obj.get("timelines", []))


def admission_path(journal_dir: str | Path, offset: int) -> Path:
    return Path(journal_dir) / ADMISSION / f"{offset:020d}"


def write_admission(journal_dir: str | Path, offset: int, admission: Admission) -> None:
    """Written once per control record (every consumer that reaches it finds the same:
    the first one's stays)."""
    path = admission_path(journal_dir, offset)
    if path.exists():
        return
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(admission.to_bytes())
    os.replace(tmp, path)


def read_admission(journal_dir: str | Path, offset: int) -> Admission | None:
    try:
        return Admission.from_bytes(admission_path(journal_dir, offset).read_bytes())
    except FileNotFoundError:
        return None


def control_record(op: str, **fields) -> bytes:
    """The payload of a change: ``add`` (``text``: queries) or ``remove`` (``name``)."""
    return json.dumps({"op": op, **fields}, sort_keys=True).encode()


class ChangeRefused(Exception):
    """A change request refused before anything is journaled: the HTTP status and why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class Change(NamedTuple):
    """A change request checked: what is journaled and what applying it takes."""

    op: str                  # "add" | "remove"
    payload: bytes           # its control record
    names: list[str]         # the queries it names
    after: "QuerySet"        # the set after it (added queries at a placeholder epoch)
    added: list[ast.Query]   # the queries it adds, parsed (none for a remove)


def requested_change(method: str, path: str, body: bytes, query_set: "QuerySet") -> Change:
    """A change request (``POST /queries``, ``DELETE /queries/NAME``) checked against
    the set it applies to. What does not parse or plan, a name the set runs (or not),
    its last query, declarations of its own: ``ChangeRefused``. The text is parsed
    here once: ``QuerySet.after`` takes the queries, not the text again."""
    from dqcep.plan import build_plan
    if method == "POST" and path == "/queries":
        op = "add"
    elif method == "DELETE" and path.startswith("/queries/") and len(path) > 9:
        op = "remove"
    else:
        raise ChangeRefused(404, f"{method} {path}: changes are POST /queries and "
                                 "DELETE /queries/NAME")
    try:
        if op == "add":
            text, added = query_set.named(body.decode("utf-8"))
            new = query_set.with_added(added, 1, text)
            build_plan(new.queries, schemas=new.schemas, tables=new.tables)
            return Change(op, control_record("add", text=text), [q.name for q in added],
                          new, added)
        name = path[len("/queries/"):]
        return Change(op, control_record("remove", name=name), [name],
                      query_set.without(name), [])
    except UnicodeDecodeError:
        raise ChangeRefused(400, "the body is not UTF-8 text") from None
    except UserError as err:  # QueryError too: with its line and column
        raise ChangeRefused(404 if "runs no query" in str(err) else 400, str(err)) from None


class ChangeRequest:
    """A change from the HTTP side (``POST /queries``, ``DELETE /queries/NAME``) on its
    way to the thread that runs the queries, and its answer."""

    def __init__(self, method: str, path: str, body: bytes):
        self.method, self.path, self.body = method, path, body
        self.offset: int | None = None   # its control record's, once journaled
        self.op: str | None = None
        self.names: list[str] = []
        self.running: list[str] = []     # the set when it was journaled (for a 202)
        self.added: list[ast.Query] = []  # an add's queries, parsed once (QuerySet.after)
        self.reply: tuple[int, dict] | None = None
        self.answered = threading.Event()
        self.journaled = threading.Event()  # journaled, or answered without it
        self._lock = threading.Lock()
        self._taken = self._given_up = False

    def take(self) -> bool:
        """The runner takes it (False: the HTTP side gave up waiting first)."""
        with self._lock:
            self._taken = not self._given_up
            return self._taken

    def journaled_at(self, offset: int, change: Change, running: list[str]) -> None:
        self.offset, self.op, self.names, self.running = offset, change.op, change.names, \
            running
        self.added = change.added
        self.journaled.set()

    def answer(self, code: int, answer: dict) -> None:
        self.reply = (code, answer)
        self.journaled.set()
        self.answered.set()

    def applied(self, names: list[str], running: list[str]) -> None:
        """Answered once the set after it runs: ``running`` lists that set."""
        self.answer(200, {"op": self.op, "queries": names, "journal_offset": self.offset,
                          "applied": True, "running": running})

    def give_up(self) -> bool:
        """The HTTP side stops waiting; False: it had been taken (then it is or will
        be journaled)."""
        with self._lock:
            self._given_up = not self._taken
            return self._given_up


class ChangeMailbox:
    """Change requests from the HTTP side's threads to the one thread that runs the
    queries (the single service's, the coordinator's), as Flink's ``MailboxProcessor``
    runs control actions on the task thread: the runner checks each request against
    the set the changes before it lead to, journals it and applies it in its place in
    the journal; the HTTP thread waits for the answer, given once the set after the
    change runs (``running`` lists it). A request not taken in ``wait`` s is answered
    503 and never journaled; one journaled but not applied by then, 202."""

    def __init__(self, wait: float = CHANGE_WAIT):
        self.wait = wait
        self._mails: queue.SimpleQueue = queue.SimpleQueue()

    def request(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        """On an HTTP thread: the change, answered as (HTTP status, answer)."""
        req = ChangeRequest(method, path, body)
        self._mails.put(req)
        if req.answered.wait(self.wait):
            return req.reply
        if req.give_up():
            return 503, {"error": f"the service did not take the change within "
                                  f"{self.wait:g} s (it is retrying a failed write, or "
                                  "stopping); nothing was journaled"}
        if not req.journaled.wait(self.wait):
            return 503, {"error": f"the change was taken but not journaled within "
                                  f"{self.wait:g} s; GET /queries shows whether it runs"}
        if req.reply is not None:
            return req.reply
        return 202, {"op": req.op, "queries": req.names, "journal_offset": req.offset,
                     "applied": False, "running": req.running}

    def empty(self) -> bool:
        return self._mails.empty()

    def take(self) -> ChangeRequest | None:
        """On the runner's thread: the next request to handle (None: there is none)."""
        while True:
            try:
                req = self._mails.get_nowait()
            except queue.Empty:
                return None
            if req.take():
                return req


def read_control(payload: bytes) -> dict:
    change = json.loads(payload)
    if not isinstance(change, dict) or change.get("op") not in ("add", "remove"):
        raise ValueError(f"not a change: {payload[:80]!r}")
    return change


@dataclass
class QuerySet:
    """The queries a service runs, in the order they came, each with its epoch (0: of
    the query file the service started with; else the journal offset + 1 of the
    control record that added it), and the file's EVENT and TABLE declarations,
    which every query may use."""

    queries: list[ast.Query]
    epochs: dict[str, int] = field(default_factory=dict)
    schemas: tuple = ()
    tables: tuple = ()
    # per query added live: the text of the change that added it, parsed again as it
    # was (its plan, positions included, is then the same after a restart)
    texts: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [q.name for q in self.queries]

    @property
    def live_epochs(self) -> dict[str, int]:
        """The epochs of the queries added live (the planner's salt)."""
        return {n: e for n, e in self.epochs.items() if e}

    def declarations(self) -> str:
        return "".join(f"{schema_to_source(s)};\n" for s in self.schemas) + \
            "".join(f"{table_to_source(t)};\n" for t in self.tables)

    def parse_added(self, text: str, source: str = "<request>") -> list[ast.Query]:
        """The queries of a change's text (as journaled: every query named), checked
        against the set: parse errors with their line and column in ``text``; a name
        the set has, declarations of its own, or nothing to add, refused."""
        return self._checked(self._parse(text, source) if text.strip() else None, source)

    def _checked(self, added, source: str) -> list[ast.Query]:
        if added is None:
            raise UserError(f"{source}: no query to add")
        if len(added.schemas) != len(self.schemas) or len(added.tables) != len(self.tables):
            raise UserError(f"{source}: declare EVENT schemas and TABLEs in the service's "
                            "query file; a change adds queries only")
        clash = [q.name for q in added.queries if q.name in self.names]
        if clash:
            raise UserError(f"{source}: the service runs a query {clash[0]!r} already "
                            "(remove it first)")
        return list(added.queries)

    def named(self, text: str, source: str = "<request>") -> tuple[str, list[ast.Query]]:
        """A request's text with ``QUERY qK`` put before each query it leaves unnamed,
        K the first from the query's position in the text that neither the set nor the
        text names (a file's unnamed query ``k`` is ``qk``: a second unnamed query
        would clash with the service's ``q1``), and its queries checked as
        ``parse_added`` checks them. The journal holds this text, so a replay, a
        checkpoint and a worker read the names given here, whatever the set is then.
        The text is parsed once: the queries are those a parse of the named text gives
        (names, and positions moved past each ``QUERY qK``). Line numbers stay; parse
        errors are of ``text`` as sent."""
        if not text.strip():
            return text, self._checked(None, source)
        parsed = self._parse(text, source)
        queries = list(parsed.queries)
        lines = text.split("\n")
        unnamed = [k for k, q in enumerate(queries)
                   if not _QUERY_KEYWORD.match(lines[q.pos.line - 1], q.pos.col - 1)]
        auto = {queries[k].name for k in unnamed}
        taken = set(self.names) | {q.name for q in queries if q.name not in auto}
        names = {}
        for k in unnamed:
            j = k + 1
            while f"q{j}" in taken:
                j += 1
            taken.add(names.setdefault(k, f"q{j}"))
        for k in reversed(unnamed):  # from the end: a name put in moves what follows it
            pos, prefix = queries[k].pos, f"QUERY {names[k]} "
            line = lines[pos.line - 1]
            lines[pos.line - 1] = f"{line[:pos.col - 1]}{prefix}{line[pos.col - 1:]}"
            queries = [ast.shifted(q, pos.line, pos.col, len(prefix)) for q in queries]
            # (the query starts where it did: at its QUERY now)
            queries[k] = dataclasses.replace(queries[k], name=names[k], pos=pos)
        return "\n".join(lines), self._checked(dataclasses.replace(
            parsed, queries=tuple(queries)), source)

    def with_declarations(self, text: str) -> str:
        """A change's text with the service's declarations after it (its lines keep
        their numbers): what is parsed, and a worker's query file."""
        body = text.rstrip()
        # the last query's ";" on a line of its own: a text that ends in a comment
        # (``-- ...``) would take it into the comment and the declarations into its query
        code = _TRAILING_COMMENTS.sub("", body)
        return body + ("\n" if code.endswith(";") else "\n;\n") + self.declarations()

    def _parse(self, text: str, source: str):
        return parse(self.with_declarations(text), source)

    def with_added(self, queries: list[ast.Query], epoch: int, text: str) -> "QuerySet":
        return QuerySet(self.queries + queries,
                        {**self.epochs, **{q.name: epoch for q in queries}},
                        self.schemas, self.tables,
                        {**self.texts, **{q.name: text for q in queries}})

    def without(self, name: str) -> "QuerySet":
        if name not in self.names:
            raise UserError(f"the service runs no query {name!r} (its queries: "
                            f"{', '.join(self.names)})")
        if len(self.queries) == 1:
            raise UserError(f"{name} is the service's only query: a service runs at least "
                            "one (add another first)")
        return QuerySet([q for q in self.queries if q.name != name],
                        {n: e for n, e in self.epochs.items() if n != name},
                        self.schemas, self.tables,
                        {n: t for n, t in self.texts.items() if n != name})

    def after(self, change: dict, offset: int, added: list[ast.Query] | None = None
              ) -> tuple["QuerySet", list[str]]:
        """The set after the control record ``change`` at journal ``offset`` (the one
        rule of every path that applies one), and the queries it names; UserError
        when it cannot be applied to this set. ``added``: an add's queries as the
        request was parsed (``requested_change``; else its text is parsed here)."""
        if change["op"] == "add":
            added = self.parse_added(change["text"]) if added is None else \
                self._checked(ast.QueryFile("<request>", tuple(added), self.schemas,
                                            self.tables), "<request>")
            return self.with_added(added, offset + 1, change["text"]), \
                [q.name for q in added]
        return self.without(change["name"]), [change["name"]]

    # ----------------------------------------------------------- checkpoint
    def to_obj(self) -> list:
        """[name, epoch, the change's text or None (a query of the file)] per query."""
        return [[q.name, self.epochs.get(q.name, 0), self.texts.get(q.name)]
                for q in self.queries]

    @classmethod
    def from_obj(cls, obj, file_set: "QuerySet", source: str) -> "QuerySet":
        """The set a checkpoint holds: the file's queries taken from the file (by
        name), those added live parsed again from their changes' texts."""
        of_file = {q.name: q for q in file_set.queries}
        queries, epochs, texts = [], {}, {}
        for name, epoch, text in obj:
            if text is None:
                if name not in of_file:
                    raise UserError(f"{source}: the checkpoint's query set has {name!r} of "
                                    "the query file, which the file no longer holds")
                queries.append(of_file[name])
            else:
                queries.append(next(q for q in file_set._parse(text, "<request>").queries
                                    if q.name == name))
                texts[name] = text
            epochs[name] = epoch
        return cls(queries, epochs, file_set.schemas, file_set.tables, texts)
