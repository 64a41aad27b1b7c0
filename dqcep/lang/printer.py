"""AST -> query text. ``parse(to_source(q))`` gives back an equal AST."""
from __future__ import annotations

from decimal import Decimal

from dqcep.lang import ast

# Binding strength, weakest first; mirrors the grammar's rule nesting.
_PREC = {"OR": 1, "AND": 2, "NOT": 3, "=": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6}
_UNARY_MINUS, _ATOM = 7, 8


def _prec(e: ast.Expr) -> int:
    if isinstance(e, ast.Binary):
        return _PREC[e.op]
    if isinstance(e, ast.Unary):
        return _PREC["NOT"] if e.op == "NOT" else _UNARY_MINUS
    return _ATOM


def format_number(value: int | float) -> str:
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"not a number literal of the language: {value!r}")
    if isinstance(value, int):
        return str(value)
    text = f"{Decimal(repr(value)):f}"  # positional, shortest round-trip digits
    return text if "." in text else text + ".0"


def format_expr(e: ast.Expr) -> str:
    if isinstance(e, ast.AttrRef):
        ref = f"{e.var}[{e.index}]" if e.index else e.var
        lookup = ast.attribute_lookup(e.attr)  # a planned lookup: shown as written
        if lookup is not None:
            return f"{lookup[0]}({ref}.{lookup[1]}).{lookup[2]}"
        return f"{ref}.{e.attr}"
    if isinstance(e, ast.Aggregate):
        return f"{e.func}({e.var}{'.' + e.attr if e.attr else ''})"
    if isinstance(e, ast.Lookup):
        return f"{e.table}({format_expr(e.key)}).{e.column}"
    if isinstance(e, ast.Number):
        return format_number(e.value)
    if isinstance(e, ast.String):
        return "'" + e.value.replace("'", "''") + "'"
    if isinstance(e, ast.Boolean):
        return "true" if e.value else "false"
    if isinstance(e, ast.Equivalence):
        return f"[{e.attr}]"
    if isinstance(e, ast.Unary):
        inner = format_expr(e.operand)
        # "--" would start a comment, so a minus never directly follows another
        if _prec(e.operand) < _prec(e) or (e.op == "-" and inner.startswith("-")):
            inner = f"({inner})"
        return f"NOT {inner}" if e.op == "NOT" else f"-{inner}"
    assert isinstance(e, ast.Binary)
    p = _PREC[e.op]
    left, right = format_expr(e.left), format_expr(e.right)
    # Comparisons do not chain; everything else is left-associative.
    if _prec(e.left) < p or (p == 4 and _prec(e.left) == 4):
        left = f"({left})"
    if _prec(e.right) <= p:
        right = f"({right})"
    return f"{left} {e.op} {right}"


def format_pattern(p: ast.Item) -> str:
    if isinstance(p, ast.EventPattern):
        return f"{p.type} {p.var}"
    if isinstance(p, ast.Kleene):
        return f"{p.type}+ {p.var}[]"
    if isinstance(p, ast.Negation):
        if isinstance(p.pattern, (ast.EventPattern, ast.Kleene)):
            return f"NOT {format_pattern(p.pattern)}"
        return f"NOT ({format_pattern(p.pattern)})"
    return f"{p.op}(" + ", ".join(format_pattern(i) for i in p.items) + ")"


def to_source(q: ast.Query) -> str:
    lines = [f"QUERY {q.name}", f"PATTERN {format_pattern(q.pattern)}"]
    if q.where is not None:
        lines.append(f"WHERE {format_expr(q.where)}")
    within = f"WITHIN {q.within.amount} {q.within.unit}"
    if q.strategy != ast.ANY_MATCH:
        within += f" USING {q.strategy}"
    if q.after_match is not None:
        within += f" AFTER MATCH {q.after_match}"
    lines.append(within)
    if q.returns:
        lines.append("RETURN " + ", ".join(r.label for r in q.returns))
    return "\n".join(lines)


def schema_to_source(s: ast.EventSchema) -> str:
    return f"EVENT {s.type}(" + ", ".join(f"{a.name} {a.type}" for a in s.attrs) + ")"


def table_to_source(t: ast.LookupTable) -> str:
    text = (f"TABLE {t.name}(" + ", ".join(f"{c.name} {c.type}" for c in t.columns)
            + f") KEY {t.key} FROM '" + t.url.replace("'", "''") + "'")
    return text + (f" REFRESH {t.refresh.amount} {t.refresh.unit}" if t.refresh else "")


def file_to_source(f: ast.QueryFile) -> str:
    statements = [schema_to_source(s) for s in f.schemas] + \
        [table_to_source(t) for t in f.tables] + [to_source(q) for q in f.queries]
    return ";\n\n".join(statements) + (";\n" if statements else "")
