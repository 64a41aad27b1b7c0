"""A packed Python environment for the executors: ``dqcep spark pack``.

A user's cluster has no dqcep on its nodes. PySpark's documented way for packages
with compiled code is to ship a packed virtual environment as an archive
(``spark.archives`` / ``--archives ENV.tar.gz#environment``) and have the
executors run ``./environment/bin/python`` from it. This builds that archive: a
fresh venv (no system site-packages, so it holds only what it was given) with
dqcep, its dependencies and pandas (the Arrow UDFs need it), packed by
``venv-pack``. PySpark itself is not packed: the executors take it from the
cluster's Spark.

A venv keeps a link to its base interpreter: every node needs the same Python
at the same path as the machine that packed it (a conda-pack or PEX archive
carries the interpreter, for clusters where that does not hold).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import dqcep
from dqcep.core.errors import UserError

ENV_NAME = "environment"   # the directory the archive is unpacked into on each executor
EXECUTOR_PYTHON = f"./{ENV_NAME}/bin/python"
EXTRA = ["pandas>=2,<3"]   # the Arrow UDFs' side of the executors


def default_source() -> str:
    """What to install: this checkout when dqcep runs from one, else this version."""
    root = Path(dqcep.__file__).resolve().parent.parent
    if (root / "pyproject.toml").exists() and (root / "dqcep" / "_kernels").is_dir():
        return str(root)
    return f"dqcep=={dqcep.__version__}"


def pack_environment(output: str | Path, source: str | None = None,
                     compress_level: int = 4) -> Path:
    """Build the venv with ``source`` (a wheel, a source tree or a requirement;
    ``default_source()`` when None) installed, and pack it to ``output`` (.tar.gz)."""
    output = Path(output).resolve()
    if not output.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"{output}: the archive must be a .tar.gz (Spark unpacks it by name)")
    if output.exists():
        raise UserError(f"{output} exists; remove it or choose another name")
    with tempfile.TemporaryDirectory(prefix="dqcep-pack-") as tmp:
        env = Path(tmp) / ENV_NAME
        _run([sys.executable, "-m", "venv", str(env)], "create the venv")
        python = str(env / "bin" / "python")
        _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
              source or default_source(), *EXTRA, "venv-pack"], "install dqcep into the venv")
        _run([python, "-m", "venv_pack", "--prefix", str(env), "--output", str(output),
              "--compress-level", str(compress_level), "--quiet"], "pack the venv")
    return output


def spark_conf(archive: str | Path) -> dict[str, str]:
    """The session settings that make the executors run the packed environment."""
    path = Path(archive).resolve()
    if not path.is_file():
        raise UserError(f"{archive}: no such archive (make one with 'dqcep spark pack')")
    # The executors' Python workers of DataFrame work (pandas and Arrow UDFs, the Python
    # data sources) run spark.sql.execution.pyspark.python; the driver's own Python
    # workers (planning a Python data source) keep PYSPARK_PYTHON, this interpreter.
    return {"spark.archives": f"{path}#{ENV_NAME}",
            "spark.sql.execution.pyspark.python": EXECUTOR_PYTHON}


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-20:]
        raise UserError(f"dqcep spark pack: could not {what}:\n" + "\n".join(tail))


__all__ = ["ENV_NAME", "EXECUTOR_PYTHON", "default_source", "pack_environment", "spark_conf"]
