"""Every command README.md and docs/ show runs as written, and prints what they show.

A command is a line of a ``sh`` block (the lines after it that are not commands
are its output) or a ``$ `` line of a plain block (its output follows). Each
doc's commands run in order in one fresh directory that holds the repository's
``dqcep/`` and ``examples/`` (as a clone does), with the installed ``dqcep`` script; the lines
shown after a command must appear in its output in that order (``...`` stands
for any lines), and it must exit 0 unless the docs show an error. A command is
left out only by a rule of ``NOT_RUN`` that says why; the MQTT ones run against
a test broker below.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Each test here starts processes or a broker: the quick run leaves them out.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("dqcep", "python3", "pip", "sh", "spark-submit", "psql")

# (pattern, why it is not run here)
NOT_RUN = [
    (r"^python3 -m pytest -q -n auto --dist loadgroup$",
     "the test suite itself (what runs this test)"),
    (r"^python3 -m pytest .*-m \"not integration\"", "the suite's quick subset (this "
     "test is left out of it; the full suite holds every test it runs)"),
    (r"^dqcep experiment all --out", "the full sizes take 3-4 min; the --quick form runs "
     "the same code"),
    (r"^dqcep experiment all --quick --out results/$", "tests/experiments/test_experiments.py runs "
     "it (its `quick` fixture) and checks every file it writes"),
    (r"spark-submit --master spark://host", "needs a cluster at spark://host:7077"),
    (r"spark://127\.0\.0\.1:PORT|^dqcep spark cluster",
     "starts a standalone cluster: tests/spark/test_spark_cluster.py::test_scripted_standalone_cluster "
     "runs these steps"),
    (r"^dqcep spark pack", "builds a venv from this checkout (the kernels compile): "
     "tests/spark/test_spark_cluster.py::test_scripted_standalone_cluster packs one from the session's "
     "wheel and runs a job with it"),
    (r"postgresql://alice@localhost", "needs a PostgreSQL server: "
     "test_database_commands_against_a_server runs them against a test server"),
    (r"http://127\.0\.0\.1:8080", "needs a running service: "
     "test_operations_commands_against_a_broker runs them"),
    (r"mqtt://localhost:1883", "needs a broker: test_streaming_commands_against_a_broker, "
     "test_the_device_feed_of_streaming_md_against_a_broker and "
     "test_worker_commands_against_a_broker run them against a test broker"),
]

# Files the docs name without showing how they were made
FIXTURES = {
    "README.md": {"bad.cep": "QUERY hot\nPATTERN SEQ(Temperature t, Smoke s)\n"
                             "WHERE z.value > 50\nWITHIN 30 s\n"},
    "cli.md": {"bad.jsonl": '{"id": 1, "type": "A", "ts": 1}\n'
                            '{"id": 2, "type": "A", "ts": "x"}\n'},
    "operations.md": {"more.cep": "QUERY intrusion2\nPATTERN SEQ(Door x, Motion y)\n"
                                  "WHERE [room] AND x.open = true AND y.active = true\n"
                                  "WITHIN 10 s\n"},
}
ERROR_LINE = re.compile(r"^\S+:\d+:\d+: (?!warning: )")  # a positioned error, not a warning


@dataclass
class Shown:
    where: str                      # doc:line
    command: str
    output: list[str] = field(default_factory=list)


def fenced_blocks(doc: Path):
    """(language, line number of the first line, lines) of each fenced block."""
    lang, first, body, indent = None, 0, [], 0
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if not line.lstrip().startswith("```"):
            body.append(line[indent:])  # a block inside a list item is indented
        elif lang is None:
            indent = len(line) - len(line.lstrip())
            lang, first, body = line.strip()[3:].strip(), number + 1, []
        else:
            yield lang, first, body
            lang = None


def shown_commands(doc: Path) -> list[Shown]:
    out: list[Shown] = []
    for lang, first, body in fenced_blocks(doc):
        if lang not in ("sh", ""):
            continue
        block: list[Shown] = []
        lines = iter(enumerate(body, first))
        for number, line in lines:
            text = line.rstrip()
            if lang == "sh" and text.startswith("#"):
                continue
            prompt = lang == "" and text.startswith("$ ")
            if prompt or lang == "sh" and text.split(" ", 1)[0] in PROGRAMS:
                command = text[2:] if prompt else text
                while command.endswith("\\"):  # continuation lines
                    command = command[:-1].rstrip() + " " + next(lines)[1].strip()
                command = re.sub(r"\s+#(\s.*)?$", "", command)  # a trailing comment
                block.append(Shown(f"{doc.relative_to(ROOT)}:{number}", command))
            elif block and text:
                block[-1].output.append(text)
        out += block
    return out


def missed_targets(command: str, r) -> bool:
    """``dqcep capacity`` exits 1 when the calibration this machine measured (slower
    when loaded) does not meet the command's targets: a measurement, not a failure of
    the command, when it says which targets are missed."""
    return command.startswith("dqcep capacity") and r.returncode == 1 and \
        "NOT every target met" in r.stdout and "missed: " in r.stdout


def not_run_reason(command: str) -> str | None:
    for pattern, why in NOT_RUN:
        if re.search(pattern, command):
            return why
    return None


def without_installs(command: str) -> str:
    """``pip install ... && X`` -> ``X``: the README's test command has installed every
    extra (checked by test_installs_the_docs_name_exist); ``""`` for an install alone."""
    parts = [p.strip() for p in command.split("&&")]
    keep = [p for p in parts if not re.search(r"\bpip install\b", p)
            and p != "sh scripts/system-deps.sh"]
    return " && ".join(keep)


def environment() -> dict:
    env = dict(os.environ)
    # the dqcep script pip installed beside this interpreter, as a user's shell finds it
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def workdir(tmp: Path, doc: Path) -> Path:
    for name in ("dqcep", "examples"):  # as in a clone: dqcep/data/iot.cep, examples/
        (tmp / name).symlink_to(ROOT / name)
    for name, text in FIXTURES.get(doc.name, {}).items():
        (tmp / name).write_text(text)
    return tmp


def check_output(shown: Shown, actual: list[str]) -> None:
    """The shown lines appear in order; ``...`` skips any lines."""
    k = 0
    for want in shown.output:
        if want.strip() in ("...", "…"):
            continue
        while k < len(actual) and actual[k].rstrip() != want:
            k += 1
        assert k < len(actual), (f"{shown.where}: `{shown.command}` does not print\n  {want}\n"
                                 f"it printed:\n" + "\n".join(actual[-40:]))
        k += 1


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_commands_of_a_doc_run_as_written(doc, tmp_path):
    cwd, env, previous = workdir(tmp_path, doc), environment(), 0
    ran = 0
    for shown in shown_commands(doc):
        command = without_installs(shown.command)
        if not command or not_run_reason(command):
            continue
        if command == "echo $?":
            check_output(shown, [str(previous)])
            continue
        r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env, text=True,
                           capture_output=True, timeout=600)
        previous, ran = r.returncode, ran + 1
        error_shown = bool(shown.output) and ERROR_LINE.match(shown.output[0])
        if not error_shown:
            assert r.returncode == 0 or missed_targets(command, r), \
                f"{shown.where}: `{command}` exit {r.returncode}\n" \
                + r.stderr[-3000:]
        else:
            assert r.returncode == 2, f"{shown.where}: `{command}` exit {r.returncode}"
        check_output(shown, (r.stdout + r.stderr).splitlines())
    if doc.name in ("README.md", "cli.md", "generator.md", "experiments.md", "spark.md"):
        assert ran, f"no command of {doc.name} ran"


def test_the_commands_found_and_those_not_run():
    """The parser sees the commands (so a broken fence cannot hide them), and every
    command left out is left out for a stated reason that still matches something."""
    found = [s for doc in DOCS for s in shown_commands(doc)]
    commands = {s.command for s in found}
    assert "dqcep run examples/fire.cep --input examples/fire-events.jsonl" in commands
    assert "dqcep generate --profile stock --events 5 --seed 2" in commands
    readme = shown_commands(ROOT / "README.md")
    assert readme[0].command == "python3 -m pip install -e . && python3 -m dqcep demo"
    assert without_installs(readme[0].command) == "python3 -m dqcep demo"
    assert without_installs(readme[1].command) == "python3 -m pytest -q -n auto --dist loadgroup"
    assert [s.output for s in readme if s.command.startswith("dqcep run bad.cep")] == [[
        "bad.cep:3:7: unknown variable 'z'; the pattern binds t, s",
        "    WHERE z.value > 50", "          ^"]]
    for pattern, why in NOT_RUN:
        assert any(re.search(pattern, without_installs(c)) for c in commands), (
            f"NOT_RUN rule {pattern!r} ({why}) matches no command any more")


def test_installs_the_docs_name_exist():
    """Each ``pip install '.[extra]'`` the docs show names an extra of pyproject.toml."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    named = {x for doc in DOCS for s in shown_commands(doc)
             for x in re.findall(r"pip install -e '\.\[(\w+)\]'", s.command)}
    assert named and named <= set(extras), named - set(extras)


def test_database_commands_against_a_server(postgres_server, tmp_path):
    """docs/databases.md's PostgreSQL commands, as written but for the server's address
    (a test server on a free port, where alice must give her password), with what
    they print."""
    url = postgres_server.password_user("secret")
    shown = [s for s in shown_commands(ROOT / "docs" / "databases.md")
             if "postgresql://alice@localhost:5432/alerts" in s.command]
    assert [s.command.split()[0] for s in shown] == ["dqcep", "psql"]
    cwd = workdir(tmp_path, Path("databases.md"))
    env = {**environment(), "DQCEP_DB_PASSWORD": "secret", "PGPASSWORD": "secret"}
    for s in shown:
        command = s.command.replace("postgresql://alice@localhost:5432/alerts", url)
        r = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, (s.where, r.stderr)
        assert r.stdout.splitlines() == s.output, (s.where, r.stdout)


def test_streaming_commands_against_a_broker(mosquitto, tmp_path):
    """docs/streaming.md's service command and docs/generator.md's publishing command,
    as written but for the broker's address (a test broker on a free port)."""
    host, port = mosquitto

    def command(doc: str, pattern: str) -> list[str]:
        found = [s.command for s in shown_commands(ROOT / "docs" / doc)
                 if re.search(pattern, s.command)]
        assert len(found) == 1, found
        return shlex.split(found[0].replace("localhost:1883", f"{host}:{port}"))

    service = command("streaming.md", r"^dqcep run dqcep/data/iot.cep .*mqtt://localhost:1883")
    publish = command("generator.md", r"^dqcep generate .*--rate .*mqtt://localhost:1883")
    cwd, env = workdir(tmp_path, Path("streaming.md")), environment()
    svc = subprocess.Popen(service, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = svc.stderr.readline()
        assert "listening on" in line, line + svc.stderr.read()
        pub = subprocess.Popen(publish, cwd=cwd, env=env, stderr=subprocess.DEVNULL)
        try:
            time.sleep(4)  # 2000 events/s: some 8000 events
            assert pub.poll() is None, "the publisher stopped early"
        finally:
            pub.terminate()
            pub.wait(10)
        time.sleep(1)  # what was sent reaches the journal
    finally:
        svc.send_signal(signal.SIGTERM)  # pause: checkpoint and stop
        err = svc.communicate(timeout=60)[1]
    assert svc.returncode == 0, err
    stats = json.loads((cwd / "state" / "stats.json").read_text())
    assert stats["events_in"] > 1000 and stats["malformed"] == 0, stats
    assert (cwd / "state" / "checkpoint.bin").exists() and (cwd / "matches.jsonl").exists()


def test_the_device_feed_of_streaming_md_against_a_broker(mosquitto, tmp_path):
    """docs/streaming.md's opening: the service with the example map, the readings
    published as a node sends them, the end of the stream (SIGUSR1): the fire alert it
    shows, with the ids it shows (a fresh journal).

    The readings are timed by their arrival and the query's window is 300 ms: a machine
    that stalls the publisher or the service's network thread that long between the
    first and the fourth reading puts them out of the window (CI: no alert, 1 of ~800
    runs). So each run's alerts are the reference's on what was journaled, with its
    arrival times, and the shown alert is the one of a run whose readings came within
    the window; up to three runs, a fresh journal each."""
    from dqcep.core.events import Event
    from dqcep.io.journal import TICK_TOPIC, read_journal
    from dqcep.io.mapping import derived_id
    from dqcep.lang import parse_file
    from dqcep.baseline.reference import ReferenceMatcher
    host, port = mosquitto
    shown = shown_commands(ROOT / "docs" / "streaming.md")
    service = [s.command for s in shown if "--map" in s.command and s.command.startswith(
        "dqcep run")]
    publish = [s.command for s in shown if s.command.startswith("dqcep publish")]
    assert len(service) == 1 and len(publish) == 1
    doc = (ROOT / "docs" / "streaming.md").read_text()
    shown_alert = json.loads(re.search(r'^\{"query": "fire".*$', doc, re.M).group(0))
    readings = [json.loads(x) for x in
                (ROOT / "examples" / "sensor-readings.jsonl").read_text().splitlines()]
    queries = parse_file(ROOT / "examples" / "sensors.cep").queries

    def args(command):
        return shlex.split(command.replace("localhost:1883", f"{host}:{port}"))

    def run(attempt: int):
        """The service and the publisher as shown: (its alerts, the reference's)."""
        (tmp_path / str(attempt)).mkdir()
        cwd = workdir(tmp_path / str(attempt), Path("streaming.md"))
        env = environment()
        svc = subprocess.Popen(args(service[0]) + ["--client-id", f"docs-feed-{attempt}"],
                               cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        journal = cwd / "alerts.state" / "journal"
        try:
            line = svc.stderr.readline()
            assert "listening on" in line, line + svc.stderr.read()
            r = subprocess.run(args(publish[0]), cwd=cwd, env=env, capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            # every reading sent is journaled before the end of the stream (a second's
            # sleep was too short on a loaded machine: no alert)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(
                    1 for r in read_journal(journal, include_open=True)
                    if r.topic != TICK_TOPIC) < len(readings):
                time.sleep(0.05)
        finally:
            svc.send_signal(signal.SIGUSR1)  # the end of the stream
            err = svc.communicate(timeout=60)[1]
        assert svc.returncode == 0, err
        # the service's ticks (a second without a reading) are no readings
        records = [r for r in read_journal(journal, include_open=True)
                   if r.topic != TICK_TOPIC]
        assert len(records) == len(readings), err
        events = [Event(derived_id(rec.offset, 0), e["type"], rec.arrival_us // 1000,
                        {"room": e["room"], "value": e["value"]})
                  for rec, e in zip(records, readings)]
        reference = [(m.query, m.to_json_obj()["events"])
                     for m in ReferenceMatcher(queries).run(events)]
        alerts = [json.loads(x) for x in (cwd / "alerts.jsonl").read_text().splitlines()]
        # a tick journaled before the first reading (a publisher that started more than
        # --tick after the service) moves every id by its offset: the shown ids are
        # those of a journal whose first record is the first reading
        shift = derived_id(records[0].offset, 0)
        return [(a["query"], {k: v - shift for k, v in a["events"].items()})
                for a in alerts], [(q, {k: v - shift for k, v in ev.items()})
                                   for q, ev in reference]

    for attempt in range(3):
        alerts, reference = run(attempt)
        assert alerts == reference
        if reference:
            break
    assert alerts == [("fire", shown_alert["events"])]


def test_operations_commands_against_a_broker(mosquitto, tmp_path):
    """docs/operations.md's commands as written but for the broker's and the service's
    ports: the service with --http, `dqcep status` printing the summary it shows (line
    by line, its figures this run's), and the same with a token on 0.0.0.0, where
    reading without the token is refused."""
    from tests.support.broker import free_port
    host, port = mosquitto
    http = free_port()
    shown = shown_commands(ROOT / "docs" / "operations.md")
    services = [s for s in shown if s.command.startswith("dqcep run")]
    status = [s for s in shown if s.command.startswith("dqcep status")]
    token = [s for s in shown if "secrets.token_urlsafe" in s.command]
    changes = [s for s in shown if s.command.startswith("dqcep queries")]
    assert len(services) == 2 and len(status) == 2 and len(token) == 1
    assert [c.command.split()[2] for c in changes] == ["add", "list", "remove"]

    def args(command):
        return shlex.split(command.replace("localhost:1883", f"{host}:{port}")
                           .replace(":8080", f":{http}"))

    cwd, env = workdir(tmp_path, Path("operations.md")), environment()
    assert subprocess.run(["bash", "-c", token[0].command], cwd=cwd).returncode == 0
    publish = [sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", "3000",
               "--seed", "2", "--quiet", "-o", f"mqtt://{host}:{port}/sensors/room1"]
    for service, ask in zip(services, status):
        svc = subprocess.Popen(args(service.command) + ["--client-id", f"ops-{http}"],
                               cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        try:
            line = svc.stderr.readline()
            assert "listening on" in line and "http on http://" in line, line
            assert subprocess.run(publish, cwd=cwd, env=env).returncode == 0
            deadline = time.monotonic() + 60
            while True:  # until every event is in (the second run: the same, repeats)
                r = subprocess.run(args(ask.command), cwd=cwd, env=env, capture_output=True,
                                   text=True, timeout=60)
                assert r.returncode == 0, r.stderr
                if "events in 3,000 " in r.stdout or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert "events in 3,000 " in r.stdout, r.stdout
            if ask.output:
                assert [x.split()[0] for x in r.stdout.splitlines()] == \
                    [x.split()[0] for x in ask.output], r.stdout
            if "--token-file" in ask.command:  # without it: refused, one line
                bare = [a for a in args(ask.command) if a not in ("--token-file", "token")]
                r = subprocess.run(bare, cwd=cwd, env=env, capture_output=True, text=True,
                                   timeout=60)
                assert r.returncode == 2 and "401" in r.stderr, r.stderr
                for change in changes:  # the live queries, with the token
                    r = subprocess.run(args(change.command), cwd=cwd, env=env,
                                       capture_output=True, text=True, timeout=120)
                    assert r.returncode == 0, (change.where, r.stderr)
                    for want in change.output:  # the journal record is this run's
                        assert re.sub(r"record \d+", "record N", want) in \
                            re.sub(r"record \d+", "record N", r.stdout), (want, r.stdout)
        finally:
            svc.send_signal(signal.SIGTERM)
            err = svc.communicate(timeout=60)[1]
        assert svc.returncode == 0, err


def test_worker_commands_against_a_broker(tmp_path):
    """docs/capacity.md's service commands as workers (--workers 2; --target with the
    calibration the doc's commands before them write), as written but for the broker's
    address: each takes in what a publisher sends and stops cleanly. The broker is this
    test's own: what it publishes to sensors/a would otherwise wait in the session
    another test's service left on the shared broker (client id dqcep-engine,
    sensors/#), and a later service of that id would take those events first and drop
    its own of the same ids as repeats."""
    from tests.support.broker import free_port, start_mosquitto, stop_mosquitto
    host, port = "127.0.0.1", free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} {host}\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 0\n")
    broker = start_mosquitto(conf, port)
    try:
        _run_worker_commands(tmp_path / "docs", host, port)
    finally:
        stop_mosquitto(broker)


def _run_worker_commands(tmp_path, host, port):
    tmp_path.mkdir()
    doc = ROOT / "docs" / "capacity.md"
    cwd, env = workdir(tmp_path, Path("capacity.md")), environment()
    services = []
    for shown in shown_commands(doc):
        if "mqtt://localhost:1883" in shown.command:
            services.append(shlex.split(shown.command.replace("localhost:1883",
                                                              f"{host}:{port}")))
            continue
        r = subprocess.run(["bash", "-c", shown.command], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 or missed_targets(shown.command, r), (shown.where, r.stderr)
    assert [("--workers" in c, "--target" in c) for c in services] == [(True, False),
                                                                       (False, True)]
    for i, service in enumerate(services):
        state = cwd / "matches.state"
        svc = subprocess.Popen(service + ["--stats-file", str(cwd / "stats.json"),
                                          "--client-id", f"docs-workers-{i}"],
                               cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        try:
            while "listening on" not in (line := svc.stderr.readline()):
                assert line, svc.stderr.read()
            r = subprocess.run(["dqcep", "generate", "-n", "4000", "--seed", str(i),
                                "--quiet", "-o", f"mqtt://{host}:{port}/sensors/a"],
                               cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 30
            while True:
                try:
                    if json.loads((cwd / "stats.json").read_text())["events_in"] >= 4000:
                        break
                except (FileNotFoundError, json.JSONDecodeError, KeyError):
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            svc.send_signal(signal.SIGTERM)
            err = svc.communicate(timeout=60)[1]
        assert svc.returncode == 0, err
        assert (state / "queries" / "overheating" / "checkpoint.bin").exists()
        assert (cwd / "matches.overheating.jsonl").exists()
        (cwd / "stats.json").unlink()
        for q in ("overheating", "intrusion", "stuffy"):  # the next run starts afresh
            (cwd / f"matches.{q}.jsonl").unlink()
        subprocess.run(["rm", "-rf", str(state)], check=True)
