# Python-visible API of dqcep._kernels.journal_records (C types in comments).
import numpy as np
import numpy.typing as npt

MORE: int       # an incomplete packet starts at pos
CONTROL: int    # a packet that is no PUBLISH starts at pos
FULL: int       # the records' output cannot hold the next record
MALFORMED: int  # the packet at pos is malformed
MALFORMED_REASONS: dict[int, str]
NOT_UTF8: bytes

def crc32(data: bytes, crc: int = 0) -> int: ...  # zlib.crc32

class PublishFramer:
    max_payload: int  # int64_t: larger payloads are journaled as their size
    window: int       # int64_t: journal records a redelivery is looked for among
    def __init__(self, max_payload: int, window: int) -> None: ...
    def remember(self, mid: int, offset: int, topic: bytes, payload: bytes | None,
                 size: int) -> None: ...
    def frame(self, data: "npt.NDArray[np.uint8]", pos: int, end: int, offset: int,
              arrival_us: int, records: "npt.NDArray[np.uint8]",
              acks: "npt.NDArray[np.uint8]") -> tuple[int, int, int, int, int, int, int, int]: ...
    # (pos, status, detail, records, messages, redelivered, record bytes, ack bytes)

END: int         # scan_records: the data ends
LIMIT: int       # max_records scanned
IRREGULAR: int   # the record at pos is for the Python reader
STOP_TOPIC: int  # the record at pos has a topic starting with the stop prefix

def scan_records(data: bytes, pos: int, offset: int, max_records: int, stop_prefix: bytes,
                 out: "npt.NDArray[np.int64]") -> tuple[int, int, int]: ...  # (pos, n, why)
