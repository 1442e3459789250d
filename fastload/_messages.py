"""The messages between the parent and its workers, one small immutable type each.

NOTE [worker protocol]
Each worker has one duplex pipe (a socketpair) to the parent. A worker serves one or more
*clients* (loaders; NOTE [one pool, many loaders] in _pool.py), each named by an id (cid).
Batch data never travels through the pipe: workers write straight into slots. Messages are
rare (set-up, errors, object leaves that did not fit a slot), never one per batch.

Parent -> worker: ``Bell`` + the pool's bell fd (sent first, once); ``AddDataset`` (a new
client; a dataset pickled to more than 64 KiB travels as ``AddDatasetFd`` + the fd of an
anonymous file holding it (a memfd, or an unlinked temporary file where there is no
memfd_create: _region.new_fd), so that no large write to a worker's pipe can wait on a worker
that waits to write to us);
``Probe`` (load one sample, reply ``ProbeStarted`` then ``LayoutFound`` or ``ProbeFailed``, or
``ProbeEnded`` when a plain iterable's iterator has no such sample); ``Attach`` + the client's
region fd (map it, start filling its ring); ``Detach`` (drop the client's dataset, unmap its
region); ``Stop`` (exit 0). An fd follows its message on the pipe as an SCM_RIGHTS message
(multiprocessing.reduction.send_handle). The parent reads what workers send with a FrameReader
(NOTE [resumable reads] in _frames.py), which never waits for the rest of a message or for an
fd that has not come.

Worker -> parent: ``ProbeStarted``, ``LayoutFound``, ``ProbeEnded``, ``ProbeFailed``;
``BatchFailed`` for a batch that raised (sent *after* the slot is marked FAILED, so a large
message can never block a worker that the parent is not yet reading); ``SpillFd`` + the fd of
an anonymous file (as ``AddDatasetFd``) holding a batch's variable image (object and ragged
leaves) that did not fit the slot's variable area (the pool maps it on receipt and files a
``Spill`` whose image is that mapping: large ragged batches never cross the pipe, so a worker
never waits in a large write for a parent that stopped reading that batch); ``Skipped`` for a
batch in which ``on_error="skip"`` replaced samples that raised (the slot's ``F_SKIPPED`` flag
says one follows; sent after the slot is READY, like ``Spill``);
``DatasetFailed`` when a dataset cannot be unpickled there; ``InitFailed`` when
``worker_init`` fails (it concerns every client).
Batch messages are filed by (slot, seq): ``seq`` is the task's number in the slot header (64
bits, never reused by a loader), so a message of an abandoned batch (``break``, a new
``iter()``, ``load_state_dict``) can never be taken for a later batch in the same slot.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "Bell", "AddDataset", "AddDatasetFd", "AddDatasetRef", "Probe", "Attach", "Detach", "Stop",
    "ProbeStarted", "LayoutFound", "ProbeEnded", "ProbeFailed", "BatchFailed", "Spill",
    "SpillFd", "Skipped", "Started", "DatasetFailed",
    "InitFailed", "Death",
]


# -- parent -> worker --------------------------------------------------------------------------
class Bell(NamedTuple):
    nbytes: int  # the bell region's size; its fd follows


class AddDataset(NamedTuple):
    cid: int
    payload: bytes  # the pickled dataset


class AddDatasetRef(NamedTuple):
    cid: int
    key: int  # a thread worker's dataset: the user's object, kept by fastload._threads.put


class AddDatasetFd(NamedTuple):
    cid: int
    nbytes: int  # a pickled dataset in an anonymous file; its fd follows (NOTE [worker protocol])


class Probe(NamedTuple):
    cid: int
    sample: int  # its index in the dataset
    batch_size: int
    seed: int
    epoch: int
    spec: Any = None  # the loader's SampleSpec (fastload/_ragged.py)
    report: bool = True  # False: load and keep the sample, reply nothing (NOTE [first samples])
    #: on_error="skip": the other samples of its batch, tried in turn if ``sample`` raises
    alternates: tuple[int, ...] = ()
    #: NOTE [global RNGs] (fastload/_rngs.py): _rngs.OFF, DETECT or ON for this sample
    globals: int = 0
    #: NOTE [reads in flight] (fastload/_io.py): io_concurrency, and the other samples of the
    #: probe's batch, whose reads start with the probe's (io_concurrency > 1)
    io: int = 1
    rest: tuple[int, ...] = ()
    #: with report=False: also reply the sample's layout (NOTE [first samples]: in_order=False
    #: takes the first layout any worker finds)
    hint: bool = False


class Attach(NamedTuple):
    cid: int
    layout: Any  # BatchLayout
    nbytes: int  # the region's size; its fd follows
    skip: bool = False  # on_error="skip" (NOTE [skipped samples] in fastload/_fill.py)
    io: int = 1  # io_concurrency (NOTE [reads in flight] in fastload/_io.py)


class Detach(NamedTuple):
    cid: int


class Stop(NamedTuple):
    pass


# -- worker -> parent --------------------------------------------------------------------------
class ProbeStarted(NamedTuple):
    cid: int  # worker 0 began loading the probe sample: a death from now on is its doing


class LayoutFound(NamedTuple):
    cid: int
    layout: Any  # BatchLayout


class ProbeEnded(NamedTuple):
    """A plain iterable's probe: this worker's iterator of ``epoch`` has no sample (NOTE
    [iterable datasets] in _iterable.py)."""

    cid: int
    epoch: int


class ProbeFailed(NamedTuple):
    cid: int
    error: bytes  # fastload._remote.pack_exception


class BatchFailed(NamedTuple):
    cid: int
    slot: int
    seq: int  # the task's number (fl_slot_hdr.seq)
    error: bytes


class Spill(NamedTuple):
    cid: int
    slot: int
    seq: int
    image: Any  # the batch's variable image (NOTE [ragged leaves] in fastload/_ragged.py):
    # bytes, or the mmap of the memfd a SpillFd brought


class Skipped(NamedTuple):
    cid: int
    slot: int
    seq: int
    #: (index that raised, its exception type, its message, the index loaded in its place)
    records: tuple[tuple[int, str, str, int], ...]


class SpillFd(NamedTuple):
    cid: int
    slot: int
    seq: int
    nbytes: int  # the memfd's size; the fd follows


class DatasetFailed(NamedTuple):
    cid: int
    error: bytes


class InitFailed(NamedTuple):
    error: bytes
    cid: int = -1  # every client


class Started(NamedTuple):
    """The worker unpickled its first dataset and ran worker_init: a later death is not a
    failure to start. The pool keeps it (WorkerPool.started); no client gets it."""

    worker: int


# -- pool -> its clients (in the parent) ----------------------------------------------------
class Death(NamedTuple):
    """A worker the pool found dead (reported to every client before it is restarted)."""

    worker: int
    pid: int | None
    exitcode: int | None
    started: bool = True  # it had said Started: it did not die while starting
