# The kernels' one hash table (as pandas' khash is theirs): int64 keys -> int64 values
# >= 0, open addressing with linear probing, at most half full, backward-shift deletion
# (no tombstones). Keys are spread by splitmix64's finaliser, so consecutive ids and keys
# fill a power-of-two table evenly. Users: the KeyedQueue index (key -> newest position),
# RecentIds (a set: value 0), the SASE baseline's partitions (key -> partition) and
# BytesTable (hash of a byte string -> its entry). Tables are rebuilt from their keys on
# load, so neither the layout nor the mixer reaches a snapshot. (cell_hash in store.pyx is
# not a table hash: it makes the partition keys that queues store and snapshots keep.)
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc

from dqcep._kernels._types cimport idx_t


cdef struct Int64Slot:
    int64_t key
    int64_t value      # -1 marks an empty slot


cdef struct Int64Table:
    Int64Slot* slots   # key and value side by side: a probe reads one cache line
    idx_t mask         # slots - 1; slots is a power of two >= 16
    idx_t used         # occupied slots


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    x += <uint64_t>0x9e3779b97f4a7c15
    x = (x ^ (x >> 30)) * <uint64_t>0xbf58476d1ce4e5b9
    x = (x ^ (x >> 27)) * <uint64_t>0x94d049bb133111eb
    return x ^ (x >> 31)


cdef inline int table_init(Int64Table* t, idx_t slots) except -1 nogil:
    """Make ``t`` an empty table of at least ``slots`` slots. On failure MemoryError is
    raised and ``t`` is not touched (so a table being replaced stays valid)."""
    cdef idx_t cap = 16, i
    cdef Int64Slot* block
    while cap < slots:
        cap <<= 1
    block = <Int64Slot*>malloc(cap * sizeof(Int64Slot))
    if block == NULL:
        with gil:
            raise MemoryError(f"could not allocate a hash table of {cap} slots")
    for i in range(cap):
        block[i].value = -1
    t.slots, t.mask, t.used = block, cap - 1, 0
    return 0


cdef inline void table_free(Int64Table* t) noexcept nogil:
    free(t.slots)
    t.slots, t.mask, t.used = NULL, 0, 0


cdef inline idx_t table_slot(const Int64Table* t, int64_t key) noexcept nogil:
    """The slot holding ``key``, or the empty slot where it would go."""
    cdef idx_t i = <idx_t>(mix64(<uint64_t>key) & <uint64_t>t.mask)
    while t.slots[i].value >= 0 and t.slots[i].key != key:
        i = (i + 1) & t.mask
    return i


cdef inline int64_t table_get(const Int64Table* t, int64_t key) noexcept nogil:
    """The value of ``key``, or -1 when it is absent."""
    return t.slots[table_slot(t, key)].value


cdef inline int table_resize(Int64Table* t, idx_t slots) except -1 nogil:
    """Rehash every entry into a fresh table of at least ``slots`` slots."""
    cdef Int64Table fresh
    cdef idx_t i
    table_init(&fresh, slots)
    for i in range(t.mask + 1):
        if t.slots[i].value >= 0:
            fresh.slots[table_slot(&fresh, t.slots[i].key)] = t.slots[i]
            fresh.used += 1
    table_free(t)
    t[0] = fresh
    return 0


cdef inline int table_set(Int64Table* t, int64_t key, int64_t value) except -1 nogil:
    """``key -> value`` (``value >= 0``), inserted or overwritten; the table doubles
    before it would be more than half full."""
    cdef idx_t i = table_slot(t, key)
    if t.slots[i].value < 0:
        if 2 * (t.used + 1) > t.mask + 1:
            table_resize(t, 2 * (t.mask + 1))
            i = table_slot(t, key)
        t.slots[i].key = key
        t.used += 1
    t.slots[i].value = value
    return 0


cdef inline void table_remove(Int64Table* t, int64_t key) noexcept nogil:
    """Drop ``key`` if present, shifting back the rest of its probe run."""
    cdef idx_t i = table_slot(t, key), j = i, home
    if t.slots[i].value < 0:
        return
    while True:
        j = (j + 1) & t.mask
        if t.slots[j].value < 0:
            break
        home = <idx_t>(mix64(<uint64_t>t.slots[j].key) & <uint64_t>t.mask)
        if ((j - home) & t.mask) >= ((j - i) & t.mask):   # entry j may move into the hole
            t.slots[i] = t.slots[j]
            i = j
    t.slots[i].value = -1
    t.used -= 1
