# cython: language_level=3, freethreading_compatible=True, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True, embedsignature=True
"""Packing samples into slot rows, and the lease that lends a slot to the user.

``Packer`` walks a sample alongside the layout computed from the first sample (see
fastload/layout.py), checks every leaf's type, dtype and shape against it, and copies each
array leaf into its row of the slot with one bounds-checked memcpy (GIL released for large
copies). Non-contiguous, Fortran-ordered and byte-swapped arrays take a NumPy copy into the
same row. Nothing is ever written outside the slot: the byte count of every copy is checked
against the field's row size and the slot's bounds before the copy.
"""
cimport cython
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBuffer_FillInfo,
                             PyBUF_WRITABLE, PyBUF_SIMPLE)

from cpython.dict cimport PyDict_GetItemWithError
from cpython.object cimport PyObject

from fastload._cdefs cimport fl_pack_copy, fl_pack_gather, FL_OK

import numpy as np

from fastload.errors import LayoutMismatchError, SampleTooLargeError

cdef object _ndarray = np.ndarray
cdef object _asarray = np.asarray
cdef object _copyto = np.copyto
cdef object _generic = np.generic

# Leaf kinds for the scalar fast path.
cdef enum:
    K_OTHER = 0
    K_INT64 = 1
    K_FLOAT64 = 2
    K_BOOL = 3
    NOGIL_BYTES = 65536  # release the GIL for copies at least this large

# Node kinds of the tree spec built by fastload.layout (kept as small tuples).
N_TUPLE = 0
N_LIST = 1
N_DICT = 2
N_NAMEDTUPLE = 3
N_ARRAY = 4
N_OBJECT = 5


cdef inline bint _needs_swap(adt, dt, str path) except -1:
    """True if ``adt`` is ``dt`` in the other byte order (NumPy swaps while copying); raise
    LayoutMismatchError if it is another type altogether."""
    if adt is dt or adt == dt:
        return False
    if adt.hasobject or adt.newbyteorder("=") != dt:
        raise LayoutMismatchError(f"{path}: expected dtype {dt} (as in the first sample), got {adt}")
    return True


# Appended to the errors of a sample whose structure differs from the first sample's.
_STRUCTURE_HINT = ("; if the structure varies from sample to sample, load batches as lists "
                   "of samples: fastload.Loader(..., stack=False), or a collate_fn with "
                   "fastload.compat.torch.DataLoader")


def _describe(value):
    if isinstance(value, np.ndarray):
        return f"array(dtype={value.dtype}, shape={value.shape})"
    return type(value).__name__


cdef class Packer:
    """Writes samples into rows of slots inside one writable region buffer.

    Parameters
    ----------
    region : writable buffer
        The whole shared region (kept exported while the packer lives).
    data_offset, slot_bytes, nslots : int
        Where slot payloads start, their size and count.
    batch_size : int
        Rows per slot.
    tree : tuple
        The nested spec from :class:`fastload.layout.BatchLayout` (``layout.tree``).
    fields : list of (offset, row_bytes, dtype, shape)
        One entry per array leaf, offsets relative to the slot payload.
    """
    cdef Py_buffer _view
    cdef bint _has_view
    cdef object _region
    cdef char *_base
    cdef Py_ssize_t _len
    cdef Py_ssize_t _data_offset, _slot_bytes, _nslots, _batch_size
    cdef object _tree
    cdef list _offsets, _row_bytes, _dtypes, _shapes, _kinds
    # NOTE [free threading]: calls in a copy (GIL released); a close() meanwhile is deferred
    cdef int _inside
    cdef bint _close_pending

    def __cinit__(self, region, Py_ssize_t data_offset, Py_ssize_t slot_bytes,
                  Py_ssize_t nslots, Py_ssize_t batch_size, tree, fields):
        PyObject_GetBuffer(region, &self._view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        self._has_view = True
        self._region = region
        self._base = <char *>self._view.buf
        self._len = self._view.len
        if (data_offset < 0 or slot_bytes < 0 or nslots < 0 or batch_size < 1
                or (slot_bytes > 0 and nslots > (self._len - data_offset) // slot_bytes)
                or data_offset > self._len):
            raise ValueError("slot area does not fit in the region")
        self._data_offset = data_offset
        self._slot_bytes = slot_bytes
        self._nslots = nslots
        self._batch_size = batch_size
        self._tree = tree
        self._offsets, self._row_bytes, self._dtypes, self._shapes, self._kinds = [], [], [], [], []
        for off, rb, dt, shape in fields:
            dt = np.dtype(dt)
            if dt.hasobject:
                raise ValueError("object dtypes cannot be packed as raw bytes")
            expected_rb = dt.itemsize
            for d in shape:
                if d < 0:
                    raise ValueError(f"negative dimension in field shape {shape}")
                expected_rb *= d
            if rb != expected_rb:
                raise ValueError(
                    f"field row_bytes={rb} does not match dtype {dt} x shape {tuple(shape)} "
                    f"({expected_rb} bytes)")
            if off < 0 or rb < 0 or off + rb * batch_size > slot_bytes:
                raise ValueError(f"field at offset {off} ({rb} bytes/row) overflows the slot")
            self._offsets.append(off)
            self._row_bytes.append(rb)
            self._dtypes.append(dt)
            self._shapes.append(tuple(shape))
            kind = K_OTHER
            if shape == ():
                if dt == np.dtype(np.int64):
                    kind = K_INT64
                elif dt == np.dtype(np.float64):
                    kind = K_FLOAT64
                elif dt == np.dtype(np.bool_):
                    kind = K_BOOL
            self._kinds.append(kind)

    def __dealloc__(self):
        if self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False

    @cython.critical_section
    def close(self):
        """Drop the region export (idempotent; deferred while another thread copies)."""
        self._base = NULL
        if self._inside:
            self._close_pending = True
        elif self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False

    cdef inline void _leave(self) noexcept:
        self._inside -= 1
        if self._close_pending and self._inside == 0 and self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False
            self._close_pending = False

    @cython.critical_section
    def pack(self, Py_ssize_t slot, Py_ssize_t row, sample, list objects):
        """Write ``sample`` into row ``row`` of slot ``slot``.

        Object leaves are appended to ``objects`` in tree order (the caller pickles them once
        per batch). Raises LayoutMismatchError when the sample does not match the layout.
        """
        if self._base == NULL:
            raise ValueError("the packer is closed")
        if slot < 0 or slot >= self._nslots:
            raise IndexError(f"slot {slot} out of range [0, {self._nslots})")
        if row < 0 or row >= self._batch_size:
            raise IndexError(f"row {row} out of range [0, {self._batch_size})")
        cdef char *slot_base = self._base + self._data_offset + slot * self._slot_bytes
        self._inside += 1
        try:
            self._walk(self._tree, sample, slot_base, row, objects)
        finally:
            self._leave()

    @cython.critical_section
    def pack_batch(self, Py_ssize_t slot, batch, Py_ssize_t count):
        """Write an already-stacked batch (the sample structure with every array leaf of shape
        ``(count, *field_shape)``) into rows ``[0, count)`` of slot ``slot``."""
        if self._base == NULL:
            raise ValueError("the packer is closed")
        if slot < 0 or slot >= self._nslots:
            raise IndexError(f"slot {slot} out of range [0, {self._nslots})")
        if count < 1 or count > self._batch_size:
            raise IndexError(f"count {count} out of range [1, {self._batch_size}]")
        cdef char *slot_base = self._base + self._data_offset + slot * self._slot_bytes
        self._inside += 1
        try:
            self._walk(self._tree, batch, slot_base, 0, None, count)
        finally:
            self._leave()

    @cython.critical_section
    def gather(self, Py_ssize_t slot, Py_ssize_t leaf, source, indices, Py_ssize_t row0=0):
        """Copy rows ``source[indices]`` into field ``leaf`` of slot ``slot`` in C, GIL released,
        as the batch's rows ``row0, row0 + 1, ...``.

        ``source`` is a C-contiguous array (or np.memmap) whose rows have the field's dtype and
        shape; ``indices`` a C-contiguous int64 array of at most ``batch_size - row0`` entries.
        An index outside ``[0, len(source))`` raises IndexError naming it; nothing is written
        outside the field's rows of the slot.
        """
        if self._base == NULL:
            raise ValueError("the packer is closed")
        if slot < 0 or slot >= self._nslots:
            raise IndexError(f"slot {slot} out of range [0, {self._nslots})")
        if leaf < 0 or leaf >= len(self._offsets):
            raise IndexError(f"field {leaf} out of range")
        dt = self._dtypes[leaf]
        if source.dtype != dt or tuple(source.shape[1:]) != self._shapes[leaf]:
            raise LayoutMismatchError(
                f"field {leaf}: source rows are {source.dtype} {tuple(source.shape[1:])}, the "
                f"layout expects {dt} {self._shapes[leaf]}")
        cdef Py_ssize_t rb = self._row_bytes[leaf]
        cdef Py_ssize_t off = self._offsets[leaf]
        cdef const int64_t[::1] idx = indices
        cdef Py_ssize_t n = idx.shape[0]
        if row0 < 0 or n > self._batch_size - row0:
            raise IndexError(f"{n} indices from row {row0} for a batch of {self._batch_size}")
        off += row0 * rb
        cdef char *slot_base = self._base + self._data_offset + slot * self._slot_bytes
        cdef Py_buffer src
        cdef size_t bad = 0
        cdef int rc
        cdef size_t nrows = <size_t>source.shape[0]
        PyObject_GetBuffer(source, &src, PyBUF_SIMPLE)  # raises for non-contiguous sources
        self._inside += 1
        try:
            if rb > 0 and <size_t>src.len != nrows * <size_t>rb:
                raise ValueError("source buffer size disagrees with its shape")
            if n == 0:
                return
            with nogil:
                rc = fl_pack_gather(slot_base, <size_t>self._slot_bytes, <size_t>off, src.buf,
                                    nrows, <size_t>rb, &idx[0], <size_t>n, &bad)
        finally:
            PyBuffer_Release(&src)
            self._leave()
        if rc != FL_OK:
            if bad < <size_t>n and (idx[bad] < 0 or <size_t>idx[bad] >= nrows):
                raise IndexError(f"index {idx[bad]} is out of range for {nrows} rows")
            raise SampleTooLargeError(f"field {leaf}: gather out of bounds (code {rc})")

    cdef int _put_rows(self, Py_ssize_t leaf, value, char *slot_base, Py_ssize_t nrows,
                       str path) except -1:
        dt = self._dtypes[leaf]
        value = _asarray(value)
        cdef bint slow = _needs_swap(value.dtype, dt, path)
        shape = (nrows,) + self._shapes[leaf]
        if value.shape != shape:
            raise LayoutMismatchError(
                f"{path}: expected a stacked batch of shape {shape}, got {value.shape}")
        return self._copy_in(value, slot_base + <Py_ssize_t>self._offsets[leaf],
                             nrows * <Py_ssize_t>self._row_bytes[leaf], shape, dt, slow, path)

    cdef int _copy_in(self, value, char *dst, Py_ssize_t nbytes, tuple shape, dt, bint slow,
                      str path) except -1:
        """Copy ``value`` (already checked against dtype and shape) to ``dst``: one bounds-checked
        memcpy (GIL released when large) if C-contiguous and native, else NumPy's copy."""
        cdef Py_buffer src
        cdef int rc
        if not slow:
            try:
                PyObject_GetBuffer(value, &src, PyBUF_SIMPLE)
            except (BufferError, ValueError):
                slow = True  # not C-contiguous (NumPy raises ValueError for that)
        if slow:
            _copyto(_ndarray(shape, dt, buffer=self._region, offset=(dst - self._base)), value,
                    casting="equiv")
            return 0
        try:
            if src.len != nbytes:
                raise SampleTooLargeError(
                    f"{path}: {src.len} bytes do not match the field's {nbytes} bytes")
            if nbytes >= NOGIL_BYTES:
                with nogil:
                    rc = fl_pack_copy(dst, <size_t>nbytes, 0, src.buf, <size_t>src.len)
            else:
                rc = fl_pack_copy(dst, <size_t>nbytes, 0, src.buf, <size_t>src.len)
            if rc != FL_OK:
                raise SampleTooLargeError(f"{path}: copy out of bounds")
        finally:
            PyBuffer_Release(&src)
        return 0

    cdef int _walk(self, tuple node, value, char *slot_base, Py_ssize_t row,
                   list objects, Py_ssize_t nrows=0) except -1:
        cdef int kind = node[0]
        cdef Py_ssize_t i, n
        if kind == N_ARRAY:
            if nrows:
                return self._put_rows(<Py_ssize_t>node[2], value, slot_base, nrows, node[1])
            return self._put(<Py_ssize_t>node[2], value, slot_base, row, node[1])
        if kind == N_OBJECT:
            if nrows:
                raise LayoutMismatchError(
                    f"{node[1]}: an already-stacked batch from __getitems__ cannot carry Python "
                    "objects; return a list of samples instead")
            objects.append(value)
            return 0
        children = node[2]
        n = len(children)
        if kind == N_TUPLE or kind == N_LIST or kind == N_NAMEDTUPLE:
            expected_type = tuple if kind != N_LIST else list
            if not isinstance(value, expected_type):
                raise LayoutMismatchError(
                    f"{node[1]}: expected a {expected_type.__name__} (as in the first sample), "
                    f"got {_describe(value)}{_STRUCTURE_HINT}")
            if len(value) != n:
                raise LayoutMismatchError(
                    f"{node[1]}: expected a {expected_type.__name__} of length {n} (as in the "
                    f"first sample), got length {len(value)}{_STRUCTURE_HINT}")
            for i in range(n):
                self._walk(<tuple>children[i], value[i], slot_base, row, objects, nrows)
            return 0
        # N_DICT: node = (kind, path, children, keys)
        keys = node[3]
        if not isinstance(value, dict):
            raise LayoutMismatchError(
                f"{node[1]}: expected a dict (as in the first sample), got {_describe(value)}"
                f"{_STRUCTURE_HINT}")
        if len(value) != n:
            missing = [k for k in keys if k not in value]
            extra = [k for k in value if k not in keys]
            raise LayoutMismatchError(
                f"{node[1]}: dict keys differ from the first sample's: missing {missing}, "
                f"unexpected {extra}{_STRUCTURE_HINT}")
        cdef PyObject *got
        for i in range(n):
            k = keys[i]
            # The dict's own table, never value[k]: a defaultdict (or any __missing__) would
            # insert the key and hand back a made-up value instead of saying it is missing.
            got = PyDict_GetItemWithError(value, k)
            if got == NULL:
                missing = [k for k in keys if k not in value]
                extra = [k for k in value if k not in keys]
                raise LayoutMismatchError(
                    f"{node[1]}: dict keys differ from the first sample's: missing {missing}, "
                    f"unexpected {extra}{_STRUCTURE_HINT}") from None
            self._walk(<tuple>children[i], <object>got, slot_base, row, objects, nrows)
        return 0

    cdef int _put(self, Py_ssize_t leaf, value, char *slot_base, Py_ssize_t row,
                  str path) except -1:
        cdef Py_ssize_t off = self._offsets[leaf]
        cdef Py_ssize_t rb = self._row_bytes[leaf]
        cdef char *dst = slot_base + off + row * rb
        cdef int kind = self._kinds[leaf]
        cdef type t = type(value)
        cdef long long iv
        cdef Py_buffer src
        cdef int rc
        dt = self._dtypes[leaf]
        # Scalar fast paths: the layout said int64 / float64 / bool, and a Python scalar came.
        if kind == K_INT64 and t is int:
            try:
                iv = value
            except OverflowError:
                raise LayoutMismatchError(
                    f"{path}: the integer {value} does not fit in int64") from None
            (<int64_t *>dst)[0] = iv
            return 0
        if kind == K_FLOAT64 and t is float:
            (<double *>dst)[0] = value
            return 0
        if kind == K_BOOL and t is bool:
            (<uint8_t *>dst)[0] = 1 if value else 0
            return 0
        if (t is complex and dt.kind == "c" and dt.itemsize == 16 and dt.isnative
                and not self._shapes[leaf]):  # the layout made complex128 of a Python complex
            (<double *>dst)[0] = value.real
            (<double *>dst)[1] = value.imag
            return 0
        if t is not _ndarray:
            if t is int or t is float or t is bool or t is complex:
                raise LayoutMismatchError(
                    f"{path}: expected {dt} with shape {self._shapes[leaf]} (as in the first "
                    f"sample), got a Python {t.__name__}")
            if isinstance(value, (str, bytes)) or value is None:
                raise LayoutMismatchError(
                    f"{path}: expected an array of {dt} (as in the first sample), got "
                    f"{_describe(value)}")
            if isinstance(value, _generic):
                shape = ()  # NumPy scalars export their bytes directly: no asarray
            else:
                value = _asarray(value)
                shape = value.shape
        else:
            shape = value.shape
        cdef bint slow = _needs_swap(value.dtype, dt, path)
        if shape != self._shapes[leaf]:
            hint = ""
            if len(shape) == len(self._shapes[leaf]) >= 1:
                hint = (f"; if its shape varies from sample to sample, declare it ragged: "
                        f"Loader(..., ragged={{{path!r}: 'pad'}}) (or 'list', 'packed')")
            err = LayoutMismatchError(
                f"{path}: expected shape {self._shapes[leaf]} (as in the first sample), got "
                f"{shape}{hint}")
            err.shape_mismatch = (path, self._shapes[leaf], shape)
            raise err
        return self._copy_in(value, dst, rb, shape, dt, slow, path)

cdef class SlotLease:
    """Owner (``.base``) of the arrays of one zero-copy batch.

    It exports the slot's bytes as a writable buffer and keeps the shared region mapped. When the
    last array of the batch is garbage-collected the lease dies and hands the slot back
    (``returner.release(slot)``), so the slot is never reused while any of its arrays lives.
    """
    cdef Py_buffer _view
    cdef bint _has_view
    cdef char *_ptr
    cdef Py_ssize_t _len
    cdef readonly Py_ssize_t slot
    cdef object _returner

    def __cinit__(self, region, Py_ssize_t offset, Py_ssize_t length, Py_ssize_t slot,
                  returner=None):
        PyObject_GetBuffer(region, &self._view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        self._has_view = True
        if offset < 0 or length < 0 or offset > self._view.len or length > self._view.len - offset:
            raise ValueError("lease range outside the region")
        self._ptr = <char *>self._view.buf + offset
        self._len = length
        self.slot = slot
        self._returner = returner

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self._ptr, self._len, 0, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __len__(self):
        return self._len

    def __dealloc__(self):
        returner = self._returner
        self._returner = None
        if returner is not None:
            try:
                returner.release(self.slot)
            except BaseException:
                pass
        if self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False


from libc.stdlib cimport malloc, free
from libc.string cimport memset


cdef Py_buffer *_buffers(list arrays, Py_ssize_t *got) except NULL:
    """The buffers of the C-contiguous ``arrays`` (BufferError for one that is not); release
    them with _release. On an error, those taken so far are released here."""
    cdef Py_ssize_t n = len(arrays), i
    cdef Py_buffer *src = <Py_buffer *>malloc(sizeof(Py_buffer) * (n if n else 1))
    if src == NULL:
        raise MemoryError()
    got[0] = 0
    try:
        for i in range(n):
            PyObject_GetBuffer(arrays[i], &src[i], PyBUF_SIMPLE)
            got[0] += 1
    except BaseException:
        _release(src, got[0])
        raise
    return src


cdef void _release(Py_buffer *src, Py_ssize_t got) noexcept:
    cdef Py_ssize_t i
    for i in range(got):
        PyBuffer_Release(&src[i])
    free(src)


def write_rows(object dest, Py_ssize_t start, list arrays, Py_ssize_t row_bytes, bytes pad):
    """Copy the bytes of C-contiguous ``arrays`` into ``dest[start:]``, one after the other
    (``row_bytes`` 0: concatenated, as ragged "list" and "packed" leaves are) or each at the
    start of a row of ``row_bytes`` whose rest is filled with ``pad`` (the bytes of one item;
    ragged "pad" leaves of one dimension). Returns the bytes written. Every copy is checked
    against ``dest``'s size and the row's before any byte is written; the copies run with the
    GIL released."""
    cdef Py_buffer d
    cdef Py_ssize_t n = len(arrays), i, off, total = 0, ln, plen = len(pad), got = 0, k, rest
    cdef Py_buffer *src = NULL
    cdef const char *pbytes = pad
    cdef bint zero_pad = True
    cdef char *p
    if start < 0 or row_bytes < 0:
        raise ValueError("start and row_bytes must be >= 0")
    if row_bytes and n and (not plen or row_bytes % plen):
        raise ValueError(f"row_bytes={row_bytes} is not a multiple of the pad's {plen} bytes")
    for i in range(plen):
        if pbytes[i] != 0:
            zero_pad = False
    PyObject_GetBuffer(dest, &d, PyBUF_WRITABLE)
    try:
        src = _buffers(arrays, &got)
        for i in range(n):
            ln = src[i].len
            if row_bytes and ln > row_bytes:
                raise ValueError(f"array {i}: {ln} bytes do not fit a row of {row_bytes}")
            total += row_bytes if row_bytes else ln
        if start > d.len or total > d.len - start:
            raise ValueError(f"{total} bytes at offset {start} overflow a buffer of {d.len}")
        with nogil:
            off = start
            for i in range(n):
                p = <char *>d.buf + off
                ln = src[i].len
                if ln:
                    memcpy(p, src[i].buf, ln)
                if row_bytes:
                    rest = row_bytes - ln
                    if zero_pad:
                        memset(p + ln, 0, rest)
                    else:
                        k = 0
                        while k < rest:
                            memcpy(p + ln + k, pbytes, plen)
                            k += plen
                    off += row_bytes
                else:
                    off += ln
        return total
    finally:
        if src != NULL:
            _release(src, got)
        PyBuffer_Release(&d)


def write_at(object dest, Py_ssize_t start, list arrays, const int64_t[::1] offsets):
    """Copy the bytes of each C-contiguous ``arrays[i]`` to ``dest[start + offsets[i]:]``.
    ``offsets`` must be increasing with room for each array before the next, and every copy
    inside ``dest``: all is checked before any byte is written; the copies run with the GIL
    released. Returns the end of the last copy, relative to ``start``."""
    cdef Py_buffer d
    cdef Py_ssize_t n = len(arrays), i, end = 0, got = 0
    cdef Py_buffer *src = NULL
    if start < 0:
        raise ValueError("start must be >= 0")
    if offsets.shape[0] != n:
        raise ValueError(f"{offsets.shape[0]} offsets for {n} arrays")
    PyObject_GetBuffer(dest, &d, PyBUF_WRITABLE)
    try:
        src = _buffers(arrays, &got)
        for i in range(n):
            if offsets[i] < end:
                raise ValueError(f"array {i} at offset {offsets[i]} overlaps the one before "
                                 f"(which ends at {end})")
            end = offsets[i] + src[i].len
        if start > d.len or end > d.len - start:
            raise ValueError(f"{end} bytes at offset {start} overflow a buffer of {d.len}")
        with nogil:
            for i in range(n):
                if src[i].len:
                    memcpy(<char *>d.buf + start + offsets[i], src[i].buf, src[i].len)
        return end
    finally:
        if src != NULL:
            _release(src, got)
        PyBuffer_Release(&d)
