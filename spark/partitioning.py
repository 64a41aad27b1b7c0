"""How a query file is split over partitions so that no match is lost or found twice.

Two strategies, chosen per query:

- **Keyed.** A query whose positive variables all carry one equivalence key —
  ``[attr]`` as a conjunct of its own, or equality conjuncts ``x.a = y.b``
  linking every positive variable — is partitioned by the key's value. An
  event goes to the partition of its key value for every role its type plays
  (type T, key attribute a). A negated variable is keyed too when an equality
  conjunct ties it to the key; otherwise ``[attr]`` does not constrain it
  (spec section 4) and its events go to every partition (broadcast).
- **Time slices** (the parallel-CEP thesis, chapter 3): the other queries split
  event time into slices of length L; slice i holds the events with
  iL - W <= ts < (i+1)L + W (W the largest window of those queries), so every
  event a match or its negations may look at, within [start - W, start + W],
  is in the slice of the match's start.

A query with an after-match policy (spec section 6) decides each match against the
others of its policy partition (the values of its top-level ``[attr]``s), so all of
them must be in one partition: it is keyed only by a top-level ``[attr]`` (not by
an equality conjunct), and a query without one is **not split** (``whole``: every
event of its types goes to the one part of the group, which owns every match).

Either way a partition may see a match that belongs to another one (a
broadcast event, an overlap); each match has exactly one **owner** — the
partition of its first variable's key value, or the slice holding its start —
and only the owner emits it.

Selection strategies (spec 5.2) decide a match by the events between its events,
so a partition must see every event that can lie between them:
skip-till-next-match reads only events that could fit a slot (the query's types,
with its key), so it is partitioned as above; partition-contiguity counts every
event, of any type, that carries the [attr] value, so it is keyed by that [attr]
and every event carrying it goes to its key's partition (``every_type``);
strict-contiguity counts every event, so it is always time-sliced, and its
slices take events of every type. A Kleene item is one more positive variable:
its elements carry the key, and a match's owner reads its first element.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dqcep.lang import ast

BROADCAST = ""  # a role without a key: the event goes to every partition


@dataclass(frozen=True)
class KeyedQuery:
    name: str
    keys: tuple[tuple[str, str], ...]   # (positive variable, its key attribute), in order
    roles: tuple[tuple[str, str], ...]  # (event type, key attribute or BROADCAST)
    # the owner of a match: the partition of the key value of its first bound variable
    every_type: str | None = None       # partition-contiguity: events of every type
                                        # carrying this attribute go to its partition


@dataclass(frozen=True)
class Partitioning:
    keyed: tuple[KeyedQuery, ...] = ()
    sliced: tuple[str, ...] = ()          # names of the time-sliced queries
    slice_window: int = 0                 # W: the largest window of the sliced queries
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)  # keyed: type -> attrs
    every_type_attrs: tuple[str, ...] = ()  # keyed: events of any type with one go by it
    sliced_every_type: bool = False       # the slices take events of every type
    whole: tuple[str, ...] = ()           # queries not split (a policy without [attr])

    def describe(self) -> dict:
        """Per query, how it is partitioned: ``{"keyed": {type: attribute or null (to
        every partition); "*": attribute, where events of every type carrying it go by
        it}}`` or ``{"time slices": {"overlap_ms": W}}``."""
        out: dict = {k.name: {"keyed": {t: a for t, a in k.roles}} for k in self.keyed}
        for k in self.keyed:
            if k.every_type:  # partition-contiguity: any other type carrying the attribute
                out[k.name]["keyed"]["*"] = k.every_type
        for name in self.sliced:
            out[name] = {"time slices": {"overlap_ms": self.slice_window}}
        for name in self.whole:
            out[name] = {"not split": "an after-match policy without [attr]"}
        return out


def _maybe_unbound(node: ast.Item, under_or: bool = False) -> set[str]:
    """Positive variables that a match may leave unbound (inside an OR branch)."""
    if isinstance(node, (ast.EventPattern, ast.Kleene)):
        return {node.var} if under_or else set()
    if isinstance(node, ast.Negation):
        return set()
    out: set[str] = set()
    for item in node.items:
        out |= _maybe_unbound(item, under_or or node.op == "OR")
    return out


class _UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


def query_key(q: ast.Query) -> KeyedQuery | None:
    """The query's equivalence key, or None when it has none (time slices then).

    Only conjuncts between positive variables that every match binds can make
    the key (a conjunct that names a negated variable constrains the negated
    event, not the match); negated variables are then tied to the key by the
    conjuncts that name them.
    """
    leaves = ast.event_patterns(q.pattern)
    types = {e.var: e.type for e, _ in leaves}
    positive = [e.var for e, neg in leaves if not neg]
    if q.strategy == ast.STRICT:
        return None  # every event may lie between: time slices of every type
    if q.strategy == ast.PARTITION:  # the partition is its first top-level [attr]
        attr = next(c.attr for c in ast.conjuncts(q.where) if isinstance(c, ast.Equivalence))
        roles = tuple(dict.fromkeys((types[v], attr) for v in positive))
        return KeyedQuery(q.name, tuple((v, attr) for v in positive), roles, every_type=attr)
    negated = [e.var for e, neg in leaves if neg]
    unbound = _maybe_unbound(q.pattern)
    uf = _UnionFind()
    anchors = []  # a node of each key candidate
    ties = []     # equalities that name a negated variable
    for c in ast.conjuncts(q.where):
        if isinstance(c, ast.Equivalence):
            for v in positive:
                uf.union((v, c.attr), (positive[0], c.attr))
            anchors.append((positive[0], c.attr))
        elif isinstance(c, ast.Binary) and c.op == "=" and \
                isinstance(c.left, ast.AttrRef) and isinstance(c.right, ast.AttrRef):
            a, b = c.left, c.right
            if a.var == b.var or {a.attr, b.attr} & {"ts", "id"} or {a.var, b.var} & unbound:
                continue  # not a key: one event, or a conjunct that may be ignored
            if a.var in negated or b.var in negated:
                ties.append(((a.var, a.attr), (b.var, b.attr)))
                continue
            uf.union((a.var, a.attr), (b.var, b.attr))
            if q.after_match is None:  # a policy's partition is its [attr]s': no other key
                anchors.append((a.var, a.attr))
    nodes = list(uf.parent)
    for anchor in anchors:
        root = uf.find(anchor)
        members = {n for n in nodes if uf.find(n) == root}
        attr_of = {}
        for var, attr in sorted(members, key=nodes.index):
            attr_of.setdefault(var, attr)
        if not all(v in attr_of for v in positive):
            continue
        grown = True
        while grown:  # a negated variable equal to a key node is keyed too
            grown = False
            for x, y in ties:
                for (u, a), other in ((x, y), (y, x)):
                    if other in members and u in negated and (u, a) not in members:
                        members.add((u, a))
                        attr_of.setdefault(u, a)
                        grown = True
        roles = []
        for v in positive + negated:
            role = (types[v], attr_of.get(v, BROADCAST))
            if role not in roles:
                roles.append(role)
        return KeyedQuery(q.name, tuple((v, attr_of[v]) for v in positive), tuple(roles))
    return None


def plan_partitioning(queries, strategy: str = "auto") -> Partitioning:
    """Keyed where a query has a key (``strategy="auto"``), else time slices;
    ``strategy="time"`` slices every query (for tests and comparisons) but those with
    an after-match policy, which are keyed by their [attr] or not split."""
    if strategy not in ("auto", "time"):
        raise ValueError(f"unknown partitioning strategy {strategy!r}")
    keyed, sliced, window, every_type, whole = [], [], 0, False, []
    for q in queries:
        k = query_key(q) if strategy == "auto" or q.after_match is not None else None
        if k is None and q.after_match is not None:
            whole.append(q.name)
        elif k is None:
            sliced.append(q.name)
            window = max(window, q.within.ms)
            every_type |= q.strategy in (ast.STRICT, ast.PARTITION)
        else:
            keyed.append(k)
    roles: dict[str, list[str]] = {}
    for k in keyed:
        for t, a in k.roles:
            if a not in roles.setdefault(t, []):
                roles[t].append(a)
    every_type_attrs = tuple(dict.fromkeys(k.every_type for k in keyed if k.every_type))
    return Partitioning(tuple(keyed), tuple(sliced), window,
                        {t: tuple(a) for t, a in roles.items()}, every_type_attrs, every_type,
                        tuple(whole))
