"""The global RNGs (``random``, ``numpy.random``'s legacy functions, torch's default generator)
seeded per sample, so that augmentation drawn from them is reproducible.

NOTE [global RNGs]
torch's habit is augmentation drawn from the global RNGs inside ``__getitem__``
(``random.random()``, ``np.random.rand()``, torchvision's transforms on torch's generator).
torch makes it reproducible run to run, for one ``num_workers``, by seeding each worker from
(base seed, worker id) and giving batch i to worker i % num_workers. fastload's workers claim
batches as they free up (and may share a batch's rows), so a worker's stream of draws would
depend on timing. Instead, the filler seeds the global RNGs before each sample from
(seed, epoch, index), as ``sample_rng()`` does its Generator: a sample's draws are then the same
for any ``num_workers`` (0 included), start method, shared rows, restart or resume.

It costs about 6 us per sample (``random.seed`` ~4 us, ``np.random.seed`` ~2 us), so it is done
only where it matters: ``seed_globals=None`` (the default) seeds the first sample of the
loader (the probe) and the first samples the other workers load, and compares the states after
it with the states seeding left (``fingerprint``); if the sample drew from any of them, every
sample of the loader is seeded, else none (``BatchLayout.global_rng``, decided once, travels to
every worker with the layout). ``seed_globals=True`` seeds every sample (a dataset whose first
sample happens not to draw); ``False`` never (each worker's RNGs are seeded once, from (seed,
worker id), and go on from there). With ``__getitems__`` the batch is one call: the RNGs are
seeded once per batch, from its first index.

With ``num_workers=0`` the samples load in the user's process: the user's RNG states are saved
before a batch and restored after it (``save``/``restore``, ~80 us a batch, only on loaders
that seed), so loading never changes what the training loop draws. Thread workers share their
process's RNGs: they cannot be seeded per sample (a draw of one thread would land between
another's seeding and its draw); ``sample_rng()`` is the way there, and the loader never seeds.
Plain iterables and streams have no sample index: their workers' RNGs are seeded per worker.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

__all__ = ["OFF", "DETECT", "ON", "seed_globals", "fingerprint", "save", "restore", "Seeding",
           "mode_of"]

#: BatchFiller.globals: never seed; seed the first samples and detect; seed every sample
OFF, DETECT, ON = 0, 1, 2

_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finalizer: a 64-bit value whose bits all depend on all of ``z``'s."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_globals(seed: int, epoch: int, index: int) -> None:
    """Seed ``random``, ``numpy.random`` and (if imported) torch's default generator from
    (seed, epoch, index)."""
    x = _mix((_mix((_mix(seed ^ 0x5851F42D4C957F2D) ^ epoch) & _M64) ^ index) & _M64)
    random.seed(x)
    np.random.seed(x >> 32)  # the legacy seed takes 32 bits
    torch = sys.modules.get("torch")
    gen = getattr(torch, "default_generator", None)
    if gen is not None:
        gen.manual_seed(x)


def _torch_state() -> Any:
    gen = getattr(sys.modules.get("torch"), "default_generator", None)
    return None if gen is None else gen.get_state()


def fingerprint() -> tuple[Any, ...]:
    """The global RNGs' states, comparable with ``==``."""
    np_state: Any = np.random.get_state()
    t = _torch_state()
    return (random.getstate(), np_state[1].tobytes(), *np_state[2:],
            None if t is None else t.numpy().tobytes())


def save() -> tuple[Any, Any, Any]:
    return random.getstate(), np.random.get_state(), _torch_state()


def restore(saved: tuple[Any, Any, Any]) -> None:
    py, npy, t = saved
    random.setstate(py)
    np.random.set_state(npy)
    gen = getattr(sys.modules.get("torch"), "default_generator", None)
    if t is not None and gen is not None:
        gen.set_state(t)


class Seeding:
    """A dataset seen through the per-sample seeding of the global RNGs."""

    __slots__ = ("ds", "seed", "epoch")

    def __init__(self, ds: Any, seed: int, epoch: int) -> None:
        self.ds, self.seed, self.epoch = ds, seed, epoch

    def __getitem__(self, index: int) -> Any:
        seed_globals(self.seed, self.epoch, index)
        return self.ds[index]


def mode_of(seed_globals: bool | None, *, threads: bool, iterable: bool) -> int:
    """The BatchFiller.globals of a loader: its ``seed_globals`` option (None: detect), OFF for
    thread workers and plain iterables."""
    if threads or iterable or seed_globals is False:
        return OFF
    return ON if seed_globals else DETECT
