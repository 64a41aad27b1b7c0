# Python-visible API of dqcep._kernels.predicates (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.store import EventStore, ListStore

class BytecodeError(ValueError):
    predicate: int   # index of the offending predicate in the set
    too_deep: bool   # well formed, but deeper than MAX_STACK

class PredicateSet:
    n: int  # idx_t: predicates
    def __init__(
        self,
        code: "npt.NDArray[np.int32]",      # int32_t[:, ::1], shape (ops, 3): (opcode, a, b)
        pred_start: "npt.ArrayLike",        # int64_t[::1], n + 1 offsets into code
        slots: "npt.ArrayLike",             # int64_t[::1]: slots each predicate reads
        slot_start: "npt.ArrayLike",        # int64_t[::1], n + 1 offsets into slots
        cval: "npt.NDArray[np.float64]",    # double[::1]: constants
        ckind: "npt.NDArray[np.int8]",      # int8_t[::1]: their kinds
        ranges: tuple | None = None,        # Kleene lists: (rng_start, rng_slot, rng_mode,
                                            #   ext_start, ext_kind, ext_slot)
    ) -> None: ...  # BytecodeError when the code is not well formed
    reads_lists: bool   # some predicate ranges over a list, reads a list position or aggregates
    def mask(self, st: EventStore,
             recs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.bool_]": ...  # [n, width]
    def mask_lists(self, st: EventStore, ls: ListStore | None,
                   recs: "npt.NDArray[np.int64]",       # [n, width]: events or list handles
                   is_list: "npt.ArrayLike",            # uint8 per slot
                   ) -> "npt.NDArray[np.bool_]": ...
    def check_slots(self, width: int) -> None: ...                      # ValueError
    def check_list_slots(self, is_list: "npt.ArrayLike") -> None: ...  # uint8 per slot; ValueError
    def check_lists_inputs(self, st: EventStore, width: int) -> None: ...  # ValueError
