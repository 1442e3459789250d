"""Type stubs for the compiled packer (fastload/_pack.pyx); checked by mypy.stubtest."""

import sys
from typing import Any, Self

from typing_extensions import disjoint_base

N_TUPLE: int
N_LIST: int
N_DICT: int
N_NAMEDTUPLE: int
N_ARRAY: int
N_OBJECT: int

@disjoint_base
class Packer:
    # A cdef class takes its constructor arguments in __cinit__, i.e. in tp_new.
    def __new__(
        cls,
        region: Any,
        data_offset: int,
        slot_bytes: int,
        nslots: int,
        batch_size: int,
        tree: tuple[Any, ...],
        fields: list[tuple[int, int, Any, tuple[int, ...]]],
    ) -> Self: ...
    def close(self) -> None: ...
    def pack(self, slot: int, row: int, sample: Any, objects: list[Any]) -> None: ...
    def pack_batch(self, slot: int, batch: Any, count: int) -> None: ...
    def gather(self, slot: int, leaf: int, source: Any, indices: Any, row0: int = 0) -> None: ...

def write_rows(dest: Any, start: int, arrays: list[Any], row_bytes: int, pad: bytes) -> int: ...
def write_at(dest: Any, start: int, arrays: list[Any], offsets: Any) -> int: ...

@disjoint_base
class SlotLease:
    @property
    def slot(self) -> int: ...  # ``cdef readonly``
    def __new__(
        cls, region: Any, offset: int, length: int, slot: int, returner: Any = ...
    ) -> Self: ...
    def __len__(self) -> int: ...
    # The buffer protocol (__getbuffer__/__releasebuffer__) shows up as methods from 3.12 on.
    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int, /) -> memoryview: ...
        def __release_buffer__(self, buffer: memoryview, /) -> None: ...
