"""NOTE [own /dev/shm entries]
The leak check (tests/conftest.py) fails a test that leaves a /dev/shm entry behind, but only
one of this test run's: /dev/shm is the machine's, and a check of the whole folder failed a
newcomer's first run whenever any other program made a semaphore meanwhile (issue 28). /dev/shm
does not say who created an entry, so an entry that appeared during a test is this run's when:

1. its name has this run's mark: a multiprocessing semaphore (``sem.mp-...``, what a leak of
   ours would be: named under spawn and forkserver, unlinked by a finalizer, NOTE [worker exit]
   in fastload/_procs.py) is named after ``current_process()._config["semprefix"]``, which
   every process inherits from the one that started it (copied into each ``Process`` object,
   pickled to spawn and forkserver children). ``mark_process_tree`` sets it to
   ``/mp-fltest<pytest's pid>``: a semaphore left by a worker that has exited, which nothing
   holds any more, is still recognised as ours; or
2. a live process of this run's tree (pytest and its descendants, by parent pid) has it open or
   mapped (a named semaphore is mapped while it is open): anything else this run holds,
   whatever made it (a ``SharedMemory``, a library's own semaphore).

Anything else is not this run's: other programs' entries, live or left behind. What this misses:
an unmarked entry that nothing holds any more, made in this run by a process that does not take
the mark (a fresh interpreter a test starts with subprocess has its own resource tracker, which
unlinks what it left when that interpreter's tree ends; a process that left our tree). Without
the private ``_config`` (another Python), rule 1 falls back to every new ``sem.mp-`` entry, the
check of old. tests/test_leaks.py shows both ways: a child's leaked semaphore is reported, an
unrelated process's live one is not.
"""

from __future__ import annotations

import multiprocessing as mp
import os

SHM = "/dev/shm"
_DEFAULT_MARK = "/mp"


def mark_process_tree() -> str:
    """Name this process's multiprocessing semaphores, and those of every process it starts from
    now on, with this run's mark; the prefix in effect (multiprocessing's own if it cannot)."""
    config = getattr(mp.current_process(), "_config", None)
    if not isinstance(config, dict) or "semprefix" not in config:
        return _DEFAULT_MARK
    if config["semprefix"] == _DEFAULT_MARK:
        config["semprefix"] = f"/mp-fltest{os.getpid()}"
    return str(config["semprefix"])


def snapshot() -> set[str]:
    # torch_* segments are torch's to manage (its file_system sharing strategy), not fastload's.
    try:
        return {n for n in os.listdir(SHM) if not n.startswith("torch_")}
    except FileNotFoundError:  # pragma: no cover - no /dev/shm: nothing to leak there
        return set()


def tree_pids(root: int | None = None) -> set[int]:
    """``root`` (default: this process) and its live descendants, by the parent pids in /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def held_by(pids: set[int]) -> set[str]:
    """Names of /dev/shm entries that processes ``pids`` have open or mapped."""
    prefix = SHM + "/"
    held: set[str] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                held.add(target[len(prefix):])
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.split(maxsplit=5)[5:]
                    if path and path[0].startswith(prefix):
                        held.add(path[0].rstrip("\n")[len(prefix):])
        except OSError:
            continue
    return held


def own_new_entries(before: set[str], mark: str) -> list[str]:
    """The entries made since ``before`` that are this run's (NOTE [own /dev/shm entries])."""
    new = snapshot() - before
    if not new:
        return []
    marked = "sem." + mark.lstrip("/") + "-"
    own = {n for n in new if n.startswith(marked)}
    rest = new - own
    if rest:
        own |= rest & held_by(tree_pids())
    return sorted(own)
