from typing import Any

N_TUPLE: int
N_LIST: int
N_DICT: int
N_NAMEDTUPLE: int
N_ARRAY: int
N_OBJECT: int

class Packer:
    def __init__(
        self,
        region: Any,
        data_offset: int,
        slot_bytes: int,
        nslots: int,
        batch_size: int,
        tree: tuple[Any, ...],
        fields: list[tuple[int, int, Any, tuple[int, ...]]],
    ) -> None: ...
    def close(self) -> None: ...
    def pack(self, slot: int, row: int, sample: Any, objects: list[Any]) -> None: ...

class SlotLease:
    slot: int
    def __init__(
        self, region: Any, offset: int, length: int, slot: int, returner: Any = ...
    ) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
