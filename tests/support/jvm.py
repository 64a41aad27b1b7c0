"""The options of every JVM the tests start, and the class-data archive they share.

A Spark driver spends most of its start loading and verifying Spark's classes: 10 s to a
session and 15 s to its first job here, 4 s and 6 s from a class-data archive (Java's
AppCDS: the classes one run loaded, dumped at its exit, mapped by the next ones). The
suite starts about 30 such JVMs, so the first test process whose run selects a Spark
test has one made in the background (``start_archive``), once per machine for a Java and
PySpark pair; JVMs started before it is there, or whose class path differs from a local
driver's (the standalone cluster's daemons), run as without it. ``-Xlog:cds=off``: the
JVM says on stdout when it cannot use the archive, and stdout is what some commands
answer with (``dqcep spark cluster start`` prints the master's URL).
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# C1 alone compiles what the tests' short-lived JVMs run with a quarter less CPU than C1
# then C2 (a killed-and-restarted stream job: 219 -> 163 CPU seconds), and the suite is
# CPU-bound on 2 cores; one serial collector: no GC threads contending with the other test
# process. The JVM says so on stderr ("Picked up JAVA_TOOL_OPTIONS").
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# What the archive's JVM loads: a local session, a job, and the Arrow path of the
# Python stages; then the JVM is made to exit (it writes the archive then), not left to
# notice its gateway gone.
MAKE = """
import sys
from pyspark import SparkContext
from dqcep.spark.session import spark_session
spark = spark_session("local[2]", "dqcep-tests-class-archive")
frame = spark.range(100, numPartitions=2)
frame.mapInArrow(lambda batches: batches, frame.schema).count()
jvm = SparkContext._gateway.proc
spark.stop()
SparkContext._gateway.shutdown()
jvm.stdin.close()
sys.exit(jvm.wait())
"""


def archive_path() -> Path | None:
    """Where the archive of this machine's Java and PySpark is (None without either)."""
    java = shutil.which("java")
    try:  # its version only: importing pyspark here would slow every pytest start
        pyspark = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return None
    if java is None:
        return None
    java = os.path.realpath(java)
    key = hashlib.sha256(f"{java} {os.stat(java).st_mtime_ns} {pyspark} "
                         f"{BASE_OPTIONS}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"dqcep-tests-{os.getuid()}" / f"spark-{key}.jsa"


def java_options() -> str:
    """JAVA_TOOL_OPTIONS for the tests' JVMs: the archive is named even before it is
    made (a JVM that does not find it runs without it)."""
    path = archive_path()
    if path is None:
        return BASE_OPTIONS
    return f"{BASE_OPTIONS} -XX:SharedArchiveFile={path} {QUIET}"


def start_archive() -> subprocess.Popen | None:
    """Make the archive in the background unless it is there or being made (a lock the
    making process holds for its life: a run killed mid-way leaves no stale lock)."""
    path = archive_path()
    if path is None or path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(path.with_suffix(".lock"), os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return None  # another test process is making it
    if path.exists():  # made between the look and the lock
        os.close(lock)
        return None
    for stale in path.parent.glob(f"{path.stem}.*.partial"):  # of a run killed mid-way
        stale.unlink()
    partial = path.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ,
           "JAVA_TOOL_OPTIONS": f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} {QUIET}"}
    # The archive is renamed into place once whole: a JVM never maps a half-written one.
    script = (f"import os, subprocess, sys\n"
              f"done = subprocess.run([sys.executable, '-c', {MAKE!r}], "
              f"stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              f"if done.returncode == 0 and os.path.exists({str(partial)!r}):\n"
              f"    os.replace({str(partial)!r}, {str(path)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, pass_fds=(lock,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    os.close(lock)  # the child holds it now
    return proc
