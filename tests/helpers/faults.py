"""Datasets whose workers die (signal, exit, segfault) or hang, at a chosen index."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

import numpy as np

from . import claim, silence_stderr


class KillFirstTimes:
    """Index ``bad`` SIGKILLs its worker the first ``times`` times it is loaded (claims of the
    flag ``flag_dir``/kill, shared by every worker)."""

    def __init__(self, n: int, bad: int, times: int, flag_dir: str) -> None:
        self.n, self.bad, self.times, self.flag_dir = n, bad, times, flag_dir

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i == self.bad and claim(f"{self.flag_dir}/kill", self.times):
            silence_stderr()
            os.kill(os.getpid(), signal.SIGKILL)
        return i, os.getpid()


class Steady:
    """Every sample takes ``delay`` seconds: each batch is quick, the epoch is long."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i


class LiesAboutLen:
    """Claims ``claimed`` samples but only has ``real``."""

    def __init__(self, claimed: int, real: int) -> None:
        self.claimed, self.real = claimed, real

    def __len__(self) -> int:
        return self.claimed

    def __getitem__(self, i: int) -> np.ndarray:
        if i >= self.real:
            raise IndexError(f"index {i} out of range for {self.real} samples")
        return np.full(3, i)


class ObjectArrays:
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i, "x", None], dtype=object)


# -- workers that die or hang -----------------------------------------------------------------------
class _Misbehave:
    def __init__(self, n: int, index: int, flag_path: str | None = None):
        self.n = n
        self.index = index
        self.flag_path = flag_path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.index and claim(self.flag_path):
            self.misbehave()
        return (i, os.getpid())

    def misbehave(self) -> None:  # pragma: no cover
        raise NotImplementedError


class KillAt(_Misbehave):
    def __init__(self, n: int, index: int, sig: int = signal.SIGKILL, flag_path: str | None = None):
        super().__init__(n, index, flag_path)
        self.sig = int(sig)

    def misbehave(self) -> None:
        silence_stderr()
        os.kill(os.getpid(), self.sig)
        time.sleep(60)  # the signal is delivered before this returns


class ExitAt(_Misbehave):
    def __init__(self, n: int, index: int, code: int = 3, flag_path: str | None = None):
        super().__init__(n, index, flag_path)
        self.code = code

    def misbehave(self) -> None:
        silence_stderr()
        os._exit(self.code)


class SegfaultAt(_Misbehave):
    def misbehave(self) -> None:
        silence_stderr()
        ctypes.string_at(0)


class HangAt(_Misbehave):
    def __init__(self, n: int, index: int, seconds: float = 600.0, flag_path: str | None = None):
        super().__init__(n, index, flag_path)
        self.seconds = seconds

    def misbehave(self) -> None:
        time.sleep(self.seconds)


class SlowThenExit:
    """Sample `index` waits `delay` seconds, then its worker exits (code 7): a death another
    thread can notice before the thread waiting for that batch does."""

    def __init__(self, n: int, index: int, delay: float) -> None:
        self.n, self.index, self.delay = n, index, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.index:
            time.sleep(self.delay)
            silence_stderr()
            os._exit(7)
        return np.int64(i)
