"""The part of fastload.compat.torch that runs in the workers: the dataset wrappers (tensors
to NumPy arrays for fastload's stacking, or to slot-backed leaves for a custom collate_fn) and
the worker initializer that seeds a worker as torch's ``_worker_loop`` does."""

from __future__ import annotations

import os
import pickle
import struct
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterDataPipe

import fastload
from fastload._fill import sample_ctx
from fastload.compat._leaves import encode

__all__ = ["EpochSeeds", "_TorchDataset", "_TorchDatasetGetitems", "_TorchIterable",
           "_WorkerInit", "_tensors_out", "_to_numpy", "keyed_plan"]


def _to_numpy(x: Any) -> Any:
    """Worker side, torch's default collate: tensors -> NumPy arrays, leaves fastload does not
    stack made opaque (fastload/compat/_leaves.py); any tuple, list and dict is walked, as
    torch's collation walks any sequence and mapping."""
    return encode(x, tensor_type=torch.Tensor)


class _Tensor:
    """A tensor leaf of an unstacked sample: its array travels through the slot (fastload's
    pickler finds it: NOTE [unstacked batches] in fastload/_ragged.py) and unpickles, in the
    main process, as ``torch.from_numpy`` of its view: a tensor again, zero-copy."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (torch.from_numpy, (self.array,))


def _tensors_out(x: Any) -> Any:
    """Worker side, a custom collate_fn: each tensor (in tuples, lists, dicts, namedtuples) as a
    _Tensor; everything else as the dataset returned it."""
    t = type(x)
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_quantized or x.is_nested:
            return x  # torch pickles it (a copy through the pipe)
        try:
            return _Tensor(x.detach().cpu().numpy())
        except TypeError:  # a dtype NumPy lacks (bfloat16, ...): torch pickles it
            return x
    if t is dict:
        return {k: _tensors_out(v) for k, v in x.items()}
    if t is list:
        return [_tensors_out(v) for v in x]
    if t is tuple:
        return tuple([_tensors_out(v) for v in x])
    if isinstance(x, tuple) and hasattr(t, "_fields"):
        return t(*[_tensors_out(v) for v in x])
    return x


class _TorchDataset:
    """Picklable wrapper run in the workers: for torch's default collate, samples stacked by
    fastload (tensors as NumPy arrays); ``unstacked`` (a custom collate_fn, batch_size=None),
    samples as the dataset returned them, each tensor's data through the slot."""

    #: On a shared fastload.Pool (NOTE [pool workers]): the worker initializer to run in each
    #: worker before its first sample of this loader (None: it ran when the worker started)
    init: Any = None

    def __init__(self, dataset: Any, unstacked: bool = False) -> None:
        self.dataset = dataset
        self.unstacked = unstacked

    #: NOTE [sampler keys]: the table the indices are codes of (None: they are the indices)
    keys: Any = None

    def __len__(self) -> int:
        return 1 << 62 if self.keys is not None else len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if self.init is not None:
            _start(self)
        if self.keys is None:
            s = self.dataset[index]
        else:
            key = self.keys.key(index)
            try:
                s = self.dataset[key]
            except Exception as e:
                e.add_note(f"(the sampler's index: {key!r:.200})")
                raise
        return _tensors_out(s) if self.unstacked else _to_numpy(s)


# NOTE [pool workers]
# torch starts a DataLoader's workers for it, seeds each from (base seed, worker id), sets its
# get_worker_info() and calls worker_init_fn. A DataLoader on a fastload.Pool (pool=) finds the
# workers running, shared with other loaders: it cannot start them, and the pool's own
# worker_init ran long ago. So each worker does torch's start-up for this DataLoader when it
# first loads one of its samples (the wrapper carries the _WorkerInit; ``init`` is None in the
# main process's copy and once it ran). Two DataLoaders iterated at once on one pool interleave
# their draws from a worker's global RNGs, and torch's get_worker_info().dataset is the one whose
# start-up ran last in that worker: one at a time, a DataLoader on a pool draws what torch's own
# workers would.
def _start(wrapper: Any) -> None:
    info = fastload.get_worker_info()
    if info is None:  # num_workers=0 does not happen on a pool; this process is not a worker
        return
    init, wrapper.init = wrapper.init, None
    init(info.id)


class _TorchIterable:
    """A torch IterableDataset in the workers (a plain iterable for fastload: NOTE [iterable
    datasets] in fastload/_iterable.py): its samples, converted as _TorchDataset's are."""

    def __init__(self, dataset: Any, unstacked: bool = False, base_seed: int = 0) -> None:
        self.dataset = dataset
        self.unstacked = unstacked
        self.base_seed = base_seed
        #: NOTE [datapipes]: each epoch's seed, as DataLoader.__iter__ drew it (a DataPipe's)
        self.seeds = (EpochSeeds() if isinstance(dataset, IterDataPipe)
                      and hasattr(os, "memfd_create") else None)
        self.passes = 0

    init: Any = None  # as _TorchDataset's (NOTE [pool workers])

    def __iter__(self) -> Any:
        if self.init is not None:
            _start(self)
        out = _tensors_out if self.unstacked else _to_numpy
        if isinstance(self.dataset, IterDataPipe):
            self._seed_datapipe()
        return (out(s) for s in self.dataset)

    def _seed_datapipe(self) -> None:
        """NOTE [datapipes]: torch seeds a DataPipe's random operations (its shuffle()) with
        one seed per epoch shared by every worker, so that the workers' sharding_filter()s
        split the same order: its iterator draws the seed from the DataLoader's generator (at
        each iter()) and sends it to each worker with the epoch's first task. Here the main
        process writes each epoch's seed into a table before the epoch starts (EpochSeeds: an
        anonymous file, as the sampler keys', NOTE [sampler keys]), and this replica reads the
        entry of the epoch it is iterating for: fastload's sample context holds that epoch
        whenever the engine calls iter() on a worker's dataset. Each epoch's shuffle is then
        torch's own, with or without workers, persistent or not. Without memfd_create (not
        Linux) the seed is derived from the base seed and the pass number, the same in every
        worker: each epoch's shares are disjoint and complete, but the order is not torch's."""
        if self.seeds is not None:
            seed = self.seeds.get(sample_ctx()[1])
        else:
            seed = int(np.random.SeedSequence([self.base_seed % 2**63, self.passes])
                       .generate_state(1, np.uint64)[0] % 2**63)
        self.passes += 1
        torch.utils.data.graph_settings.apply_random_seed(
            self.dataset, torch.Generator().manual_seed(seed))


class _TorchDatasetGetitems(_TorchDataset):
    """As torch's fetcher does, use the dataset's ``__getitems__`` when it has one."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if self.init is not None:
            _start(self)
        out = _tensors_out if self.unstacked else _to_numpy
        if self.keys is not None:
            indices = [self.keys.key(i) for i in indices]
        return [out(s) for s in self.dataset.__getitems__(indices)]


class _WorkerInit:
    """Seeds a worker as torch's _worker_loop does and publishes torch's get_worker_info()."""

    def __init__(self, base_seed: int, num_workers: int, user_fn: Any,
                 world: tuple[int, int] = (1, 0), threads: bool = False) -> None:
        self.base_seed = base_seed
        self.num_workers = num_workers
        self.user_fn = user_fn
        self.world = world  # (world size, rank) in the main process, for DataPipe sharding
        #: thread workers (a thread pool): the process's thread count and RNGs are the user's
        self.threads = threads

    def __call__(self, worker_id: int) -> None:
        import random

        from torch.utils.data._utils import worker as tworker

        seed = self.base_seed + worker_id
        if not self.threads:
            torch.set_num_threads(1)
            random.seed(seed)
            torch.manual_seed(seed)
            np.random.seed(tworker._generate_state(self.base_seed, worker_id))
        info = fastload.get_worker_info()
        ds = info.dataset if info is not None else None
        if isinstance(ds, (_TorchDataset, _TorchIterable)):
            ds = ds.dataset
        tworker._worker_info = tworker.WorkerInfo(
            id=worker_id, num_workers=self.num_workers, seed=seed, dataset=ds
        )
        if isinstance(ds, IterDataPipe):  # torch's _sharding_worker_init_fn: its
            # sharding_filter()s keep this worker's share (ranks first, then workers)
            world, rank = self.world
            torch.utils.data.graph_settings.apply_sharding(
                ds, self.num_workers * world, worker_id * world + rank)
        if self.user_fn is not None:
            self.user_fn(worker_id)


# NOTE [sampler keys]
# torch passes whatever the sampler yields to ``__getitem__``: keys of a dict-like dataset
# ("k3"), (index, scale) tuples of multi-scale batch samplers, ints past len(dataset) of a
# sparse one, and with a sampler a dataset needs no __len__. fastload's tasks carry int64
# indices, so such an epoch travels as codes: each distinct key is pickled once into an
# anonymous file (memfd) the main process appends to, and its code is (offset << 20 | length).
# The workers' wrapper reads a key back with one pread on the file, opened through
# /proc/<main pid>/fd (fork, spawn, forkserver and threads alike) and unpickles it. A loader that
# has seen such an epoch stays keyed (its plan checks codes against no length); a sample's error
# gets a note naming the key, as fastload's message names the code.
_LEN_BITS = 20


class _SharedFile:
    """An anonymous file (memfd) the main process writes and workers only read, pickled for
    them as (pid, fd): a worker opens it through /proc/<main pid>/fd (fork, spawn, forkserver
    alike); in the main process (thread workers, num_workers=0) it is read as it is."""

    def __init__(self, name: str) -> None:
        self.pid = os.getpid()
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        self.owner = True
        self._read_fd: int | None = None

    def _reader(self) -> int:
        fd = self._read_fd
        if fd is None:
            fd = self._read_fd = (self.fd if os.getpid() == self.pid else
                                  os.open(f"/proc/{self.pid}/fd/{self.fd}",
                                          os.O_RDONLY | os.O_CLOEXEC))
        return fd

    def close(self) -> None:
        if self.owner and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"pid": self.pid, "fd": self.fd}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pid, self.fd = state["pid"], state["fd"]
        self.owner, self._read_fd = False, None

    def __del__(self) -> None:
        if self.owner:  # the main process's table: its file
            self.close()
        elif self._read_fd is not None and self._read_fd != self.fd:
            os.close(self._read_fd)  # a worker's copy: the file it opened


class _Keys(_SharedFile):
    """The main process's table of sampler keys (NOTE [sampler keys]); workers only read."""

    def __init__(self) -> None:
        super().__init__("fastload-keys")
        self.size = 0
        self.codes: dict[bytes, int] = {}

    def code(self, key: Any) -> int:
        data = pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)
        assert self.owner, "workers do not add keys"
        code = self.codes.get(data)
        if code is None:
            if len(data) >= 1 << _LEN_BITS:
                raise ValueError(f"a sampler index pickles to {len(data):,} bytes (at most "
                                 f"{(1 << _LEN_BITS) - 1:,}): {key!r:.80}")
            os.pwrite(self.fd, data, self.size)
            code = self.codes[data] = self.size << _LEN_BITS | len(data)
            self.size += len(data)
        return code

    def key(self, code: int) -> Any:
        n = code & ((1 << _LEN_BITS) - 1)
        return pickle.loads(os.pread(self._reader(), n, code >> _LEN_BITS))


#: An EpochSeeds entry: written (1), the seed (int64)
_SEED = struct.Struct("<q?7x")
#: How long a replica waits for its epoch's seed (written before the epoch starts: only a
#: mispredicted epoch number waits, for the write that follows iter())
_SEED_WAIT_S = 30.0


class EpochSeeds(_SharedFile):
    """NOTE [datapipes]: the seed of each epoch of a DataPipe loader, entry ``epoch`` at
    ``epoch * 16``; written by the main process, read by the replicas (Linux: memfd)."""

    def __init__(self) -> None:
        super().__init__("fastload-seeds")
        self.next_epoch = 0  # the epoch number the loader's next iter() is expected to get

    def start(self, loader: Any, seed: int) -> Any:
        """``iter(loader)``, its epoch's seed written first (before its tasks go out to the
        workers) under the epoch number expected, and again under the one it got if not."""
        self.put(self.next_epoch, seed)
        it = iter(loader)
        if it.epoch != self.next_epoch:
            self.put(it.epoch, seed)
        self.next_epoch = it.epoch + 1
        return it

    def put(self, epoch: int, seed: int) -> None:
        os.pwrite(self.fd, _SEED.pack(seed, True), epoch * _SEED.size)

    def get(self, epoch: int) -> int:
        deadline = time.monotonic() + _SEED_WAIT_S
        while True:
            data = os.pread(self._reader(), _SEED.size, epoch * _SEED.size)
            if len(data) == _SEED.size:
                seed, written = _SEED.unpack(data)
                if written:
                    return int(seed)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"fastload.compat.torch: no DataPipe seed for epoch {epoch} after "
                    f"{_SEED_WAIT_S:.0f} s (NOTE [datapipes]); please report this")
            time.sleep(0.001)


def _is_index(i: Any, n: int | None) -> bool:
    return bool((type(i) is int or isinstance(i, np.integer)) and n is not None and 0 <= i < n)


def keyed_plan(plan: list[list[Any]], keys: _Keys | None, dataset: Any
               ) -> tuple[list[list[Any]], _Keys | None]:
    """NOTE [sampler keys]: ``plan`` as fastload's engine takes it, and the key table (a new one
    the first time an epoch has indices that are not ints in range(len(dataset)))."""
    if keys is None:
        try:
            n: int | None = len(dataset)
        except TypeError:  # no __len__: torch needs none with a sampler
            n = None
        if all(_is_index(i, n) for b in plan for i in b):
            return plan, None
        keys = _Keys()
    code = keys.code
    return [[code(i) for i in b] for b in plan], keys
