"""Abstract syntax of the query language.

Every node is a frozen dataclass that carries its source position (``pos``);
positions are excluded from equality, so two parses of the same query in
different layouts compare equal. The AST is what the parser produces and what
the planner and the reference matcher read; nothing here evaluates anything.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterator, Union


@dataclass(frozen=True)
class Pos:
    """1-based line and column in the query source."""

    line: int
    col: int


NOPOS = Pos(0, 0)


def _pos() -> Pos:
    return field(default=NOPOS, compare=False, repr=False)


# ---------------------------------------------------------------- patterns


@dataclass(frozen=True)
class EventPattern:
    """``Type var``: binds one event of ``type`` to ``var``."""

    type: str
    var: str
    pos: Pos = _pos()


@dataclass(frozen=True)
class Kleene:
    """``Type+ var[]`` (a SEQ item): binds a non-empty list of events of ``type`` with
    strictly increasing ts to ``var`` (spec section 5.1)."""

    type: str
    var: str
    pos: Pos = _pos()


@dataclass(frozen=True)
class Operator:
    """``SEQ|AND|OR(item, item, ...)``; items are patterns or negations."""

    op: str  # "SEQ" | "AND" | "OR"
    items: tuple["Item", ...]
    pos: Pos = _pos()


@dataclass(frozen=True)
class Negation:
    """``NOT Type var`` or ``NOT (pattern)`` inside a SEQ or AND."""

    pattern: "Pattern"
    pos: Pos = _pos()


Pattern = Union[EventPattern, Operator]
Item = Union[EventPattern, Kleene, Operator, Negation]
Leaf = Union[EventPattern, Kleene]

SEQ, AND, OR = "SEQ", "AND", "OR"


# ------------------------------------------------------------- expressions


# Element references of a Kleene variable (spec 5.1): v[i].attr (each element, as plain
# v.attr), v[i-1].attr (the element before it), v[1].attr (the first), v[last].attr
INDEX_EACH, INDEX_PREVIOUS, INDEX_FIRST, INDEX_LAST = "i", "i-1", "1", "last"
INDEXES = (INDEX_EACH, INDEX_PREVIOUS, INDEX_FIRST, INDEX_LAST)


@dataclass(frozen=True)
class AttrRef:
    """``var.attr``; ``var.ts`` and ``var.id`` read the event's time and id.
    ``index`` (one of INDEXES) is set for ``var[index].attr``."""

    var: str
    attr: str
    pos: Pos = _pos()
    index: str | None = None


AGGREGATES = ("count", "sum", "avg", "min", "max")


@dataclass(frozen=True)
class Aggregate:
    """``count(v)`` or ``sum|avg|min|max(v.attr)`` over a Kleene variable's whole list."""

    func: str  # one of AGGREGATES
    var: str
    attr: str | None  # None for count(v)
    pos: Pos = _pos()


@dataclass(frozen=True)
class Lookup:
    """``table(var.attr).column``: the column of the lookup table's row whose key is the
    event's attribute (the Select operator); no row, or NULL there, reads as missing."""

    table: str
    key: AttrRef
    column: str
    pos: Pos = _pos()


def lookup_attribute(table: str, key: str, column: str) -> str:
    """The name of the attribute a lookup is read as once planned (dqcep.plan.lookups):
    ``table(key).column``, which no attribute of the language can be named."""
    return f"{table}({key}).{column}"


def attribute_lookup(attr: str) -> tuple[str, str, str] | None:
    """(table, key, column) of a ``lookup_attribute`` name; None for a plain one."""
    if "(" not in attr:
        return None
    table, rest = attr.split("(", 1)
    key, column = rest.split(").", 1)
    return table, key, column


@dataclass(frozen=True)
class Number:
    value: int | float
    pos: Pos = _pos()


@dataclass(frozen=True)
class String:
    value: str
    pos: Pos = _pos()


@dataclass(frozen=True)
class Boolean:
    value: bool
    pos: Pos = _pos()


@dataclass(frozen=True)
class Equivalence:
    """``[attr]``: every bound positive variable has the same value of attr."""

    attr: str
    pos: Pos = _pos()


@dataclass(frozen=True)
class Unary:
    op: str  # "-" | "NOT"
    operand: "Expr"
    pos: Pos = _pos()


@dataclass(frozen=True)
class Binary:
    op: str  # + - * /  = != < <= > >=  AND OR
    left: "Expr"
    right: "Expr"
    pos: Pos = _pos()


Expr = Union[AttrRef, Aggregate, Lookup, Number, String, Boolean, Equivalence, Unary, Binary]

ARITHMETIC = ("+", "-", "*", "/")
ORDERING = ("<", "<=", ">", ">=")
EQUALITY = ("=", "!=")
COMPARISONS = EQUALITY + ORDERING
LOGICAL = ("AND", "OR")


# ----------------------------------------------------------------- queries

UNIT_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000}


@dataclass(frozen=True)
class Within:
    amount: int
    unit: str  # "ms" | "s" | "min" | "h" (lower case)
    pos: Pos = _pos()

    @property
    def ms(self) -> int:
        return self.amount * UNIT_MS[self.unit]


@dataclass(frozen=True)
class ReturnItem:
    """``v``, ``v.attr``, ``table(v.attr).column`` (a lookup: ``table`` and ``column``
    set) or, for a Kleene variable, ``count(v)`` / ``sum(v.attr)`` ..."""

    var: str
    attr: str | None
    pos: Pos = _pos()
    func: str | None = None  # an aggregate (one of AGGREGATES)
    table: str | None = None   # a lookup: the table ...
    column: str | None = None  # ... and the column read at the key v.attr

    @property
    def label(self) -> str:
        """The key of this value in a match's ``return`` object."""
        ref = self.var + (f".{self.attr}" if self.attr else "")
        if self.table is not None:
            return f"{self.table}({ref}).{self.column}"
        return f"{self.func}({ref})" if self.func else ref

    @property
    def lookup(self) -> Lookup | None:
        """A lookup item as the expression it reads."""
        if self.table is None:
            return None
        return Lookup(self.table, AttrRef(self.var, self.attr, self.pos), self.column, self.pos)


# Selection strategies (spec 5.2); each is a filter on the skip-till-any-match result
ANY_MATCH, NEXT_MATCH = "skip-till-any-match", "skip-till-next-match"
STRICT, PARTITION = "strict-contiguity", "partition-contiguity"
STRATEGIES = (ANY_MATCH, NEXT_MATCH, STRICT, PARTITION)


@dataclass(frozen=True)
class Query:
    name: str
    pattern: Pattern
    where: Expr | None
    within: Within
    returns: tuple[ReturnItem, ...] = ()
    pos: Pos = _pos()
    strategy: str = ANY_MATCH
    strategy_pos: Pos = _pos()
    after_match: str | None = None  # SKIP_PAST_LAST / SKIP_TO_NEXT (spec section 6)
    after_match_pos: Pos = _pos()


# After-match policies (spec section 6): a filter on a query's matches, per partition.
SKIP_PAST_LAST = "SKIP PAST LAST EVENT"
SKIP_TO_NEXT = "SKIP TO NEXT EVENT"
POLICIES = (SKIP_PAST_LAST, SKIP_TO_NEXT)


# Declared attribute types (``EVENT Type(attr TYPE, ...)``) and the value kinds they take.
INT, DOUBLE, STRING, BOOL = "INT", "DOUBLE", "STRING", "BOOL"
ATTRIBUTE_TYPES = (INT, DOUBLE, STRING, BOOL)


@dataclass(frozen=True)
class SchemaAttr:
    """``attr TYPE`` in an event schema."""

    name: str
    type: str  # one of ATTRIBUTE_TYPES
    pos: Pos = _pos()


@dataclass(frozen=True)
class EventSchema:
    """``EVENT Type(attr TYPE, ...)``: the attributes events of ``type`` carry and their
    types. A type without a schema stays schemaless."""

    type: str
    attrs: tuple[SchemaAttr, ...]
    pos: Pos = _pos()

    def attr_type(self, name: str) -> str | None:
        """The declared type of an attribute (None: not declared)."""
        for a in self.attrs:
            if a.name == name:
                return a.type
        return None


@dataclass(frozen=True)
class LookupTable:
    """``TABLE name(column TYPE, ...) KEY column FROM 'url' [REFRESH n unit]``: a
    database table the queries read rows of by key (``name(v.attr).column``). The
    URL's ``?table=`` names the table in the database (default: ``name``)."""

    name: str
    columns: tuple[SchemaAttr, ...]
    key: str
    url: str
    refresh: Within | None = None  # how often it is read again (None: the default)
    pos: Pos = _pos()

    def column_type(self, name: str) -> str | None:
        return next((c.type for c in self.columns if c.name == name), None)

    @property
    def key_type(self) -> str:
        return self.column_type(self.key)


@dataclass(frozen=True)
class QueryFile:
    source: str  # file name used in messages
    queries: tuple[Query, ...]
    schemas: tuple[EventSchema, ...] = ()
    tables: tuple[LookupTable, ...] = ()

    def schema_of(self, event_type: str) -> EventSchema | None:
        return next((s for s in self.schemas if s.type == event_type), None)

    def table(self, name: str) -> LookupTable | None:
        return next((t for t in self.tables if t.name == name), None)


# ---------------------------------------------------------------- helpers


def walk_patterns(node: Item, negated: bool = False) -> Iterator[tuple[Item, bool]]:
    """Yield (node, under_negation) for a pattern and all its descendants."""
    yield node, negated
    if isinstance(node, Negation):
        yield from walk_patterns(node.pattern, True)
    elif isinstance(node, Operator):
        for item in node.items:
            yield from walk_patterns(item, negated)


def event_patterns(node: Item) -> list[tuple[Leaf, bool]]:
    """All ``Type var`` and ``Type+ var[]`` leaves in source order, each with whether it
    is negated."""
    return [(n, neg) for n, neg in walk_patterns(node) if isinstance(n, (EventPattern, Kleene))]


def kleene_vars(node: Item) -> frozenset[str]:
    """The variables of the pattern's Kleene items."""
    return frozenset(n.var for n, _ in walk_patterns(node) if isinstance(n, Kleene))


def positive_vars(node: Item) -> list[str]:
    return [e.var for e, neg in event_patterns(node) if not neg]


def walk_expr(expr: Expr) -> Iterator[Expr]:
    yield expr
    if isinstance(expr, Lookup):  # its key is an attribute reference of its own
        yield expr.key
    elif isinstance(expr, Unary):
        yield from walk_expr(expr.operand)
    elif isinstance(expr, Binary):
        yield from walk_expr(expr.left)
        yield from walk_expr(expr.right)


def expr_vars(expr: Expr) -> frozenset[str]:
    """Variables a condition names (through ``var.attr`` and aggregates; ``[attr]``
    names none)."""
    return frozenset(e.var for e in walk_expr(expr) if isinstance(e, (AttrRef, Aggregate)))


def has_equivalence(expr: Expr) -> bool:
    return any(isinstance(e, Equivalence) for e in walk_expr(expr))


def conjuncts(expr: Expr | None) -> list[Expr]:
    """Split a condition at every AND that is not under an OR or NOT (spec 4).

    Parentheses leave no trace in the AST, so ``(a AND b) AND c`` and
    ``a AND (b AND c)`` both give ``[a, b, c]``.
    """
    if expr is None:
        return []
    if isinstance(expr, Binary) and expr.op == "AND":
        return conjuncts(expr.left) + conjuncts(expr.right)
    return [expr]


def shifted(node, line: int, col: int, by: int):
    """``node`` with every position on ``line`` at or after ``col`` moved ``by``
    columns right: the AST a parse gives once ``by`` characters are put before column
    ``col`` of that line (a query named in its text, ``QUERY qK`` before it)."""
    def move(x):
        if isinstance(x, tuple):
            return tuple(move(y) for y in x)
        if not dataclasses.is_dataclass(x) or isinstance(x, Pos):
            return x
        changes = {}
        for f in dataclasses.fields(x):
            value = getattr(x, f.name)
            if isinstance(value, Pos):
                if value.line == line and value.col >= col:
                    changes[f.name] = Pos(line, value.col + by)
            else:
                new = move(value)
                if new is not value:
                    changes[f.name] = new
        return dataclasses.replace(x, **changes) if changes else x
    return move(node)
