"""Starting worker processes: the start method, the main-module guard, pickling for spawn and
forkserver, and the signal mask and environment a worker starts with (the pool's side of
fastload/_worker.py's ``worker_main``)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn

__all__ = ["EXIT_UNGUARDED_MAIN", "NotPicklable", "choose_start_method", "default_start_method",
           "exit_code_name", "exit_worker", "preload_in_fork_server", "program_start_method",
           "refuse_unguarded_main",
           "refuse_unimportable_main", "start_process", "unguarded_main_text"]

_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


#: Exit code of a fastload worker whose start re-ran a main module that builds a Loader or Pool
#: at import time (NOTE [unguarded main]).
EXIT_UNGUARDED_MAIN = 87


def unguarded_main_text() -> str:
    """What to tell a user whose script builds loaders outside ``if __name__ == "__main__":``."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    where = f" ({main})" if main else ""
    return (
        "fastload's workers could not start: a worker started with 'spawn' or 'forkserver' "
        f"imports your main module{where} again, and that module creates a fastload Loader or "
        "Pool when it is imported. Put the code that creates and iterates loaders under "
        "`if __name__ == \"__main__\":` (see 'Start methods' in README.md), or pass "
        "start_method='fork' (Linux)."
    )


def preload_in_fork_server(ctx: Any) -> None:
    """NOTE [forkserver leftovers] (fastload/_fsexit.py): add fastload._fsexit to the fork
    server's preload list, unless the server runs already (its list is then fixed) or has it."""
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # private: read only, and guarded
        preload = list(server._preload_modules)
        if server._forkserver_pid is not None or "fastload._fsexit" in preload:
            return
    except (ImportError, AttributeError, TypeError):  # another Python's internals: leave them
        return
    # The default list is ["__main__"] (the server imports the main module once, its workers
    # then start with it imported); keep whatever the user set.
    ctx.set_forkserver_preload([*(preload or ["__main__"]), "fastload._fsexit"])


def refuse_unguarded_main() -> None:
    """NOTE [unguarded main]
    Under spawn and forkserver a worker re-imports the user's main module before it runs
    anything of ours (multiprocessing's ``_inheriting`` is set meanwhile). A script without a
    ``__main__`` guard then builds a Loader inside its own worker, whose start fails with
    multiprocessing's 60-line RuntimeError, once per worker and restart. Here, in a fastload
    worker, that import ends the worker at once, silently, with EXIT_UNGUARDED_MAIN; the parent
    raises one WorkerDied with this advice, and does not restart it again and again (see
    fastload/_deaths.py). In any other bootstrapping process (another library's worker), the
    same advice as a RuntimeError."""
    proc = mp.current_process()
    if not getattr(proc, "_inheriting", False):
        return
    if proc.name.startswith("fastload-worker-"):
        # not SystemExit: forkserver's child loop turns it into exit code 1. What the main
        # module's imports made (a library's semaphores) goes with the worker (exit_worker).
        exit_worker(EXIT_UNGUARDED_MAIN)
    raise RuntimeError(unguarded_main_text())


def exit_worker(code: int) -> NoReturn:
    """NOTE [worker exit]
    A worker process ends with ``os._exit``, not by returning into multiprocessing's
    ``Process._bootstrap``: under spawn that return would run the interpreter's shutdown, the
    atexit handlers of the user's libraries and the join of their non-daemon threads (a worker
    could hang there after close()), and what ended the worker is told on its pipe, not by its
    exit. But ``_bootstrap`` runs, after ``run()`` and in every start method,
    ``util._exit_function``: multiprocessing's finalizers (``util.Finalize`` with an exit
    priority). Under spawn and forkserver a ``multiprocessing`` Lock or Semaphore is a named
    POSIX semaphore in /dev/shm whose finalizer unlinks it; a worker reading a Hugging Face
    ``datasets.Dataset`` makes one (tqdm's write lock, an ``RLock``). Skipped, they stayed in
    /dev/shm after close() until the main process's resource tracker ended and printed "There
    appear to be 2 leaked semaphore objects" (2 workers); it also skipped the removal of
    temporary folders (``util.get_temp_dir``) and the closing of queues made in the worker. So
    before ``os._exit`` a worker runs those finalizers as ``_exit_function`` does: exit
    priority >= 0 first, then the rest. Not its
    wait for child processes: a worker is daemonic, multiprocessing lets it start none, and an
    unbounded join has no place on an exit path (a finalizer that blocks is bounded by the
    parent's close(): terminate, then kill). atexit handlers do not run, as in multiprocessing's
    fork and forkserver children.

    Only the worker's own finalizers run: ``_bootstrap`` empties the registry in every child
    (``Process._after_fork``), so a fork worker has none of its parent's; and ``Finalize``
    skips one registered by another pid, which covers ``refuse_unguarded_main``, whose forkserver
    worker exits before ``_bootstrap`` with the fork server's registry. Not run when the parent
    died (the watchdog's ``os._exit``, or PDEATHSIG's SIGKILL) or the worker is killed (SIGTERM
    or SIGKILL after close()'s grace period, the OOM killer): then the resource tracker unlinks
    what is still registered when its last process ends, with that warning."""
    try:
        from multiprocessing import util

        run = getattr(util, "_run_finalizers", None)  # private; another Python's may lack it
        if run is not None:
            util._exiting = True  # type: ignore[attr-defined]  # queue feeders: no error noise
            run(0)
            run()
    except BaseException:  # noqa: BLE001 - nothing may keep a worker from exiting
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)


def exit_code_name(code: int | None) -> str:
    """``-11`` -> ``SIGSEGV(-11)``, ``3`` -> ``EXIT(3)`` (loky's _get_exitcode_name)."""
    if code is None:
        return "RUNNING"
    if code < 0:
        try:
            return f"{signal.Signals(-code).name}({code})"
        except ValueError:
            return f"SIGNAL({code})"
    return f"EXIT({code})"


def choose_start_method(given: str | None = None) -> tuple[str, str]:
    """NOTE [start method]
    The start method of worker processes and why, as (method, reason): ``given`` (a Loader's or
    Pool's start_method=), else ``$FASTLOAD_START_METHOD``, else fork on Linux, else
    forkserver (other POSIX systems), else spawn. Never chosen from the threads alive.

    fork on Linux whatever threads run, as torch's DataLoader does (it takes multiprocessing's
    default, fork on Linux up to Python 3.13). Until 0.1 fastload took forkserver as soon as a
    second thread was alive, and that silent switch was what users met: a Jupyter kernel runs
    threads, so a Dataset class defined in a cell failed to unpickle in the workers ("Can't
    get attribute 'DS' on <module '__main__'>") where torch's worked; a tqdm monitor thread
    (left by Hugging Face datasets' map()) made construction take 1.2-2.2 s instead of
    0.02-0.24 s and pickled the Arrow table into every worker; Lightning runs took 10-12 s
    instead of 5.7 s. With one sampler thread alive, construction to first batch was 340 ms /
    454 ms (tiny / image, bench_loader --live-thread) against torch's 62 / 173 ms.

    What fork costs with threads: a child gets a copy of every lock as it was, and only the
    forking thread. A lock another thread held at that instant stays locked in the child, so a
    worker deadlocks only if it then takes such a lock. CPython re-initialises its own at fork
    (the GIL, the import lock, threading's, logging's handlers); a worker runs fastload's loop
    and the dataset's ``__getitem__``. The hazard is a lock of the user's or of a library that
    ``__getitem__`` takes and that another parent thread may hold (a cache guarded by a lock
    the training loop also uses, a C library's mutex); threads that only sleep, wait on events
    or sockets (tqdm's monitor, a kernel's heartbeat and IOPub threads, metrics and logging
    threads, memory samplers) hold none of those. The workers' every wait is bounded (a
    worker stuck at start is reported, not waited on for ever), and ``start_method=
    'forkserver'`` is the way out for such a program. Python 3.12 warns (DeprecationWarning)
    when a multi-threaded process forks, and 3.14 made forkserver multiprocessing's default on
    Linux; fastload keeps fork there too, by this reasoning, and says so: one log line per pool
    (logger "fastload", INFO) names the method, the reason and the other threads alive, and
    ``Loader.stats()`` has ``start_method`` and ``start_method_reason``.

    compat.torch's DataLoader without multiprocessing_context= follows a start method the
    program's main process set (``multiprocessing.set_start_method('spawn')``, as CUDA programs
    do; ``program_start_method``), since torch's takes multiprocessing's default context, and
    gives torch's "Got pickle error" warning when that fails to pickle; ``Loader`` does not.

    Under spawn and forkserver the workers import the main module again, by its file: a class
    defined in a notebook cell, ``python -c`` or ``python -`` (a ``__main__`` without a file)
    cannot be found there; ``refuse_unimportable_main`` says so before any worker starts."""
    methods = mp.get_all_start_methods()
    if given is not None:
        return given, f"start_method={given!r} was given"
    forced = os.environ.get("FASTLOAD_START_METHOD")
    if forced:
        if forced not in methods:
            raise ValueError(
                f"FASTLOAD_START_METHOD={forced!r} is not available here; choose one of {methods}"
            )
        return forced, f"FASTLOAD_START_METHOD={forced!r}"
    if "fork" in methods and sys.platform.startswith("linux"):
        others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        why = "the default on Linux: nothing is pickled or imported again"
        if others:
            shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4
                                             else "")
            why += (f"; {len(others)} other thread{'s' if len(others) > 1 else ''} alive "
                    f"({shown}): start_method='forkserver' if a worker needs a lock one of them "
                    "may hold")
        return "fork", why
    if "forkserver" in methods:
        return "forkserver", f"fork is not safe on {sys.platform}"
    return "spawn", f"the only start method on {sys.platform}"


def default_start_method() -> str:
    """The start method of ``start_method=None`` (NOTE [start method] in choose_start_method)."""
    return choose_start_method()[0]


def program_start_method() -> str | None:
    """The start method of multiprocessing's default context where the program's main process
    set or fixed it (``multiprocessing.set_start_method``, as CUDA programs set 'spawn'), else
    None; None under ``$FASTLOAD_START_METHOD``. compat.torch follows it, as torch's DataLoader
    takes that context (NOTE [start method]). Not in a child process: multiprocessing fixes a
    spawn or forkserver child's own method while it starts: the program did not choose it
    there, and fork keeps a worker's start cheap."""
    if os.environ.get("FASTLOAD_START_METHOD") or mp.parent_process() is not None:
        return None
    return mp.get_start_method(allow_none=True)


def refuse_unimportable_main(dataset: Any, method: str) -> None:
    """Under spawn/forkserver, a ValueError saying what to do, before any worker starts, for
    what every worker would die of (NOTE [start method]): a main module whose file is not
    there (``python -`` names it ``<stdin>``: multiprocessing's workers run that path and fail
    whatever the dataset), or a dataset (or an object it holds directly) whose class is defined
    in a ``__main__`` without a file (a notebook cell, ``python -c``): "Can't get attribute"."""
    if method not in ("spawn", "forkserver"):
        return
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None):
        return  # python -m: workers import it by name
    path = getattr(main, "__file__", None)
    fix = ("Use start_method='fork' (the default on Linux), or put the code in a file (or the "
           "class in a module) and run that")
    if path is not None:
        if not os.path.exists(path):
            raise ValueError(
                f"this program's main module is {path!r}, not a file: {method} workers run the "
                f"main module's file again and cannot. {fix}")
        return
    for obj in (dataset, *getattr(dataset, "__dict__", {}).values()):
        cls = obj if isinstance(obj, type) else type(obj)
        if obj is not None and getattr(cls, "__module__", None) == "__main__":
            raise ValueError(
                f"{cls.__qualname__} is defined in __main__, which has no file here (a notebook "
                f"cell or python -c): {method} workers cannot import it. {fix}")


def start_process(ctx: Any, target: Callable[..., Any],
                  args: tuple[Any, ...]) -> tuple[Any, Connection]:
    """Start worker ``args[0]`` as a process running ``target`` (worker_main) with the pipe's
    child end inserted as its third argument; the process and the parent's end."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    p = ctx.Process(target=target, args=(*args[:2], child_conn, *args[2:]),
                    name=f"fastload-worker-{args[0]}", daemon=True)
    saved = {k: os.environ.get(k) for k in _THREAD_ENV}
    # Block SIGINT while starting: the child inherits the mask (fork and exec alike), so a
    # Ctrl+C that reaches it before worker_main ignores SIGINT stays pending and is then
    # discarded, instead of printing a KeyboardInterrupt traceback from a half-started
    # worker. The parent gets its own pending SIGINT as soon as the mask is restored.
    mask = _block_sigint()
    try:
        for k in _THREAD_ENV:  # before the child imports NumPy (spawn/forkserver)
            os.environ.setdefault(k, "1")
        p.start()
    except BaseException:
        parent_conn.close()  # no process: its pipe goes too (check() tries again)
        child_conn.close()
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
        _restore_sigmask(mask)
    child_conn.close()
    return p, parent_conn


def _block_sigint() -> Any:
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _restore_sigmask(mask: Any) -> None:
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class NotPicklable(TypeError):
    """A dataset or worker_init that spawn/forkserver workers (or a shared pool's running ones)
    cannot receive because it does not pickle. A TypeError, as before; compat.torch tells it
    apart to warn as torch does (compat/_torch_iter.py)."""


def _check_picklable_init(worker_init: Any, method: str) -> None:
    try:
        pickle.dumps(worker_init)
    except Exception as e:
        raise NotPicklable(
            f"fastload: worker_init={worker_init!r} cannot be pickled for start_method={method!r} "
            f"({type(e).__name__}: {e}); define it at module level, or use start_method='fork'"
        ) from e


def _pickle_for_workers(dataset: Any, method: str, worker_init: Any = None) -> tuple[Any, bool]:
    """The first dataset as spawn/forkserver workers receive it, and whether that is pickled:
    pickled once here for every worker, or, for a dataset holding what multiprocessing lets
    travel only while it starts a process (a ``multiprocessing.Value``, ``Lock`` or ``Queue``:
    their file descriptors go with the spawning Popen), the object
    itself, which ``Process.start()`` pickles for each worker, as torch's DataLoader does; say
    what to do if it cannot be pickled at all. With a ``worker_init`` the dataset goes the
    second way too: pickled in one go with it, what they share stays one object in the worker
    (a ``worker_init`` that is a method of the dataset sets attributes on the worker's
    dataset, not on a copy of its own: torch's test_ind_worker_queue)."""
    refuse_unimportable_main(dataset, method)
    try:
        payload = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
        return (dataset, False) if worker_init is not None else (payload, True)
    except RuntimeError as e:  # multiprocessing's context.assert_spawning()
        if "through inheritance" in str(e):
            return dataset, False
        error: Exception = e
    except Exception as e:
        error = e
    raise NotPicklable(
        f"fastload: the dataset {type(dataset).__qualname__} cannot be pickled for "
        f"start_method={method!r} ({type(error).__name__}: {error}). Workers started with "
        f"{method!r} receive a pickled copy: keep unpicklable members (open files, locks, "
        "lambdas) out of the dataset or create them lazily in __getitem__/worker_init, or use "
        "start_method='fork'"
    ) from error
