"""Query text -> AST, through the lark grammar in ``grammar.lark``.

Syntax errors from lark are turned into :class:`QueryError` with the position,
the offending line and the set of tokens that would have been accepted there
(computed exactly with lark's interactive parser, not LALR's merged lookaheads).
Query text is only ever tokenized and parsed, never evaluated.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from dqcep.core.errors import UserError
from dqcep.lang import ast
from dqcep.lang.check import check_query
from dqcep.lang.errors import QueryError

KEYWORDS = ("QUERY", "PATTERN", "WHERE", "WITHIN", "RETURN", "SEQ", "AND", "OR", "NOT",
            "TRUE", "FALSE")

# How each terminal is named in "expected ..." messages.
TERMINAL_NAMES = {
    **{k: k for k in KEYWORDS},
    "NAME": "a name",
    "INT": "an integer",
    "NUMBER": "a number",
    "STRING": "a 'string'",
    "UNIT": "a time unit (ms, s, min, h)",
    "CMPOP": "a comparison (= != < <= > >=)",
    "USING": "USING",
    "EVENT": "EVENT", "TABLE": "TABLE", "KEY": "KEY", "FROM": "FROM", "REFRESH": "REFRESH",
    "STRATEGY": "a strategy (skip-till-any-match, skip-till-next-match, strict-contiguity, "
                "partition-contiguity)",
    "AFTER_MATCH": "AFTER MATCH",
    "POLICY": "an after-match policy (SKIP PAST LAST EVENT, SKIP TO NEXT EVENT)",
    "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'",
    "SEMI": "';'", "COMMA": "','", "DOT": "'.'",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "$END": "end of input",
}

# Limits that keep every number representable by every engine: with event times
# within +-(2**62 - 1) ms (dqcep.core.events.TS_LIMIT), ts +- 2 windows fits in 64 bits.
MAX_WINDOW_MS = 2**60
# Deeper queries are refused with a positioned error instead of exhausting the
# recursion of the tree walkers (no real query comes near it).
MAX_NESTING = 200


@lru_cache(maxsize=1)
def _lark() -> Lark:
    # Building the LALR tables takes ~35 ms of every command's start-up; lark keeps
    # them in a cache file of the user's own (checked against the grammar, the
    # options and lark's version on load, rebuilt when any changed)
    return Lark.open(
        str(Path(__file__).with_name("grammar.lark")),
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=False,
        cache=_grammar_cache() or False,
    )


def _grammar_cache() -> str | None:
    """The parser tables' cache file, in the user's cache directory (not a shared
    temporary directory: lark loads it with pickle); None where there is none."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "dqcep")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError:
        return None
    if not os.access(folder, os.W_OK) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return None
    return os.path.join(folder, "query-grammar.lark-cache")


class _SemanticError(Exception):
    """Raised inside the transformer; re-raised as QueryError with the source line."""

    def __init__(self, message: str, pos: ast.Pos):
        super().__init__(message)
        self.message = message
        self.pos = pos


def _pos(x) -> ast.Pos:
    return ast.Pos(x.line, x.column)


def _tokens(children, *types):
    return [c for c in children if isinstance(c, Token) and c.type in types]


@dataclass(frozen=True)
class _WithinClause:
    """``WITHIN n unit [USING strategy]``: the window and the strategy, apart."""

    within: ast.Within
    strategy: str
    strategy_pos: ast.Pos
    after_match: str | None = None
    after_match_pos: ast.Pos = ast.NOPOS


def _name(tok: Token) -> str:
    """A NAME token's text; keywords are reserved even where the lexer let them through."""
    text = str(tok)
    if text.upper() in KEYWORDS:
        raise _SemanticError(f"{text!r} is a reserved word and cannot be used as a name",
                             _pos(tok))
    return text


def _index(tree: Tree) -> str:
    """``[i]``, ``[i-1]``, ``[1]`` or ``[last]`` of a Kleene variable (spec 5.1)."""
    toks = tree.children
    text = "".join(str(t) for t in toks).lower()  # like keywords: v[LAST] is v[last]
    if text in (ast.INDEX_EACH, ast.INDEX_PREVIOUS, ast.INDEX_FIRST, ast.INDEX_LAST):
        return text
    raise _SemanticError(f"index [{text}] is not supported: a Kleene variable's elements "
                         "are read as v[i] (each), v[i-1] (the one before), v[1] (the "
                         "first) or v[last]", _pos(toks[0]))


def _function(tok: Token) -> str:
    """An aggregate function's name (case-insensitive, as keywords)."""
    text = str(tok).lower()
    if text not in ast.AGGREGATES:
        raise _SemanticError(f"unknown function {str(tok)!r}; the aggregates are "
                             + ", ".join(f"{f}()" for f in ast.AGGREGATES), _pos(tok))
    return text


def _no_twice(attrs: tuple, what: str) -> None:
    seen: dict[str, ast.SchemaAttr] = {}
    for a in attrs:
        if a.name in seen:
            raise _SemanticError(f"{what} {a.name!r} is declared twice (first at line "
                                 f"{seen[a.name].pos.line}, column {seen[a.name].pos.col})",
                                 a.pos)
        seen[a.name] = a


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds the AST; punctuation tokens are dropped here."""

    # patterns -------------------------------------------------------------
    def event(self, meta, children):
        type_, var = children
        return ast.EventPattern(_name(type_), _name(var), _pos(meta))

    def _operator(self, op, meta, children):
        items = tuple(c for c in children if not isinstance(c, Token))
        return ast.Operator(op, items, _pos(meta))

    def seq(self, meta, children):
        return self._operator(ast.SEQ, meta, children)

    def and_(self, meta, children):
        return self._operator(ast.AND, meta, children)

    def or_(self, meta, children):
        return self._operator(ast.OR, meta, children)

    def kleene(self, meta, children):
        type_, var = _tokens(children, "NAME")
        return ast.Kleene(_name(type_), _name(var), _pos(meta))

    def not_event(self, meta, children):
        type_, var = _tokens(children, "NAME")
        return ast.Negation(ast.EventPattern(_name(type_), _name(var), _pos(type_)),
                            _pos(meta))

    def not_kleene(self, meta, children):  # parsed to be refused with its position
        type_, var = _tokens(children, "NAME")
        return ast.Negation(ast.Kleene(_name(type_), _name(var), _pos(type_)), _pos(meta))

    def not_pattern(self, meta, children):
        (pattern,) = [c for c in children if not isinstance(c, Token)]
        return ast.Negation(pattern, _pos(meta))

    # expressions ----------------------------------------------------------
    def attr(self, meta, children):
        var, attr = _tokens(children, "NAME")
        return ast.AttrRef(_name(var), _name(attr), _pos(meta))

    def indexed_attr(self, meta, children):
        var, attr = _tokens(children, "NAME")
        (index,) = [c for c in children if isinstance(c, Tree)]
        return ast.AttrRef(_name(var), _name(attr), _pos(meta), _index(index))

    def aggregate(self, meta, children):
        names = _tokens(children, "NAME")
        return ast.Aggregate(_function(names[0]), _name(names[1]),
                             _name(names[2]) if len(names) > 2 else None, _pos(meta))

    def lookup(self, meta, children):
        table, var, attr, column = _tokens(children, "NAME")
        return ast.Lookup(_name(table), ast.AttrRef(_name(var), _name(attr), _pos(var)),
                          _name(column), _pos(meta))

    def number(self, meta, children):
        (tok,) = children
        text = str(tok)
        value: int | float = float(text) if "." in text else int(text)
        if not math.isfinite(float(text)):  # every engine computes in binary64
            raise _SemanticError(f"number {text[:20]}... is too large", _pos(meta))
        return ast.Number(value, _pos(meta))

    def string(self, meta, children):
        (tok,) = children
        return ast.String(str(tok)[1:-1].replace("''", "'"), _pos(meta))

    def true(self, meta, children):
        return ast.Boolean(True, _pos(meta))

    def false(self, meta, children):
        return ast.Boolean(False, _pos(meta))

    def equiv(self, meta, children):
        (attr,) = _tokens(children, "NAME")
        return ast.Equivalence(_name(attr), _pos(meta))

    def not_(self, meta, children):
        tok, operand = children
        return ast.Unary("NOT", operand, _pos(tok))

    def neg_(self, meta, children):
        tok, operand = children
        return ast.Unary("-", operand, _pos(tok))

    def _left_assoc(self, children):
        expr = children[0]
        for i in range(1, len(children), 2):
            op = children[i]
            expr = ast.Binary(str(op).upper(), expr, children[i + 1], _pos(op))
        return expr

    def disj(self, meta, children):
        return self._left_assoc(children)

    conj = cmp = sum = term = disj

    def atom(self, meta, children):  # "(" cond ")": parentheses leave no node
        (inner,) = [c for c in children if not isinstance(c, Token)]
        return inner

    # query ----------------------------------------------------------------
    def where(self, meta, children):
        return children[1]

    def within(self, meta, children):
        amount = _tokens(children, "INT")[0]
        unit = _tokens(children, "UNIT")
        w = ast.Within(int(amount), str(unit[0]).lower() if unit else "ms", _pos(meta))
        if w.ms > MAX_WINDOW_MS:
            raise _SemanticError(f"window of {amount} {w.unit} is too large "
                                 f"(at most {MAX_WINDOW_MS} ms)", _pos(amount))
        strategy = _tokens(children, "STRATEGY")
        policy = _tokens(children, "POLICY")
        after = (" ".join(str(policy[0]).upper().split()), _pos(policy[0])) if policy else \
            (None, ast.NOPOS)
        if not strategy:
            return _WithinClause(w, ast.ANY_MATCH, ast.NOPOS, *after)
        return _WithinClause(w, str(strategy[0]).lower(), _pos(strategy[0]), *after)

    def ret(self, meta, children):
        names = _tokens(children, "NAME")
        return ast.ReturnItem(_name(names[0]), _name(names[1]) if len(names) > 1 else None,
                              _pos(meta))

    def ret_aggregate(self, meta, children):
        names = _tokens(children, "NAME")
        return ast.ReturnItem(_name(names[1]), _name(names[2]) if len(names) > 2 else None,
                              _pos(meta), _function(names[0]))

    def ret_lookup(self, meta, children):
        table, var, attr, column = _tokens(children, "NAME")
        return ast.ReturnItem(_name(var), _name(attr), _pos(meta), table=_name(table),
                              column=_name(column))

    def returns(self, meta, children):
        return tuple(c for c in children if isinstance(c, ast.ReturnItem))

    def query(self, meta, children):
        name = None
        pattern = where = clause = None
        returns: tuple = ()
        for i, c in enumerate(children):
            if isinstance(c, Token) and c.type == "QUERY":
                name = _name(children[i + 1])
            elif isinstance(c, (ast.EventPattern, ast.Kleene, ast.Operator)):
                pattern = c  # a Kleene item alone is parsed to be refused by check
            elif isinstance(c, _WithinClause):
                clause = c
            elif isinstance(c, tuple):
                returns = c
            elif not isinstance(c, Token):
                where = c
        return ast.Query(name or "", pattern, where, clause.within, returns, _pos(meta),
                         clause.strategy, clause.strategy_pos, clause.after_match,
                         clause.after_match_pos)

    # event schemas -------------------------------------------------------------
    def schema_attr(self, meta, children):
        name, type_ = children
        kind = str(type_).upper()  # like keywords, the type names ignore case
        if kind not in ast.ATTRIBUTE_TYPES:
            raise _SemanticError(f"unknown attribute type {str(type_)!r}; the types are "
                                 + ", ".join(ast.ATTRIBUTE_TYPES), _pos(type_))
        attr = _name(name)
        if attr in ("ts", "id", "type"):
            raise _SemanticError(f"{attr!r} is every event's own field, not an attribute to "
                                 "declare", _pos(name))
        return ast.SchemaAttr(attr, kind, _pos(name))

    def schema(self, meta, children):
        names = _tokens(children, "NAME")
        attrs = tuple(c for c in children if isinstance(c, ast.SchemaAttr))
        _no_twice(attrs, "attribute")
        return ast.EventSchema(_name(names[0]), attrs, _pos(meta))

    def table(self, meta, children):
        names = _tokens(children, "NAME")
        columns = tuple(c for c in children if isinstance(c, ast.SchemaAttr))
        _no_twice(columns, "column")
        key = names[-1]
        if _name(key) not in {c.name for c in columns}:
            raise _SemanticError(f"the key {str(key)!r} is not one of the table's columns "
                                 f"({', '.join(c.name for c in columns)})", _pos(key))
        (url,) = _tokens(children, "STRING")
        refresh = None
        amount = _tokens(children, "INT")
        if amount:
            unit = _tokens(children, "UNIT")
            refresh = ast.Within(int(amount[0]), str(unit[0]).lower() if unit else "ms",
                                 _pos(amount[0]))
            if refresh.ms > MAX_WINDOW_MS:
                raise _SemanticError(f"REFRESH {amount[0]} {refresh.unit} is too long",
                                     _pos(amount[0]))
        return ast.LookupTable(_name(names[0]), columns, _name(key),
                               str(url)[1:-1].replace("''", "'"), refresh, _pos(meta))

    def start(self, meta, children):
        return [c for c in children
                if isinstance(c, (ast.Query, ast.EventSchema, ast.LookupTable))]


def _describe(terminals) -> str:
    names = sorted({TERMINAL_NAMES.get(t, t) for t in terminals})
    if not names:
        return "nothing more"
    if len(names) == 1:
        return names[0]
    return "one of " + ", ".join(names)


def _syntax_error(err: UnexpectedInput, text: str, source: str) -> QueryError:
    lines = text.split("\n")

    def at(line: int, col: int, message: str) -> QueryError:
        line_text = lines[line - 1] if 0 < line <= len(lines) else ""
        return QueryError(message, source, line, col, line_text)

    if isinstance(err, UnexpectedCharacters):
        ch = text[err.pos_in_stream] if err.pos_in_stream < len(text) else ""
        if "POLICY" in (err.allowed or ()):
            word = text[err.pos_in_stream:].split(None, 1)[0] if ch.strip() else ch
            return at(err.line, err.column, f"unknown after-match policy starting {word!r}; "
                      "AFTER MATCH takes SKIP PAST LAST EVENT or SKIP TO NEXT EVENT")
        if ch == "'":
            return at(err.line, err.column, "unterminated string: a 'string' must close "
                      "on the same line (write '' for a quote inside it)")
        return at(err.line, err.column,
                  f"unexpected character {ch!r}; expected {_describe(err.allowed or ())}")

    assert isinstance(err, UnexpectedToken)
    tok = err.token
    try:
        expected = set(err.interactive_parser.accepts())
    except Exception:  # pragma: no cover - accepts() is exact when it works
        expected = set(err.expected)
    if tok.type == "$END":  # lark borrows the last token's span: point just after it
        line, col = tok.end_line or 1, tok.end_column or 1
        what = "end of input"
    else:
        line, col = tok.line, tok.column
        kind = {"NAME": "name ", "INT": "integer ", "NUMBER": "number ", "STRING": "string ",
                "UNIT": "time unit "}.get(tok.type, "")
        what = f"{kind}{str(tok)!r}"
    if "POLICY" in expected:
        if tok.type not in ("$END", "SEMI"):  # the words that stand where a policy goes
            what = repr(" ".join(text[tok.start_pos:].split(";")[0].split()[:4]))
        return at(line, col, f"AFTER MATCH needs a policy, got {what}: SKIP PAST LAST EVENT "
                  "or SKIP TO NEXT EVENT")
    if tok.type == "AFTER_MATCH":
        return at(line, col, "AFTER MATCH comes after WITHIN (and USING), not before it"
                  if "WITHIN" in expected else "AFTER MATCH twice: a query has one policy")
    if "WITHIN" in expected and tok.type in ("SEMI", "$END", "RETURN"):
        return at(line, col, "missing WITHIN: every query needs a time window "
                  "(e.g. WITHIN 30 s)")
    if "NAME" in expected and tok.type in KEYWORDS:
        return at(line, col, f"{str(tok)!r} is a reserved word and cannot be used as a "
                  f"name; expected {_describe(expected)}")
    return at(line, col, f"unexpected {what}; expected {_describe(expected)}")


def _deeper_than(tree: Tree, limit: int) -> tuple[int, int] | None:
    """Position of the first node nested deeper than ``limit`` (iterative walk)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            meta = node.meta
            return (getattr(meta, "line", 1), getattr(meta, "column", 1))
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
    return None


def _deepest_expression(expr: ast.Expr) -> ast.Pos | None:
    """Position of an expression node nested deeper than MAX_NESTING (iterative walk:
    ``a AND b AND c ...`` is a left-deep chain, flat in the parse tree)."""
    stack = [(expr, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return node.pos
        if isinstance(node, ast.Binary):
            stack += [(node.left, depth + 1), (node.right, depth + 1)]
        elif isinstance(node, ast.Unary):
            stack.append((node.operand, depth + 1))
    return None


def _too_deep_plan(pattern) -> ast.Pos | None:
    """Position of the operator at which the pattern's plan, a tree of binary
    operators, gets deeper than MAX_NESTING; None when it fits. (The parse tree is
    at most MAX_NESTING deep, so this recursion is bounded.)"""
    def depth(node) -> tuple[int, ast.Pos | None]:
        if isinstance(node, ast.Negation):
            return depth(node.pattern)
        if isinstance(node, (ast.EventPattern, ast.Kleene)):
            return 0, None
        worst = 0
        for item in node.items:
            d, w = depth(item)
            if w is not None:
                return d, w
            worst = max(worst, d)
        n = len(node.items)
        d = worst + ((n - 1).bit_length() if node.op == ast.OR else n - 1)
        return d, (node.pos if d > MAX_NESTING else None)
    return depth(pattern)[1]


def parse(text: str, source: str = "<query>") -> ast.QueryFile:
    """Parse and validate a query file; raise QueryError on the first problem."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, source) from None
    lines = text.split("\n")
    too_deep = _deeper_than(tree, MAX_NESTING)
    if too_deep is not None:
        line, col = too_deep
        raise QueryError(f"the query is nested more than {MAX_NESTING} levels deep",
                         source, line, col, lines[line - 1] if 0 < line <= len(lines) else "")
    if not tree.children:
        raise QueryError("the file holds no query; expected PATTERN or QUERY", source, 1, 1,
                         lines[0])

    def positioned(message: str, pos: ast.Pos) -> QueryError:
        line_text = lines[pos.line - 1] if 0 < pos.line <= len(lines) else ""
        return QueryError(message, source, pos.line, pos.col, line_text)

    try:
        statements = _ToAst().transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, _SemanticError):
            raise positioned(err.orig_exc.message, err.orig_exc.pos) from None
        raise
    queries = [s for s in statements if isinstance(s, ast.Query)]
    def declared_once(kind, name_of, what: str) -> dict:
        """The declarations of a kind by name; a name declared twice is an error."""
        found: dict = {}
        for d in (s for s in statements if isinstance(s, kind)):
            if name_of(d) in found:
                first = found[name_of(d)].pos
                raise positioned(f"{what} {name_of(d)!r} is declared twice (first at line "
                                 f"{first.line}, column {first.col})", d.pos)
            found[name_of(d)] = d
        return found
    schemas = declared_once(ast.EventSchema, lambda d: d.type, "event type")
    tables = declared_once(ast.LookupTable, lambda d: d.name, "table")
    if not queries:
        first = min((d.pos for d in [*schemas.values(), *tables.values()]),
                    key=lambda p: (p.line, p.col))
        what = " and ".join(w for w, d in (("event types", schemas), ("tables", tables)) if d)
        raise positioned(f"the file declares {what} but holds no query; expected PATTERN "
                         "or QUERY", first)
    named = []
    seen: dict[str, ast.Pos] = {}
    for q in queries:
        deep = _deepest_expression(q.where) if q.where is not None else None
        if deep is not None:
            raise positioned(f"the condition is nested more than {MAX_NESTING} levels deep "
                             "(each operator of a chain such as a + b + c counts as one)", deep)
        too_wide = _too_deep_plan(q.pattern)
        if too_wide is not None:
            raise positioned(f"the pattern decomposes more than {MAX_NESTING} operators deep "
                             "(SEQ or AND of n items counts n - 1, OR of n items log2 n, "
                             "and nested operators add up)", too_wide)
    for k, q in enumerate(queries, start=1):
        if not q.name:
            q = dataclasses.replace(q, name=f"q{k}")
        if q.name in seen:
            first = seen[q.name]
            raise positioned(f"duplicate query name {q.name!r} (first used at line "
                             f"{first.line}, column {first.col})", q.pos)
        seen[q.name] = q.pos
        problem = check_query(q, schemas, tables)
        if problem is not None:
            raise positioned(*problem)
        named.append(q)
    return ast.QueryFile(source, tuple(named), tuple(schemas.values()),
                         tuple(tables.values()))


def parse_file(path: str | Path) -> ast.QueryFile:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise QueryError(f"query file is not UTF-8 text ({err.reason} at byte {err.start})",
                         str(path), 1, 1) from None
    except OSError as err:  # no position: the file itself is the problem
        raise UserError(f"cannot read query file {path}: {err.strerror}") from None
    return parse(text, str(path))
