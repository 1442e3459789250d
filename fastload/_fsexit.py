"""NOTE [forkserver leftovers]
With start_method="forkserver", multiprocessing's fork server listens on a Unix socket in a
``pymp-*`` directory under ``$TMPDIR`` that the main process removes at exit (a
``multiprocessing.util`` finalizer). A main process that is killed (SIGKILL, SIGTERM, the OOM
killer) runs no finalizer: the fork server sees its "alive" pipe close and exits, our workers
follow it, but the directory and its socket stay, one per killed run. fastload adds this
module to the fork server's preload list (``_pool.preload_in_fork_server``, before the server
starts), so it is imported in the fork server process while the server's listening socket is
open: it notes the socket's path and registers an exit handler, which removes the socket and
then the directory if it is empty. The handler runs in the fork server alone (its pid is
checked: forked children inherit the registration but leave with ``os._exit``), and the main
process's own clean-up, when it runs, goes first (it removes the directory before it closes
the pipe that ends the fork server). Importing fastload in the fork server also means forked
workers start with it imported.
"""

from __future__ import annotations

import atexit
import os
import socket
import stat

__all__: list[str] = []

_PID = os.getpid()


def _listening_unix_paths() -> list[str]:
    """Paths of the listening Unix sockets among this process's descriptors."""
    paths = []
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        return []
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            with socket.socket(fileno=os.dup(fd)) as s:
                if s.family != socket.AF_UNIX:
                    continue
                if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    continue
                name = s.getsockname()
        except OSError:
            continue
        if isinstance(name, str) and name and not name.startswith("\0"):
            paths.append(name)
    return paths


def _cleanup(paths: list[str]) -> None:
    if os.getpid() != _PID:  # a forked child that exits by the normal path: not ours
        return
    for path in paths:
        folder = os.path.dirname(path)
        try:
            os.unlink(path)
            os.rmdir(folder)  # only if empty: anything else there is not ours to remove
        except OSError:
            pass


# Imported in the fork server only (by its preload list; fastload itself never imports this
# module), while its listening socket is open: the server closes it before it exits, so its
# path is read now. Anywhere else there is no such socket, and nothing is registered.
_PATHS = [p for p in _listening_unix_paths()
          if os.path.basename(p).startswith("listener-")
          and os.path.basename(os.path.dirname(p)).startswith("pymp-")]
if _PATHS:
    atexit.register(_cleanup, _PATHS)
