"""Semantic checks on a parsed query (spec section 2, "Errors", and section 5).

Each check returns ``(message, pos)`` for the first problem, so the parser can
attach the source line; a query that fails any check is never registered.
"""
from __future__ import annotations

from dqcep.lang import ast

Problem = tuple[str, ast.Pos]

# Static kinds of expressions; "any" is an attribute whose type is known only at run time.
NUM, STR, BOOL, ANY = "number", "string", "boolean", "any"

_ARTICLE = {NUM: "a number", STR: "a string", BOOL: "a boolean"}


# The static kind of each declared attribute type.
_DECLARED_KIND = {ast.INT: NUM, ast.DOUBLE: NUM, ast.STRING: STR, ast.BOOL: BOOL}


def check_query(q: ast.Query, schemas: dict[str, ast.EventSchema] | None = None,
                tables: dict[str, ast.LookupTable] | None = None) -> Problem | None:
    """The first problem of a query, given the file's event schemas (by type) and
    lookup tables (by name)."""
    schemas, tables = schemas or {}, tables or {}
    types = {ev.var: ev.type for ev, _ in ast.event_patterns(q.pattern)}

    def attr_kind(var: str, attr: str) -> str:
        """The static kind of var.attr: its declared type's, else known at run time."""
        if attr in ("ts", "id"):
            return NUM
        schema = schemas.get(types.get(var, ""))
        declared = schema.attr_type(attr) if schema is not None else None
        return _DECLARED_KIND[declared] if declared is not None else ANY

    def kind_of(e: ast.AttrRef | ast.Lookup) -> str:
        if isinstance(e, ast.Lookup):  # checked to name a declared column
            return _DECLARED_KIND[tables[e.table].column_type(e.column)]
        return attr_kind(e.var, e.attr)
    return (_check_pattern(q.pattern)
            or _check_variables(q)
            or _check_kleene_refs(q)
            or _check_declared(q, schemas, types)
            or _check_lookups(q, tables, attr_kind)
            or (_check_condition(q.where, kind_of) if q.where is not None else None)
            or _check_strategy(q))


def _check_lookups(q: ast.Query, tables: dict[str, ast.LookupTable],
                   attr_kind) -> Problem | None:
    """A lookup names a declared table and one of its columns, by a key whose declared
    kind (if any) is the key column's."""
    lookups = [e for e in ast.walk_expr(q.where) if isinstance(e, ast.Lookup)] \
        if q.where is not None else []
    lookups += [r.lookup for r in q.returns if r.table is not None]
    for e in lookups:
        table = tables.get(e.table)
        shown = f"{e.table}({e.key.var}.{e.key.attr}).{e.column}"
        if table is None:
            known = (f"the file declares {', '.join(tables)}" if tables else
                     "declare it with TABLE name(column TYPE, ...) KEY column FROM 'url'")
            return (f"{shown}: unknown table {e.table!r}; {known}", e.pos)
        if table.column_type(e.column) is None:
            return (f"{shown}: table {e.table} has no column {e.column!r} (it has "
                    f"{', '.join(c.name for c in table.columns)}; line {table.pos.line})",
                    e.pos)
        key_kind = _DECLARED_KIND[table.key_type]
        if e.key.attr == "type":
            return (f"{e.key.var}.type: an event's type is set by the pattern, it is no "
                    "attribute", e.key.pos)
        got = attr_kind(e.key.var, e.key.attr)
        if got not in (ANY, key_kind):
            return (f"type mismatch: {e.table} is keyed by {table.key} {table.key_type}, "
                    f"{e.key.var}.{e.key.attr} is {_ARTICLE[got]}", e.key.pos)
    return None


def _check_declared(q: ast.Query, schemas: dict[str, ast.EventSchema],
                    types: dict[str, str]) -> Problem | None:
    """Every attribute a query reads of a declared event type is declared there (a
    misspelt one would otherwise make an empty result, not an error)."""
    def undeclared(var: str, attr: str | None, pos: ast.Pos, shown: str) -> Problem | None:
        schema = schemas.get(types.get(var, ""))
        if schema is None or attr is None or attr in ("ts", "id"):
            return None
        if schema.attr_type(attr) is None:
            names = ", ".join(a.name for a in schema.attrs)
            return (f"{shown}: {schema.type} declares no attribute {attr!r} (it declares "
                    f"{names}; line {schema.pos.line})", pos)
        return None
    negated = {ev.var for ev, neg in ast.event_patterns(q.pattern) if neg}
    for e in ast.walk_expr(q.where) if q.where is not None else ():
        problem = None
        if isinstance(e, ast.AttrRef):
            problem = undeclared(e.var, e.attr, e.pos, ast_text(e))
        elif isinstance(e, ast.Aggregate):
            problem = undeclared(e.var, e.attr, e.pos, ast_text(e)) or \
                _aggregated_kind(e, schemas, types)
        elif isinstance(e, ast.Equivalence):  # every bound positive variable
            for var in types:
                if var not in negated:
                    problem = problem or undeclared(var, e.attr, e.pos, f"[{e.attr}]")
        if problem:
            return problem
    for r in q.returns:
        problem = undeclared(r.var, r.attr, r.pos, f"RETURN {r.label}")
        if problem:
            return problem
    return None


def _aggregated_kind(e: ast.Aggregate, schemas: dict[str, ast.EventSchema],
                     types: dict[str, str]) -> Problem | None:
    """sum, avg, min and max read numbers: not a declared STRING or BOOL."""
    schema = schemas.get(types.get(e.var, ""))
    declared = schema.attr_type(e.attr) if schema is not None and e.attr else None
    if e.func != "count" and declared in (ast.STRING, ast.BOOL):
        return (f"type mismatch: {ast_text(e)} needs numbers, {e.var}.{e.attr} is "
                f"declared {declared}", e.pos)
    return None


def ast_text(e: ast.Expr) -> str:
    """An attribute reference or aggregate as written (for messages)."""
    if isinstance(e, ast.Aggregate):
        return f"{e.func}({e.var}{'.' + e.attr if e.attr else ''})"
    assert isinstance(e, ast.AttrRef)
    return f"{e.var}[{e.index}].{e.attr}" if e.index else f"{e.var}.{e.attr}"


def _check_pattern(node: ast.Item, parent: ast.Operator | None = None,
                   in_negation: bool = False) -> Problem | None:
    if isinstance(node, ast.Negation):
        if parent is None or parent.op == ast.OR:
            return ("NOT is allowed only as an item of SEQ or AND, not of OR", node.pos)
        if in_negation:
            return ("NOT inside a negated pattern is not supported", node.pos)
        if isinstance(node.pattern, ast.Kleene):
            return ("a Kleene item (Type+ v[]) cannot be negated", node.pos)
        return _check_pattern(node.pattern, None, True)
    if isinstance(node, ast.Kleene):
        if in_negation:
            return ("a Kleene item (Type+ v[]) cannot stand inside a negated pattern",
                    node.pos)
        if parent is None or parent.op != ast.SEQ:
            where = "on its own" if parent is None else f"in {parent.op}"
            return (f"a Kleene item (Type+ v[]) is allowed only as an item of SEQ, not "
                    f"{where}", node.pos)
        return None
    if isinstance(node, ast.Operator):
        if all(isinstance(i, ast.Negation) for i in node.items):
            return (f"{node.op} needs at least one item that is not negated", node.pos)
        for item in node.items:
            problem = _check_pattern(item, node, in_negation)
            if problem:
                return problem
    return None


def _check_variables(q: ast.Query) -> Problem | None:
    bound: dict[str, ast.EventPattern] = {}
    negated: set[str] = set()
    for ev, neg in ast.event_patterns(q.pattern):
        if ev.var in bound:
            first = bound[ev.var].pos
            return (f"variable {ev.var!r} is bound twice (first at line {first.line}, "
                    f"column {first.col})", ev.pos)
        bound[ev.var] = ev
        if neg:
            negated.add(ev.var)
    known = ", ".join(bound)
    if q.where is not None:
        for e in ast.walk_expr(q.where):
            if isinstance(e, ast.AttrRef) and e.var not in bound:
                return (f"unknown variable {e.var!r}; the pattern binds {known}", e.pos)
            if isinstance(e, ast.AttrRef) and e.attr == "type":
                return (f"{e.var}.type: an event's type is set by the pattern, it is no "
                        "attribute", e.pos)
            if isinstance(e, ast.Equivalence) and e.attr in ("ts", "id", "type"):
                return (f"[{e.attr}] is not supported: {e.attr} is the event's own field, "
                        f"not an attribute (compare it as a.{e.attr} = b.{e.attr})"
                        if e.attr != "type" else "[type]: an event's type is set by the "
                        "pattern, it is no attribute", e.pos)
    seen = set()
    kleene = ast.kleene_vars(q.pattern)
    for r in q.returns:
        if r.var not in bound:
            return (f"unknown variable {r.var!r} in RETURN; the pattern binds {known}", r.pos)
        if r.func is not None:
            problem = _check_aggregate(r.func, r.var, r.attr, kleene, r.pos)
            if problem:
                return problem
        elif r.var in kleene and r.attr is not None:
            return (f"RETURN {r.var}.{r.attr}: {r.var} is a Kleene variable (a list of "
                    f"events); return {r.var} (its ids) or an aggregate such as "
                    f"avg({r.var}.{r.attr})", r.pos)
        if r.var in negated:
            return (f"RETURN cannot name {r.var!r}: it is negated, so it is never bound",
                    r.pos)
        if r.attr == "type":
            return (f"{r.var}.type: an event's type is set by the pattern, it is no "
                    "attribute", r.pos)
        if r.label in seen:
            return (f"RETURN lists {r.label} twice", r.pos)
        seen.add(r.label)
    return None


def _check_aggregate(func: str, var: str, attr: str | None, kleene: frozenset[str],
                     pos: ast.Pos) -> Problem | None:
    if var not in kleene:
        return (f"{func}({var}{'.' + attr if attr else ''}): {var} is not a Kleene variable; "
                f"aggregates range over a list bound by Type+ {var}[]", pos)
    if func == "count" and attr is not None:
        return (f"count takes the variable: count({var})", pos)
    if func != "count" and attr is None:
        return (f"{func} needs an attribute: {func}({var}.attr)", pos)
    if attr == "type":
        return (f"{var}.type: an event's type is set by the pattern, it is no attribute", pos)
    return None


def _check_kleene_refs(q: ast.Query) -> Problem | None:
    """Indexes and aggregates name Kleene variables only (spec 5.1)."""
    if q.where is None:
        return None
    kleene = ast.kleene_vars(q.pattern)
    for e in ast.walk_expr(q.where):
        if isinstance(e, ast.AttrRef) and e.index is not None and e.var not in kleene:
            return (f"{e.var}[{e.index}].{e.attr}: {e.var} is not a Kleene variable "
                    f"(Type+ {e.var}[]); write {e.var}.{e.attr}", e.pos)
        if isinstance(e, ast.Aggregate):
            problem = _check_aggregate(e.func, e.var, e.attr, kleene, e.pos)
            if problem:
                return problem
    return None


def _check_strategy(q: ast.Query) -> Problem | None:
    """Strategies other than skip-till-any-match need one event or a flat SEQ (spec 5.2)."""
    if q.strategy == ast.ANY_MATCH:
        return None
    using = f"USING {q.strategy}"
    p = q.pattern
    if isinstance(p, ast.Operator):
        if p.op != ast.SEQ:
            return (f"{using} needs a single event or a SEQ of events, Kleene items and "
                    f"negations, not {p.op}", p.pos)
        for item in p.items:
            inner = item.pattern if isinstance(item, ast.Negation) else item
            for node, _ in ast.walk_patterns(inner):
                if isinstance(node, ast.Operator) and (node.op != ast.SEQ or inner is item):
                    what = "a nested SEQ" if node.op == ast.SEQ else node.op
                    return (f"{using} needs a single event or a SEQ of events, Kleene items "
                            f"and negations: {what} is not allowed in it", node.pos)
            if isinstance(item, ast.Negation) and q.strategy in (ast.STRICT, ast.PARTITION):
                return (f"NOT is not allowed under {using}: under contiguity nothing can "
                        "stand between a match's events", item.pos)
    if q.strategy == ast.PARTITION and not any(
            isinstance(c, ast.Equivalence) for c in ast.conjuncts(q.where)):
        return (f"{using} needs a top-level [attr] in WHERE: the attribute whose equal "
                "values form the partition", q.strategy_pos)
    return None


class _KindError(Exception):
    def __init__(self, message: str, pos: ast.Pos):
        self.problem = (message, pos)


def _check_condition(where: ast.Expr, attr_kind) -> Problem | None:
    try:
        kind = _kind(where, attr_kind)
    except _KindError as err:
        return err.problem
    if kind not in (BOOL, ANY):
        return (f"WHERE needs a boolean condition, this is {_ARTICLE[kind]}", where.pos)
    return None


def _expect(kind: str, allowed: tuple[str, ...], what: str, pos: ast.Pos) -> None:
    if kind != ANY and kind not in allowed:
        raise _KindError(f"type mismatch: {what}, got {_ARTICLE[kind]}", pos)


def _kind(e: ast.Expr, attr_kind) -> str:
    """Static kind of an expression, raising _KindError on a certain mismatch;
    ``attr_kind(e)`` gives an attribute reference's or a lookup's (ANY: known at run
    time)."""
    if isinstance(e, ast.Number):
        return NUM
    if isinstance(e, ast.String):
        return STR
    if isinstance(e, (ast.Boolean, ast.Equivalence)):
        return BOOL
    if isinstance(e, (ast.AttrRef, ast.Lookup)):
        return attr_kind(e)
    if isinstance(e, ast.Aggregate):
        return NUM
    if isinstance(e, ast.Unary):
        k = _kind(e.operand, attr_kind)
        if e.op == "-":
            _expect(k, (NUM,), "unary '-' needs a number", e.pos)
            return NUM
        _expect(k, (BOOL,), "NOT needs a boolean", e.pos)
        return BOOL
    assert isinstance(e, ast.Binary)
    lk, rk = _kind(e.left, attr_kind), _kind(e.right, attr_kind)
    if e.op in ast.ARITHMETIC:
        _expect(lk, (NUM,), f"'{e.op}' needs numbers", e.pos)
        _expect(rk, (NUM,), f"'{e.op}' needs numbers", e.pos)
        return NUM
    if e.op in ast.ORDERING:
        _expect(lk, (NUM,), f"'{e.op}' compares numbers only", e.pos)
        _expect(rk, (NUM,), f"'{e.op}' compares numbers only", e.pos)
        return BOOL
    if e.op in ast.EQUALITY:
        if ANY not in (lk, rk) and lk != rk:
            raise _KindError(f"type mismatch: '{e.op}' compares {_ARTICLE[lk]} with "
                             f"{_ARTICLE[rk]}", e.pos)
        return BOOL
    _expect(lk, (BOOL,), f"{e.op} needs booleans", e.pos)
    _expect(rk, (BOOL,), f"{e.op} needs booleans", e.pos)
    return BOOL


def never_seen(q: ast.Query, types: set[str], attrs: set[str]) -> list[Problem]:
    """The event types and attributes a query names that the input never held: a typo
    makes no error, only an empty result, so a run reports them at its end."""
    out: list[Problem] = []
    for ev, _ in ast.event_patterns(q.pattern):
        if ev.type not in types:
            out.append((f"type {ev.type!r} never appeared in the input", ev.pos))
    if q.where is not None:
        named = set()
        for e in ast.walk_expr(q.where):
            attr = e.attr if isinstance(e, (ast.AttrRef, ast.Equivalence)) else None
            if attr is not None and attr not in ("ts", "id") and attr not in attrs \
                    and attr not in named:
                named.add(attr)
                out.append((f"attribute {attr!r} never appeared in the input", e.pos))
    return out


def untied_negations(q: ast.Query, schemas: dict[str, ast.EventSchema] | None = None
                     ) -> list[Problem]:
    """The negated events an ``[attr]`` of the query does not reach: ``[attr]`` never
    constrains negated events (spec section 4), so ``WHERE [device]`` with ``NOT Door
    c`` lets a close of any door rule out every door's match. Written once per negated
    variable that no conjunct ``c.attr = x.attr`` (x positive) ties, at its position,
    when its events surely carry the attribute: its type is one the match binds too
    (the same kind of device), or its ``EVENT`` declaration names the attribute. A
    negated event of another kind (a weather station's rain) may well be meant for
    every partition."""
    if q.where is None:
        return []
    parts = ast.conjuncts(q.where)
    shared = [c.attr for c in parts if isinstance(c, ast.Equivalence)]
    if not shared:
        return []
    in_order = ast.positive_vars(q.pattern)
    positive = set(in_order)
    ties = set()  # (negated var, attr) tied to a positive variable by equality
    for c in parts:
        if isinstance(c, ast.Binary) and c.op == "=" and isinstance(c.left, ast.AttrRef) \
                and isinstance(c.right, ast.AttrRef) and c.left.attr == c.right.attr:
            for a, b in ((c.left, c.right), (c.right, c.left)):
                if b.var in positive and a.var not in positive:
                    ties.add((a.var, a.attr))
    bound_types = {e.type for e, negated in ast.event_patterns(q.pattern) if not negated}
    out: list[Problem] = []
    for leaf, negated in ast.event_patterns(q.pattern):
        if not negated:
            continue
        declared = (schemas or {}).get(leaf.type)
        for attr in shared:
            if (leaf.var, attr) in ties or not (
                    leaf.type in bound_types or
                    (declared is not None and declared.attr_type(attr) is not None)):
                continue
            x = in_order[0] if in_order else "x"
            out.append((f"warning: query {q.name}: [{attr}] does not reach the negated "
                        f"{leaf.type} {leaf.var}: a {leaf.type} of any {attr} rules a match "
                        f"out; to tie it, add {leaf.var}.{attr} = {x}.{attr}", leaf.pos))
    return out
