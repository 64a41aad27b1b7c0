from __future__ import annotations

from dqcep.core.errors import UserError, caret_excerpt


class QueryError(UserError):
    """A query that does not parse or is not valid: says where and what was expected.

    ``str(err)`` is ``file:line:col: message`` followed by the source line and a
    caret under the column.
    """

    def __init__(self, message: str, source: str, line: int, col: int, line_text: str = ""):
        self.message = message
        self.source = source
        self.line = line
        self.col = col
        self.line_text = line_text
        super().__init__(str(self))

    @property
    def location(self) -> str:
        return f"{self.source}:{self.line}:{self.col}"

    def __str__(self) -> str:
        head = f"{self.location}: {self.message}"
        if self.line_text.strip():
            return f"{head}\n{caret_excerpt(self.line_text, self.col)}"
        return head
