"""Errors that are the user's to fix: the CLI prints them and exits with code 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a query, an event file, an option)."""


def caret_excerpt(line_text: str, col: int) -> str:
    """The offending line and a caret under column ``col`` (1-based); tabs kept."""
    line_text = line_text.rstrip("\n")
    lead = "".join(c if c == "\t" else " " for c in line_text[: max(col - 1, 0)])
    return f"    {line_text}\n    {lead}^"
