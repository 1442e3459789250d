"""Run by tests/test_leaks.py in a fresh interpreter, so that the test sees this program's own
stderr (the resource tracker's "leaked semaphore objects" warning comes when it ends):

    python worker_exit.py METHOD KIND

A loader whose workers make named POSIX semaphores (NOTE [worker exit] in fastload/_procs.py):
KIND ``lock``: each worker makes a ``multiprocessing.Lock`` at its first sample and keeps it;
``hf``: a Hugging Face ``datasets.Dataset``, whose reads make one (tqdm's write lock) in each worker;
``unguarded``: the workers make one while they import this main module again, which builds a
Loader there (NOTE [unguarded main]: the worker exits at once). Prints one JSON line: how many
of this program's semaphores were in /dev/shm while the workers lived, and which were left after
close(). This program's semaphores are told apart by multiprocessing's name prefix, which every
process it starts inherits (the mark tests/helpers/shm.py gives pytest's).
"""

import json
import multiprocessing as mp
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# this folder's datasets.py is not Hugging Face's: the tests folder instead, as pytest has it
sys.path[:] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE),
               *(p for p in sys.path if os.path.abspath(p or ".") != _HERE)]

import numpy as np  # noqa: E402

import fastload  # noqa: E402
from helpers.leaks import LockPerWorker, Small  # noqa: E402

# Inherited by spawn workers through the environment too: the unguarded worker makes its
# semaphore while it imports this module, before multiprocessing hands it the parent's prefix.
PREFIX = os.environ.setdefault("WORKER_EXIT_PREFIX", f"/mp-wexit{os.getpid()}")
mp.current_process()._config["semprefix"] = PREFIX  # type: ignore[attr-defined]


def ours() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("sem." + PREFIX[1:] + "-"))


if __name__ != "__main__" and sys.argv[2:3] == ["unguarded"]:
    # a spawn worker importing this main module again, as an unguarded script's would
    LockPerWorker.held.append(mp.get_context("spawn").Lock())  # named: spawn is asked for
    fastload.Loader(Small(), 4, num_workers=1)


def main(method: str, kind: str) -> None:
    during: int | None = None
    if kind == "unguarded":
        try:
            with fastload.Loader(Small(), 4, num_workers=1, start_method=method) as loader:
                list(loader)
        except fastload.WorkerDied as e:
            assert "__main__" in str(e), e
        else:
            raise AssertionError("the unguarded worker was not refused")
    else:
        if kind == "hf":
            import datasets

            dataset = datasets.Dataset.from_dict({"x": np.arange(16, dtype=np.float32)})
            dataset.set_format("numpy")
        else:
            dataset = LockPerWorker()
        with fastload.Loader(dataset, 4, num_workers=2, start_method=method) as loader:
            assert sum(len(b["x"] if kind == "hf" else b) for b in loader) == 16
            during = len(ours())
    print(json.dumps({"during": during, "left": ours()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
