# Shared C types for every dqcep kernel: use these, never raw int/long.
from libc.stdint cimport int64_t

ctypedef int64_t ts_t      # event time, milliseconds
ctypedef int64_t id_t      # event id
ctypedef Py_ssize_t idx_t  # index / count
