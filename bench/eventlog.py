"""What a Spark event log says about a job: stages, task time, skew, fixed cost.

Spark writes one JSON object per line to ``spark.eventLog.dir`` when
``spark.eventLog.enabled`` is true (``LOG_CONF``: uncompressed, one file; Spark 4
otherwise compresses with zstd, which Python's standard library cannot read). From it, per stage: tasks, the sum of the
tasks' executor run time (the work, whatever the parallelism), the largest and
the mean task time (skew), and the stage's wall span; per job: wall span and
stage count. ``summarize`` is what bench_spark.py's ``--model`` builds on.

    python3 bench/eventlog.py EVENT_LOG_FILE
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path


def log_conf(directory: str | Path) -> dict[str, str]:
    """Session settings that write a plain event log into ``directory``."""
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": Path(directory).as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


def log_files(directory: str | Path) -> list[Path]:
    """The event logs of the applications written into ``directory``, oldest first."""
    return sorted((p for p in Path(directory).iterdir() if p.is_file()
                   and not p.name.endswith(".inprogress")), key=lambda p: p.stat().st_mtime)


@dataclass
class Stage:
    stage_id: int
    name: str
    tasks: int = 0
    run_ms: list[int] = field(default_factory=list)   # executor run time per task
    records_in: int = 0
    records_out: int = 0
    submitted: int | None = None
    completed: int | None = None
    skipped: bool = False

    @property
    def task_ms(self) -> int:
        return sum(self.run_ms)

    @property
    def skew(self) -> float:
        """Largest task / mean task (1: even)."""
        if not self.run_ms or not sum(self.run_ms):
            return 1.0
        return max(self.run_ms) * len(self.run_ms) / sum(self.run_ms)

    @property
    def wall_ms(self) -> int:
        return (self.completed or 0) - (self.submitted or 0)


@dataclass
class Job:
    job_id: int
    stage_ids: list[int]
    submitted: int
    completed: int | None = None

    @property
    def wall_ms(self) -> int:
        return (self.completed or self.submitted) - self.submitted


@dataclass
class Run:
    stages: dict[int, Stage]
    jobs: list[Job]
    executors: int

    def ran(self) -> list[Stage]:
        """Stages that ran tasks (a skipped stage reused an earlier shuffle)."""
        return [s for s in self.stages.values() if s.run_ms]


def read(path: str | Path) -> Run:
    stages: dict[int, Stage] = {}
    jobs: list[Job] = []
    executors: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            kind = e.get("Event")
            if kind == "SparkListenerExecutorAdded":
                executors.add(e["Executor ID"])
            elif kind == "SparkListenerJobStart":
                jobs.append(Job(e["Job ID"], list(e.get("Stage IDs", [])), e["Submission Time"]))
                for info in e.get("Stage Infos", []):
                    stages.setdefault(info["Stage ID"], Stage(info["Stage ID"],
                                                              info["Stage Name"]))
            elif kind == "SparkListenerJobEnd":
                for j in jobs:
                    if j.job_id == e["Job ID"]:
                        j.completed = e["Completion Time"]
            elif kind == "SparkListenerStageCompleted":
                info = e["Stage Info"]
                s = stages.setdefault(info["Stage ID"], Stage(info["Stage ID"], info["Stage Name"]))
                s.tasks = info["Number of Tasks"]
                s.submitted, s.completed = info.get("Submission Time"), info.get("Completion Time")
            elif kind == "SparkListenerTaskEnd":
                m = e.get("Task Metrics") or {}
                s = stages.setdefault(e["Stage ID"], Stage(e["Stage ID"], ""))
                s.run_ms.append(m.get("Executor Run Time", 0))
                s.records_in += (m.get("Input Metrics", {}).get("Records Read", 0)
                                 + m.get("Shuffle Read Metrics", {}).get("Total Records Read", 0))
                s.records_out += (m.get("Output Metrics", {}).get("Records Written", 0)
                                  + m.get("Shuffle Write Metrics", {})
                                  .get("Shuffle Records Written", 0))
    return Run(stages, jobs, len(executors - {"driver"}))


def summarize(run: Run) -> dict:
    ran = run.ran()
    return {
        "jobs": len(run.jobs),
        "stages_run": len(ran),
        "task_ms": sum(s.task_ms for s in ran),
        "jobs_wall_ms": sum(j.wall_ms for j in run.jobs),
        "executors": run.executors,
        "stages": [{"id": s.stage_id, "name": s.name, "tasks": len(s.run_ms),
                    "task_ms": s.task_ms, "skew": round(s.skew, 2), "wall_ms": s.wall_ms,
                    "records_in": s.records_in, "records_out": s.records_out}
                   for s in sorted(ran, key=lambda s: s.stage_id)],
    }


def main(argv=None) -> None:
    path = (argv or sys.argv[1:])[0]
    summary = summarize(read(path))
    print(f"{summary['jobs']} jobs, {summary['stages_run']} stages run, "
          f"{summary['task_ms'] / 1000:.1f} s of task time, jobs' wall "
          f"{summary['jobs_wall_ms'] / 1000:.1f} s, {summary['executors']} executor(s)")
    print(f"{'stage':>5} {'tasks':>5} {'task s':>8} {'skew':>5} {'wall s':>7} "
          f"{'rec in':>10} {'rec out':>10}  name")
    for s in summary["stages"]:
        print(f"{s['id']:>5} {s['tasks']:>5} {s['task_ms'] / 1000:>8.2f} {s['skew']:>5.2f} "
              f"{s['wall_ms'] / 1000:>7.2f} {s['records_in']:>10,} {s['records_out']:>10,}  "
              f"{s['name'][:60]}")


if __name__ == "__main__":
    main()
