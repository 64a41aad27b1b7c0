# Python-visible API of dqcep._kernels.map_decode (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.msgpack_decode import ColumnDecoder

DETECT: int     # a rule without a format: a JSON object, else a bare value
JSON: int
VALUE: int
DONE: int       # decode read every record
NEW_TOPIC: int  # the record's topic is not registered yet
PYTHON: int     # the record is for the map in Python
FULL: int       # encode: the output cannot hold the next event

class MapDecoder:
    n_topics: int  # idx_t
    def __init__(self, decoder: ColumnDecoder, events_column: int = -1) -> None: ...
    def register(self, topic: bytes, type_code: int | None, fmt: int,
                 levels: list[tuple[int, str, str]],  # (column or -1, name, value)
                 type_name: str = "") -> None: ...
    def decode(self, data: bytes, first: int, spans: "npt.NDArray[np.int64]", start: int,
               rows: "npt.NDArray[np.int64]") -> tuple[int, int]: ...  # (record, why)
    def encode(self, data: bytes, first: int, spans: "npt.NDArray[np.int64]", start: int,
               out: "npt.NDArray[np.uint8]", at: int, ends: "npt.NDArray[np.int64]",
               ids: "npt.NDArray[np.int64]", ts: "npt.NDArray[np.int64]"
               ) -> tuple[int, int, int]: ...  # (record, why, byte after the last event)

def recode(types: "npt.NDArray[np.int32]", val: "npt.NDArray[np.float64]",
           kind: "npt.NDArray[np.int8]", type_map: "npt.NDArray[np.int32]",
           columns: "npt.NDArray[np.int64]", strings: "npt.NDArray[np.int64]"
           ) -> tuple["npt.NDArray[np.int32]", "npt.NDArray[np.float64]",
                      "npt.NDArray[np.int8]"] | None: ...  # None: a string not coded yet
