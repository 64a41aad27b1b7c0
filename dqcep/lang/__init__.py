"""The query language: text -> validated AST with source positions.

    >>> from dqcep.lang import parse
    >>> qf = parse("PATTERN SEQ(A a, B b) WHERE a.x < b.x WITHIN 10 s")
    >>> qf.queries[0].name, qf.queries[0].within.ms
    ('q1', 10000)
"""
from dqcep.lang.ast import QueryFile, Query
from dqcep.lang.errors import QueryError
from dqcep.lang.parser import parse, parse_file
from dqcep.lang.printer import file_to_source, to_source

__all__ = ["parse", "parse_file", "QueryError", "Query", "QueryFile", "to_source",
           "file_to_source"]
