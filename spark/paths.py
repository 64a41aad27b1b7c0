"""Checks of a Spark job's paths that need no Spark: the CLI runs them before the JVM
starts, and the jobs run them again (one rule each)."""
from __future__ import annotations

from pathlib import Path

from dqcep.core.errors import UserError
from dqcep.io.readers import list_event_files


def check_output_dir(output: str, overwrite: bool) -> None:
    """A batch job writes a fresh directory: a non-empty one needs --overwrite."""
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError(f"output directory {output} is not empty (use --overwrite)")


def check_batch_paths(inputs: list[str], output: str, overwrite: bool) -> None:
    list_event_files(inputs)
    check_output_dir(output, overwrite)
