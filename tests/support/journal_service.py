"""The streaming service in-process over a journal a test writes (no broker: what
arrives is what the journal holds): its configuration, the payloads, running it."""
import json
from pathlib import Path

import msgpack

from dqcep.io.journal import Journal
from dqcep.service import ServiceConfig, StreamingService
from tests.support.paths import ROOT

QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


def config(tmp: Path, fmt="msgpack", lateness=0, queries=QUERIES, **kw) -> ServiceConfig:
    return ServiceConfig(queries=str(queries), inputs=["mqtt://127.0.0.1:1/t"],
                         journal=str(tmp / "journal"), checkpoint=str(tmp / "ck.bin"),
                         output=str(tmp / "out.jsonl"), dead_letter=str(tmp / "dead.jsonl"),
                         late=str(tmp / "late.jsonl"), fmt=fmt, lateness=lateness, **kw)


def journal_payloads(tmp: Path, payloads, topic="t", segment_bytes=64 << 20) -> None:
    j = Journal(tmp / "journal", segment_bytes, fsync="never")
    for p in payloads:
        j.append(topic, p)
        j.commit()
    j.close()


def run_once(cfg: ServiceConfig) -> StreamingService:
    """What the service does with what the journal holds, then a checkpoint (no flush)."""
    svc = StreamingService(cfg)
    while svc.step():
        pass
    svc.checkpoint()
    svc.close()
    return svc


def lines(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_bytes().decode("utf-8").splitlines()]


def rejected_events(record: dict) -> int:
    """How many events a dead-letter record stands for (a whole payload: 1)."""
    if "rejected" not in record:
        return 1
    n = 0
    for group in record["rejected"]:
        for part in group["events"].split(","):
            first, _, last = part.partition("-")
            n += int(last or first) - int(first) + 1
    return n


def iot_payloads(n: int, seed: int = 5, first_id: int = 1, batch: int = 200,
                 ts_shift: int = 0) -> list[bytes]:
    """A planted IoT stream as msgpack payloads of ``batch`` events, ids from first_id,
    timestamps moved by ts_shift ms."""
    from dqcep.io.event_writers import BatchEncoder
    from dqcep.generator import GeneratorConfig, Planting, StreamGenerator
    gen = StreamGenerator(GeneratorConfig(profile="iot", events=n, seed=seed,
                                          plant=Planting(queries=str(QUERIES), every=130_000)))
    encoder = BatchEncoder(gen.schema, "msgpack", batch)
    out = []
    for b in gen.batches(16_384):
        buf, ends = encoder.msgpack_payloads(b)
        start = 0
        for end in ends:
            out.append(bytes(buf[start:end]))
            start = int(end)
    return [msgpack.packb({"events": [dict(e, id=e["id"] + first_id - 1, ts=e["ts"] + ts_shift)
                                      for e in msgpack.unpackb(p)["events"]]}) for p in out]


def finish(cfg) -> StreamingService:
    """Run to the end of the stream: everything processed, held matches out."""
    svc = StreamingService(cfg)
    while svc.step():
        pass
    svc.end_stream()
    svc.checkpoint()
    svc.close()
    return svc
