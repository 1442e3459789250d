"""fastload: a fast, dependable multiprocess data loader for NumPy pipelines.

Importing fastload does no work: no shared memory, no processes, no atexit hooks.
"""

from __future__ import annotations

from ._fill import WorkerInfo, get_worker_info, sample_rng
from ._pool import Pool
from ._ragged import Packed, Padded
from ._version import __version__
from .arrays import ArrayDataset
from .errors import (
    FastloadError,
    LayoutMismatchError,
    LoaderClosedError,
    LoaderTimeoutError,
    SampleTooLargeError,
    SkipLimitError,
    WorkerDied,
    WorkerError,
)
from .layout import BatchLayout, Field
from .loader import Loader, backend
from .shared import SharedDict, SharedList
from .stream import NpyShards, ShardedStream
from .tokens import TokenBudget

__all__ = [
    "Loader",
    "Pool",
    "ArrayDataset",
    "BatchLayout",
    "Field",
    "Padded",
    "Packed",
    "SharedList",
    "SharedDict",
    "ShardedStream",
    "NpyShards",
    "TokenBudget",
    "WorkerInfo",
    "get_worker_info",
    "sample_rng",
    "FastloadError",
    "LayoutMismatchError",
    "LoaderClosedError",
    "LoaderTimeoutError",
    "SampleTooLargeError",
    "SkipLimitError",
    "WorkerDied",
    "WorkerError",
    "backend",
    "doctor",
    "__version__",
]


def __getattr__(name: str) -> object:
    if name == "doctor":  # imported when first used (NOTE [doctor] in _doctor.py)
        from ._doctor import doctor

        return doctor
    if name == "WorkerCrashedError":  # deprecated alias of WorkerDied (fastload.errors)
        from . import errors

        return errors.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
