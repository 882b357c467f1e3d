# cython: language_level=3
# Slots read where they are: what the compiled modules (``quota._bloomspeed``,
# ``proxy.serving._express``) share to read and write a ``__slots__`` field of a Python object
# without looking its name up (issue "native").
#
# Reading ``obj.name`` from C looks ``name`` up in the type's method cache and walks to its member
# descriptor first: cold, several cache misses per field (cachegrind put ~40-60% of the quota's
# cold misses there; read at their offsets, a third of the lane's cold misses on a known PID's
# request went). A slot of an object whose type is exactly the class the offset was read from
# is at that offset: one line, the object's own. Any other type (a subclass, a stand-in in a
# test) is read by name (``field``).
#
# Inline, so each module that cimports this compiles its own copy: nothing to import at run
# time. Must not hold state, and must not be cimported by ``protocol`` (the wire has no objects
# of pidgate's to read).

from cpython.object cimport Py_TYPE, PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF


cdef extern from "Python.h":
    PyTypeObject PyMemberDescr_Type
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


#: The member type of a ``__slots__`` entry (``T_OBJECT_EX``, ``Py_T_OBJECT_EX`` from 3.12: 16
#: in every version; structmember.h, which names it before 3.12, is not part of Python.h).
cdef enum:
    T_OBJECT_EX = 16


cdef inline Py_ssize_t slot_offset(type cls, str name) except -1:
    """Where ``cls``'s slot ``name`` is in its instances (its member descriptor's offset)."""
    descriptor = cls.__dict__.get(name)
    if descriptor is None or Py_TYPE(descriptor) != &PyMemberDescr_Type:
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef* member = (<PyMemberDescrObject*><PyObject*>descriptor).d_member
    if member.type != T_OBJECT_EX or member.offset < <Py_ssize_t>sizeof(PyObject):
        raise TypeError(f"{cls.__name__}.{name} is not an object slot")
    return member.offset


cdef inline object slot(object obj, Py_ssize_t offset):
    """The slot at ``offset`` of ``obj`` (whose exact type the offset was read from)."""
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
    if value is NULL:
        raise AttributeError(f"a slot of {type(obj).__name__} is not set")
    return <object>value


cdef inline void put(object obj, Py_ssize_t offset, object value) noexcept:
    """Set the slot at ``offset`` of ``obj`` (as its member descriptor's ``__set__`` would)."""
    cdef PyObject** where = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = where[0]
    Py_INCREF(value)
    where[0] = <PyObject*>value
    Py_XDECREF(old)


cdef inline object field(object obj, type cls, Py_ssize_t offset, str name):
    """``obj.<name>``: read at ``offset`` when ``obj`` is exactly a ``cls``, else by name."""
    if type(obj) is cls:
        return slot(obj, offset)
    return getattr(obj, name)
