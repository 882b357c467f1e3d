# The C-level entry points of ``_speedups`` other compiled modules cimport (the express lane,
# ``pidgate.proxy.serving._express``): the Produce walk and the Produce response check, on a
# pointer and a length the caller has bounds-checked.
from libc.stdint cimport int16_t, uint8_t

cdef int _walk(
    const uint8_t* p, Py_ssize_t end, int api_version, int16_t* acks_out, list producer_ids
) except -1

cdef bint _produce_response_passes(
    const uint8_t* p, Py_ssize_t end, int api_version
) noexcept nogil
