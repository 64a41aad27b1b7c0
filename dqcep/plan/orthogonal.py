"""The query DAG as an orthogonal list (DQCEP paper, section III.C.b).

A vertex table and an arc table, both as compact numpy arrays:

- vertex ``v``: ``kind[v]`` (the operator, or EVENT for a basic event type),
  ``first_in[v]`` / ``first_out[v]``: heads of its in-arc and out-arc lists;
- arc ``a``: ``tail[a]`` -> ``head[a]`` (data flows from the tail, a child, to
  the head, a parent), ``port[a]`` (which input of the head it feeds: LEFT,
  RIGHT, GUARD or CHILD), ``tlink[a]``: next arc with the same tail,
  ``hlink[a]``: next arc with the same head. -1 ends a list.

``OrthogonalList.vertex(v)`` exposes the paper's six domains (node, data,
lchild, lchild_data, rchild, rchild_data) plus the parents.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Iterator

import numpy as np


class Kind(IntEnum):
    EVENT = 0   # a basic event type (leaf)
    SEQ = 1
    AND = 2
    OR = 3
    NOT = 4     # unary guard: its child is the negated pattern
    OUTPUT = 5  # one per query: emits the root's results as complex events
    KLEENE = 6  # unary iteration: the lists of its child's events (Type+ v[], spec 5.1)
    RUN = 7     # a flat SEQ under a selection strategy, as runs over the stream (spec 5.2)


class Port(IntEnum):
    LEFT = 0    # the tail's results go to the head's left input queue
    RIGHT = 1   # ... right input queue
    GUARD = 2   # the tail is a NOT guard checked at the head
    CHILD = 3   # the single input of a NOT, KLEENE or OUTPUT vertex


NIL = -1


@dataclass(frozen=True)
class VertexView:
    """One vertex with the paper's six domains and its parents."""

    node: int                          # sequence number of the vertex
    data: str                          # the operator (or "EVENT <type>")
    lchild: int                        # left child vertex, -1 if none
    lchild_data: tuple[str, ...]       # layout of the left input queue's records (slots)
    rchild: int                        # right child vertex, -1 if none
    rchild_data: tuple[str, ...]       # layout of the right input queue's records
    parents: tuple[int, ...]           # heads of the out-arcs, one per parent input
    guards: tuple[int, ...]            # NOT vertices checked here


class OrthogonalList:
    """Append-only while building; ``freeze()`` turns the lists into numpy arrays."""

    def __init__(self) -> None:
        self._kind: list[int] = []
        self._first_in: list[int] = []
        self._first_out: list[int] = []
        self._tail: list[int] = []
        self._head: list[int] = []
        self._port: list[int] = []
        self._tlink: list[int] = []
        self._hlink: list[int] = []
        self.frozen = False

    # building -------------------------------------------------------------
    def add_vertex(self, kind: Kind) -> int:
        assert not self.frozen
        self._kind.append(int(kind))
        self._first_in.append(NIL)
        self._first_out.append(NIL)
        return len(self._kind) - 1

    def add_arc(self, tail: int, head: int, port: Port) -> int:
        """Insert the arc at the front of tail's out-list and head's in-list."""
        assert not self.frozen
        a = len(self._tail)
        self._tail.append(tail)
        self._head.append(head)
        self._port.append(int(port))
        self._tlink.append(self._first_out[tail])
        self._hlink.append(self._first_in[head])
        self._first_out[tail] = a
        self._first_in[head] = a
        return a

    def freeze(self) -> None:
        self.kind = np.asarray(self._kind, dtype=np.int8)
        self.first_in = np.asarray(self._first_in, dtype=np.int32)
        self.first_out = np.asarray(self._first_out, dtype=np.int32)
        self.tail = np.asarray(self._tail, dtype=np.int32)
        self.head = np.asarray(self._head, dtype=np.int32)
        self.port = np.asarray(self._port, dtype=np.int8)
        self.tlink = np.asarray(self._tlink, dtype=np.int32)
        self.hlink = np.asarray(self._hlink, dtype=np.int32)
        for name in ("_kind", "_first_in", "_first_out", "_tail", "_head", "_port",
                     "_tlink", "_hlink"):
            delattr(self, name)
        for arr in (self.kind, self.first_in, self.first_out, self.tail, self.head,
                    self.port, self.tlink, self.hlink):
            arr.setflags(write=False)
        self.frozen = True
        self.topo = self._topological_order()

    # reading --------------------------------------------------------------
    @property
    def n_vertices(self) -> int:
        return len(self.kind) if self.frozen else len(self._kind)

    @property
    def n_arcs(self) -> int:
        return len(self.tail) if self.frozen else len(self._tail)

    def in_arcs(self, v: int) -> Iterator[int]:
        a = int(self.first_in[v])
        while a != NIL:
            yield a
            a = int(self.hlink[a])

    def out_arcs(self, v: int) -> Iterator[int]:
        a = int(self.first_out[v])
        while a != NIL:
            yield a
            a = int(self.tlink[a])

    def child(self, v: int, port: Port) -> int:
        for a in self.in_arcs(v):
            if self.port[a] == port:
                return int(self.tail[a])
        return NIL

    def parents(self, v: int) -> tuple[int, ...]:
        return tuple(sorted(int(self.head[a]) for a in self.out_arcs(v)))

    def guards(self, v: int) -> tuple[int, ...]:
        return tuple(sorted(int(self.tail[a]) for a in self.in_arcs(v)
                            if self.port[a] == Port.GUARD))

    def _topological_order(self) -> np.ndarray:
        """Children before parents (Kahn's algorithm over the arc table)."""
        indegree = np.zeros(self.n_vertices, dtype=np.int32)
        np.add.at(indegree, self.head, 1)
        ready = [v for v in range(self.n_vertices) if indegree[v] == 0]
        order = []
        while ready:
            v = ready.pop(0)
            order.append(v)
            for a in self.out_arcs(v):
                h = int(self.head[a])
                indegree[h] -= 1
                if indegree[h] == 0:
                    ready.append(h)
        if len(order) != self.n_vertices:
            raise AssertionError("the query graph has a cycle")
        out = np.asarray(order, dtype=np.int32)
        out.setflags(write=False)
        return out

    def check_invariants(self) -> None:
        """Every arc is in exactly one out-list (its tail's) and one in-list (its head's)."""
        seen_out = np.zeros(self.n_arcs, dtype=np.int32)
        seen_in = np.zeros(self.n_arcs, dtype=np.int32)
        for v in range(self.n_vertices):
            for a in self.out_arcs(v):
                assert self.tail[a] == v, f"arc {a} in the out-list of {v} has tail {self.tail[a]}"
                seen_out[a] += 1
            for a in self.in_arcs(v):
                assert self.head[a] == v, f"arc {a} in the in-list of {v} has head {self.head[a]}"
                seen_in[a] += 1
        bad = np.flatnonzero((seen_out != 1) | (seen_in != 1))
        assert bad.size == 0, f"arcs not in exactly one out-list and one in-list: {bad.tolist()}"
        position = {int(v): i for i, v in enumerate(self.topo)}
        for a in range(self.n_arcs):
            assert position[int(self.tail[a])] < position[int(self.head[a])], \
                f"arc {a} goes against the topological order"
