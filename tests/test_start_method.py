"""The start method and why (NOTE [start method] in fastload/_procs.py): fork on Linux whatever
threads run, said in one log line and in stats(); programs whose __main__ has no file (a
notebook kernel, ``python -c``, ``python -``) with a live thread, as a Jupyter kernel has."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import fastload
from fastload._procs import choose_start_method

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the fork default is Linux's (this is not Linux)")

TIMEOUT = 120

# A notebook cell: the Dataset class lives in a __main__ without a file, and the kernel runs
# threads (here one that sleeps, as a kernel's heartbeat or tqdm's monitor does).
PROGRAM = textwrap.dedent("""
    import logging, sys, threading, time
    import numpy as np
    import fastload

    logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="kernel-heartbeat", daemon=True).start()

    class DS:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return {"x": np.full(3, i, dtype=np.int64), "y": i * 2}

    method = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "default" else None
    with fastload.Loader(DS(), batch_size=4, num_workers=2, start_method=method,
                         timeout=30) as loader:
        got = [b["x"][:, 0].tolist() for b in loader]
        s = loader.stats()
    print("BATCHES", got)
    print("METHOD", s["start_method"])
    print("REASON", s["start_method_reason"])
    if "torch" in sys.argv:
        from fastload.compat.torch import DataLoader
        dl = DataLoader(DS(), batch_size=4, num_workers=2, timeout=30)
        print("TORCH", [b["y"].tolist() for b in dl])
    stop.set()
""")

EXPECTED = "BATCHES [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]"


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _env() -> dict[str, str]:
    """This environment without a forced start method, fastload importable from anywhere."""
    env = {k: v for k, v in os.environ.items() if k != "FASTLOAD_START_METHOD"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(fastload.__file__))
    return env


def _run_file(folder: os.PathLike[str], program: str) -> subprocess.CompletedProcess[str]:
    """``program`` run as a script file (its __main__ has a file: spawn workers import it)."""
    script = os.path.join(folder, "prog.py")
    with open(script, "w") as f:
        f.write(program)
    return subprocess.run([sys.executable, script], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env())


def _run(how: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = _env()
    if how == "stdin":  # python -: __main__.__file__ is '<stdin>'
        cmd, given = [sys.executable, "-", *args], PROGRAM
    else:  # python -c: __main__ has no __file__ at all, as in a kernel
        cmd, given = [sys.executable, "-c", PROGRAM, *args], None
    return subprocess.run(cmd, input=given, capture_output=True, text=True, timeout=TIMEOUT,
                          env=env, cwd=os.path.dirname(os.path.dirname(fastload.__file__)))


@pytest.mark.parametrize("how", ["stdin", "c"])
def test_notebook_class_with_a_live_thread_loads_by_fork(how: str) -> None:
    extra = ["torch"] if _have_torch() else []
    r = _run(how, "default", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    assert EXPECTED in r.stdout
    assert "METHOD fork" in r.stdout
    # why, and the thread that was alive, in stats() and in the one log line
    assert "1 other thread alive (kernel-heartbeat)" in r.stdout
    logs = [ln for ln in r.stderr.splitlines() if ln.startswith("LOG ")]
    assert len(logs) == 1 + len(extra), r.stderr  # one line per pool: a Loader's, the drop-in's
    assert all("2 worker processes start with fork" in ln and "kernel-heartbeat" in ln
               for ln in logs), logs
    if extra:  # the drop-in too, as torch's DataLoader works in a notebook
        assert "TORCH [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]" in r.stdout


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_class_in_a_fileless_main_is_refused_before_workers_start(method: str) -> None:
    r = _run("c", method)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: DS is defined in __main__, which has no file"), r.stderr
    assert f"{method} workers cannot import it" in last
    assert "start_method='fork'" in last
    assert "WorkerDied" not in r.stderr  # no worker started, none died


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_stdin_main_is_refused_for_spawn_and_forkserver(method: str) -> None:
    # multiprocessing's spawn and forkserver run '<stdin>' as a path in every worker: they die
    # whatever the dataset is, so this is refused whatever the dataset is
    r = _run("stdin", method)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: this program's main module is '<stdin>', not a file")
    assert "WorkerDied" not in r.stderr


def test_reason_names_the_threads_alive_and_the_choice_is_not_changed_by_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTLOAD_START_METHOD", raising=False)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="metrics-logger", daemon=True)
    t.start()
    try:
        method, why = choose_start_method()
    finally:
        stop.set()
        t.join(5)
    assert method == "fork"
    assert "metrics-logger" in why and "start_method='forkserver'" in why
    assert choose_start_method("spawn") == ("spawn", "start_method='spawn' was given")
    monkeypatch.setenv("FASTLOAD_START_METHOD", "forkserver")
    assert choose_start_method() == ("forkserver", "FASTLOAD_START_METHOD='forkserver'")


def test_stats_say_how_workers_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTLOAD_START_METHOD", raising=False)
    data = fastload.ArrayDataset(np.arange(12))
    with fastload.Loader(data, batch_size=4, num_workers=1, timeout=30) as loader:
        assert [b.tolist() for b in loader][0] == [0, 1, 2, 3]
        s = loader.stats()
        assert s["start_method"] == "fork" == loader.start_method
        assert s["start_method_reason"].startswith("the default on Linux")
    with fastload.Loader(data, batch_size=4, num_workers=0) as loader:
        s = loader.stats()
        assert s["start_method"] is None and s["start_method_reason"] is None
    with fastload.Loader(data, batch_size=4, num_workers=2, worker_method="thread",
                         timeout=30) as loader:
        next(iter(loader))
        s = loader.stats()
        assert (s["start_method"], s["start_method_reason"]) == ("thread",
                                                                 "worker_method='thread'")


PROGRAM_SETS_METHOD = textwrap.dedent("""
    import multiprocessing as mp, os, sys
    import numpy as np

    class PPid:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.array([os.getppid()])

    if __name__ == "__main__":
        mp.set_start_method(sys.argv[1])
        from fastload.compat.torch import DataLoader
        got = {int(p) for b in DataLoader(PPid(), batch_size=2, num_workers=2, timeout=60)
               for p in b.view(-1).tolist()}
        print("FORKED_BY_MAIN", got == {os.getpid()})
""")


@pytest.mark.skipif(not _have_torch(), reason="torch is not installed")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_drop_in_follows_the_programs_set_start_method_as_torch(tmp_path: os.PathLike[str],
                                                                 method: str) -> None:
    # torch's DataLoader takes multiprocessing's default context, so a program that called
    # set_start_method('forkserver') gets forkserver workers (children of the fork server)
    r = _run_file(tmp_path, PROGRAM_SETS_METHOD.replace("sys.argv[1]", repr(method)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"FORKED_BY_MAIN {method == 'fork'}" in r.stdout


PROGRAM_UNPICKLABLE_INIT = textwrap.dedent("""
    import multiprocessing as mp, warnings
    import numpy as np

    class DS:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.array([i])

    if __name__ == "__main__":
        mp.set_start_method("forkserver")
        from fastload.compat.torch import DataLoader
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                next(iter(DataLoader(DS(), batch_size=2, num_workers=2,
                                     worker_init_fn=lambda w: None)))
            except TypeError as e:
                print("RAISED", "cannot be pickled" in str(e))
        print("WARNED", any("Got pickle error when" in str(w.message) for w in seen))
""")


@pytest.mark.skipif(not _have_torch(), reason="torch is not installed")
def test_drop_in_warns_as_torch_when_a_worker_argument_does_not_pickle(
        tmp_path: os.PathLike[str]) -> None:
    r = _run_file(tmp_path, PROGRAM_UNPICKLABLE_INIT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RAISED True" in r.stdout and "WARNED True" in r.stdout, r.stdout + r.stderr[-2000:]


PROGRAM_IN_A_SPAWNED_CHILD = textwrap.dedent("""
    import multiprocessing as mp, os, sys
    import numpy as np

    class Counted:  # holds a multiprocessing.Value: it travels by inheritance only
        def __init__(self):
            self.calls = mp.Value("i", 0)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            with self.calls.get_lock():
                self.calls.value += 1
            return np.array([i])

    def child():
        from fastload.compat.torch import DataLoader
        ds = Counted()
        got = [b.view(-1).tolist() for b in DataLoader(ds, batch_size=2, num_workers=2,
                                                      timeout=60)]
        print("CHILD", got, ds.calls.value, flush=True)

    if __name__ == "__main__":
        p = mp.get_context("spawn").Process(target=child)
        p.start()
        p.join(120)
        print("EXIT", p.exitcode)
""")


@pytest.mark.skipif(not _have_torch(), reason="torch is not installed")
def test_drop_in_in_a_spawned_child_keeps_fork(tmp_path: os.PathLike[str]) -> None:
    # multiprocessing fixes a spawn child's start method to 'spawn' while it starts: that is
    # not the program's choice, so the drop-in keeps fork there, and a dataset holding a
    # multiprocessing.Value (shared by inheritance only) still loads (torch's
    # test_get_worker_info runs its DataLoader in such a child)
    r = _run_file(tmp_path, PROGRAM_IN_A_SPAWNED_CHILD)
    assert "CHILD [[0, 1], [2, 3]] 4" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "EXIT 0" in r.stdout


PROGRAM_SHARED_VALUE = textwrap.dedent("""
    import multiprocessing as mp
    import numpy as np
    import fastload

    class Counted:
        def __init__(self, method):  # (a SemLock travels only to its own context's processes)
            self.loads = mp.get_context(method).Value("i", 0)  # and only while one starts

        def __len__(self):
            return 8

        def __getitem__(self, i):
            with self.loads.get_lock():
                self.loads.value += 1
            return np.array([i])

    if __name__ == "__main__":
        for method in ("forkserver", "spawn"):
            ds = Counted(method)
            with fastload.Loader(ds, batch_size=2, num_workers=2, start_method=method,
                                 timeout=60) as loader:
                got = [b.ravel().tolist() for b in loader]
            print(method, got, ds.loads.value >= 8)
""")


def test_a_dataset_holding_a_multiprocessing_value_starts_under_forkserver_and_spawn(
        tmp_path: os.PathLike[str]) -> None:
    # multiprocessing pickles a Value only while it starts a process (its fd goes with the
    # spawning Popen), as torch's workers receive their dataset: the loads the workers count
    # reach the parent's Value
    r = _run_file(tmp_path, PROGRAM_SHARED_VALUE)
    assert r.returncode == 0, r.stderr[-3000:]
    for method in ("forkserver", "spawn"):
        assert f"{method} [[0, 1], [2, 3], [4, 5], [6, 7]] True" in r.stdout, r.stdout


PROGRAM_INIT_METHOD = textwrap.dedent("""
    import numpy as np
    import fastload

    class Tagged:
        def __init__(self):
            self.worker = None

        def init(self, worker_id):  # sets an attribute on the dataset the worker loads from
            self.worker = worker_id

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.array([-1 if self.worker is None else self.worker])

    if __name__ == "__main__":
        for method in ("forkserver", "spawn"):
            ds = Tagged()
            with fastload.Loader(ds, batch_size=1, num_workers=2, start_method=method,
                                 worker_init=ds.init, timeout=60) as loader:
                got = {int(b[0, 0]) for b in loader}
            print(method, bool(got) and got <= {0, 1})
""")


def test_a_worker_init_that_is_a_method_of_the_dataset_sets_the_workers_dataset(
        tmp_path: os.PathLike[str]) -> None:
    # the dataset and worker_init travel in one pickle (as torch's do), so the method's self
    # is the dataset the worker loads from, not a copy of its own
    r = _run_file(tmp_path, PROGRAM_INIT_METHOD)
    assert r.returncode == 0, r.stderr[-3000:]
    for method in ("forkserver", "spawn"):
        assert f"{method} True" in r.stdout, r.stdout
