"""The options of fastload.Loader, defined once (issue 29).

Each :class:`Option` gives an option's name, default, type as the docs show it, its
description and its check. From these records follow:

- the checks of ``LoaderConfig.build`` and of ``Loader.__init__`` (:func:`check_options`);
- the "Parameters" section of ``Loader``'s docstring (:func:`docstring_parameters`);
- the options table and the signature block of docs/api.md (:func:`api_table`,
  :func:`api_signature`; ``python -m fastload._options docs/api.md`` rewrites both, and
  tests/test_options.py checks that the file agrees).

``Loader.__init__`` keeps an explicit signature (for mypy --strict and IDEs);
tests/test_options.py checks that its parameters are exactly these records, in order.

Options with ``check=None`` are validated where they are shared or need context:
``seed``, ``num_workers``, ``start_method``, ``worker_init`` by ``check_worker_args``
(fastload.Pool takes them too), ``shard`` by ``resolve_shard``, ``pool`` in
``LoaderConfig.build``, ``ragged``, ``pad_value``, ``pad_to_multiple`` by
``SampleSpec.build``, ``shuffle_buffer`` by ``stream_view`` and ``dataset`` by the loader.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BY_NAME", "OPTIONS", "REQUIRED", "Option", "check_options", "docstring_parameters",
           "api_table", "api_signature"]


class _Required:
    """The default of an option that has none (``dataset``)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

#: ``check(name, value)`` returns the value to use (a bool for a bool option) or raises.
Check = Callable[[str, Any], Any]


# -- the kinds of checks ---------------------------------------------------------------------
# NOTE [bool options]: True, False, np.bool_, and the ints 0 and 1 (also NumPy's). 0 and 1 are
# taken because configurations written by argparse (type=int), environment variables or
# JSON/YAML files often hold flags as 0/1: they say one thing only, and every bool option is
# keyword-only, so no positional mix-up can land an int here. Any other value (a string such
# as "False", which is truthy, None, 2) is a TypeError: a wrong flag must not silently flip.
def boolean(name: str, value: Any) -> bool:
    """A bool option: ``True``/``False``/``np.bool_``/0/1, else a TypeError."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    kind = type(value).__name__
    article = "an" if kind[:1] in "aeiou" else "a"
    raise TypeError(f"{name} must be True or False, got {value!r} ({article} {kind})")


def int_at_least(low: int, *, none_ok: bool = False) -> Check:
    """An int >= ``low`` (not a bool), or also None with ``none_ok``."""

    def check(name: str, value: Any) -> Any:
        if none_ok and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            either = "None or " if none_ok else ""
            raise ValueError(f"{name} must be {either}an int >= {low}, got {value!r}")
        return value

    return check


def one_of(*values: str) -> Check:
    """One of the given strings."""
    said = " or ".join(repr(v) for v in values)
    if len(values) > 2:
        said = ", ".join(repr(v) for v in values[:-1]) + f" or {values[-1]!r}"

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str) or value not in values:
            raise ValueError(f"{name} must be {said}, got {value!r}")
        return value

    return check


def _positive_seconds(name: str, value: Any) -> Any:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float, np.number))
        or not value > 0
    ):
        raise ValueError(f"{name} must be None or > 0 seconds, got {value!r}")
    return value


def _bool_or_none(name: str, value: Any) -> Any:
    return None if value is None else boolean(name, value)


def _callable_or_none(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


def _stall(name: str, value: Any) -> Any:
    if value is not None and not (
        isinstance(value, tuple) and len(value) == 2
        and isinstance(value[0], (int, float, np.number)) and not isinstance(value[0], bool)
        and value[0] > 0 and callable(value[1])
    ):
        raise ValueError(f"{name} must be (seconds > 0, callable), got {value!r}")
    return value


@dataclass(frozen=True)
class Option:
    """One keyword of fastload.Loader.

    ``type`` is numpydoc's type line; ``doc`` one paragraph of reST (``code``,
    :class:`name`), rendered as Markdown for docs/api.md; ``check`` validates a value (None:
    validated elsewhere, see the module docstring); ``positional``: may be given by position.
    """

    name: str
    default: Any
    type: str
    doc: str
    check: Check | None = None
    positional: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "dataset", REQUIRED, "object",
        "Anything with ``__len__`` and ``__getitem__(int)``; a sample is an array, a scalar, "
        "or a tuple / list / dict / namedtuple of them, nested to any depth. Leaves that are "
        "not arrays or numbers (strings, arbitrary objects) are delivered as a list per batch. "
        "A ``__getitems__(list_of_int)`` method, if present, is called once per batch instead. "
        "Also a :class:`fastload.ShardedStream`, or a plain iterable (``__iter__`` and no "
        "``__getitem__``, e.g. torch's ``IterableDataset``): each worker then iterates its own "
        "copy every epoch, as torch's workers do (split it with :func:`get_worker_info`), and "
        "batches come round-robin from the workers (NOTE [iterable datasets] in "
        "fastload/_iterable.py); ``len(loader)`` needs the dataset's ``__len__``.",
        positional=True,
    ),
    Option(
        "batch_size", 1, "int",
        "Samples per batch (the last batch may be smaller unless ``drop_last``).",
        int_at_least(1), positional=True,
    ),
    Option(
        "shuffle", False, "bool",
        "Reshuffle every epoch. The order depends only on ``(seed, epoch)``. Not with "
        "``batch_plan`` (the plan orders its batches).",
        boolean,
    ),
    Option(
        "seed", None, "int, optional",
        "Seed of the shuffle and of each worker's global RNGs (``random``, ``np.random``); "
        "random if ``None``. An int in ``[0, 2**63)`` (it travels in each slot's task header "
        "as an int64; a larger one is refused here, not at the first batch).",
    ),
    Option(
        "drop_last", False, "bool",
        "Drop the last, incomplete batch.",
        boolean,
    ),
    Option(
        "num_workers", None, "int, optional",
        "Worker processes; ``None`` means ``os.cpu_count()``; ``0`` loads in the calling "
        "process with identical results. At most ``fastload._ring.MAX_WORKERS``.",
    ),
    Option(
        "prefetch", 2, "int",
        "Batches in flight per worker process. Thread workers (``worker_method=\"thread\"`` or "
        "``\"process_threads\"``) keep one per thread plus ``prefetch`` for them all, when "
        "that is fewer: each batch in "
        "flight holds a slot of memory, and more bought threads no speed.",
        int_at_least(1),
    ),
    Option(
        "start_method", None, '{"fork", "forkserver", "spawn"}, optional',
        "How workers start. Default: ``$FASTLOAD_START_METHOD`` if set, else fork on Linux "
        "(whatever threads the program runs, as torch's DataLoader), else forkserver. One log "
        "line (logger ``fastload``, INFO) and ``stats()[\"start_method_reason\"]`` say which "
        "and why; spawn and forkserver refuse a program whose ``__main__`` has no file (a "
        "notebook, ``python -c``, ``python -``) where their workers could not import it "
        "(NOTE [start method] in fastload/_procs.py).",
    ),
    Option(
        "worker_method", "process", '{"process", "thread", "process_threads"}',
        "What the workers are. ``\"process\"``: worker processes (the dataset reaches them by "
        "fork or pickled). ``\"thread\"``: threads of this process filling the same "
        "zero-copy slots with the same batches: no process start, nothing pickled or copied "
        "(the dataset is your object); fast when ``__getitem__`` releases the GIL (file reads, "
        "image decoding, large NumPy operations), slow for pure-Python samples on a GIL build. "
        "Global ``random``/``numpy.random`` state is shared by the threads: use "
        ":func:`sample_rng`. A thread stuck in a sample cannot be killed: ``close()`` waits for "
        "it 2 s, then leaves it (NOTE [thread workers] in fastload/_threads.py). "
        "``\"process_threads\"``: the same threads in one helper process (started with "
        "``start_method``; the dataset reaches it once, by fork or pickled): they do not "
        "contend with your training loop for its GIL, and a stuck sample is killed with its "
        "process; global RNGs as for threads (NOTE [hosted threads] in fastload/_host.py).",
        one_of("process", "thread", "process_threads"),
    ),
    Option(
        "worker_init", None, "callable, optional",
        "Called once in each worker as ``worker_init(worker_id)`` before it loads anything.",
    ),
    Option(
        "timeout", None, "float, optional",
        "Seconds to wait for one batch before raising :class:`LoaderTimeoutError`.",
        _positive_seconds,
    ),
    Option(
        "max_held", 3, "int",
        "Zero-copy batches the caller may hold at once; past that, batches are copies (NOTE "
        "[held batches] in fastload/_slots.py). Each is a slot of shared memory set aside "
        "besides the batches in flight; with ``copy=True`` none is (``max_held`` is then 0).",
        int_at_least(0),
    ),
    Option(
        "copy", False, "bool",
        "Always return owned copies instead of zero-copy views: the same as ``max_held=0`` "
        "(no slots are set aside for held batches), except that the copies are not counted "
        "in ``stats()[\"copied_batches\"]``.",
        boolean,
    ),
    Option(
        "on_worker_death", "raise", '{"raise", "restart"}',
        "What a dead worker (signal, ``os._exit``, OOM kill) does to the epoch. Either way the "
        "worker is restarted. ``\"raise\"``: :class:`WorkerDied` ends the epoch. "
        "``\"restart\"``: the batch it was loading is loaded again by the fresh worker and the "
        "epoch goes on; a sample that kills 3 workers raises :class:`WorkerDied` naming its "
        "index.",
        one_of("raise", "restart"),
    ),
    Option(
        "shard", None, '(rank, world_size), "auto" or None',
        "Load only this rank's share of every epoch (NOTE [rank sharding] in "
        "fastload/_plan.py): ranks are disjoint, cover the dataset, and get the same number of "
        "batches (distributed training hangs otherwise). The epoch's global order is cut "
        "(``drop_last``) or padded by wrapping around to a multiple of ``world_size``; rank "
        "``r`` takes positions ``r, r + world_size, ...``. ``\"auto\"`` follows an initialized "
        "``torch.distributed`` process group first (only if torch is already imported), then "
        "the launchers' variables: torchrun's and ``accelerate launch``'s "
        "``RANK``/``WORLD_SIZE``, Lightning's ``WORLD_SIZE``/``LOCAL_RANK``/``NODE_RANK`` (rank "
        "``NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``; on node 0 ``LOCAL_RANK``), Slurm's "
        "``SLURM_PROCID``/``SLURM_NTASKS``, Open MPI's ``OMPI_COMM_WORLD_RANK``/"
        "``OMPI_COMM_WORLD_SIZE``, PMI's ``PMI_RANK``/``PMI_SIZE`` and MVAPICH's "
        "``MV2_COMM_WORLD_RANK``/``MV2_COMM_WORLD_SIZE`` (a single process if none is set). It "
        "raises ``ValueError`` naming both when the group and a launcher of several processes "
        "disagree, or when the variables say several processes but not which one this is "
        "(``WORLD_SIZE=2`` alone): build the Loader after ``init_process_group`` or pass "
        "``(rank, world_size)`` (NOTE [rank detection] in fastload/_config.py). It is read when "
        "the Loader is built and again at its first ``iter()``: ranks started in between "
        "(a Loader built before Lightning's ``Trainer.fit``) are a ``ValueError``. With ``None`` "
        "in one of several ranks (those variables, or an initialized ``torch.distributed``), "
        "the first ``iter()`` warns (``RuntimeWarning``) that every "
        "rank loads the whole dataset (NOTE [one rank of many]); ``(0, 1)`` says so on purpose "
        "and is not warned. Not with ``batch_plan`` (the plan gives this rank's batches).",
    ),
    Option(
        "return_mask", False, "bool",
        "Yield ``(batch, mask)``, where ``mask`` is a bool array that is False for the padded "
        "duplicates of ``shard``, so that evaluation metrics can ignore them.",
        boolean,
    ),
    Option(
        "pool", None, "fastload.Pool, optional",
        "Use this pool's worker processes instead of starting new ones (``num_workers``, "
        "``start_method`` and ``worker_init`` are the pool's: giving a different value is a "
        "``ValueError``). The dataset is sent to the pool's workers once, pickled. Closing the "
        "loader leaves the pool running.",
    ),
    Option(
        "batch_plan", None, "callable, optional",
        "``batch_plan(epoch)`` returns that epoch's batches as sequences of sample indices, "
        "for samplers of your own (the front ends in :mod:`fastload.compat` drive torch's and "
        "Chainer's samplers through it). Called once per epoch at its first ``next()``, never "
        "ahead, so a sampler may depend on what happened before; the epoch number is the "
        "``epoch`` attribute of ``iter(loader)``. ``batch_size`` is then the largest batch it "
        "may return; ``drop_last`` does not apply, and ``shuffle=True`` or a ``shard`` is a "
        "``ValueError`` (shuffle or split inside the plan). The plan may also define "
        "``bind(batch_size=, seed=, n=)`` (called once, when the Loader is built), "
        "``num_batches(epoch)`` (what ``len(loader)`` says, asked before the epoch starts; "
        "else ``ceil(len(dataset) / batch_size)``) and ``state_dict()`` / "
        "``load_state_dict(state)``, which the Loader's state carries, so that "
        ":meth:`load_state_dict` resumes it (the plan must give the same batches for an epoch "
        "again); without them :meth:`load_state_dict` is refused. "
        ":class:`fastload.TokenBudget` defines all four (NOTE [batch plans] in "
        "fastload/_plan.py).",
        _callable_or_none,
    ),
    Option(
        "on_stall", None, "(seconds, callback), optional",
        "``callback(description)`` is called once for each batch that takes longer than "
        "``seconds`` to arrive (also while the first sample, which sets the layout, is "
        "loading), with a sentence naming the worker and the sample it is loading. The wait "
        "goes on, unlike ``timeout``.",
        _stall,
    ),
    Option(
        "ragged", None, '{"list", "pad", "packed"} or dict, optional',
        "Array leaves whose shape varies from sample to sample (same dtype and number of "
        "dimensions; NOTE [ragged leaves] in fastload/_ragged.py): one mode for every array "
        "leaf of 1 or more dimensions, or a dict from leaf to mode, the leaf named by its path "
        "as errors print it (``\"sample['tokens']\"``, ``\"sample[0]\"``) or, in a dict sample, "
        "by its key (``\"tokens\"``). A declared leaf comes back in its mode in every batch: "
        "``\"list\"``, a list of arrays (views); ``\"pad\"``, :class:`fastload.Padded` "
        "``(values, lengths)``, padded by the worker with ``pad_value``; ``\"packed\"``, "
        ":class:`fastload.Packed` ``(values, offsets)``, the samples concatenated along axis 0 "
        "(``offsets`` is ``cu_seqlens``). Ragged values are written into the slot without "
        "pickling and read as views; a batch too large for its slot travels over the worker's "
        "pipe (``stats()[\"spilled_batches\"]``). A name that is not an array leaf of the first "
        "sample is a :class:`LayoutMismatchError` at the first batch.",
    ),
    Option(
        "pad_value", 0, "number",
        "What ``\"pad\"`` fills with (0).",
    ),
    Option(
        "pad_to_multiple", None, "int, optional",
        "``\"pad\"`` rounds the padded extents up to a multiple of this (fewer distinct "
        "shapes for compiled models): a 1-d leaf's length in every batch, even one whose "
        "rows agree; in a leaf of more dimensions, each axis on which the batch's rows differ "
        "(an axis on which they agree, such as channels, is kept).",
    ),
    Option(
        "stack", True, "bool",
        "``False``: each batch is the list of its samples, each with its own structure (keys, "
        "nesting, leaf types and shapes may differ from sample to sample; NOTE [unstacked "
        "batches] in fastload/_ragged.py). Every array in a sample (not of objects), wherever "
        "it is, even inside a dict subclass or an object of yours, is written into the slot "
        "without pickling and comes back as a view; the rest of each sample comes back as "
        "itself (pickled). ``ragged`` does not apply.",
        boolean,
    ),
    Option(
        "share_dataset", True, "bool",
        "Before the workers start, the dataset's large Python containers (a ``list``, "
        "``tuple`` or ``dict`` of 10,000 items or an estimated 16 MiB: among its attributes, "
        "one level into plain containers of them, and in objects it wraps, such as torch's "
        "``Subset``; or the dataset itself if it is a list) become :class:`fastload.SharedList` "
        "/ :class:`fastload.SharedDict` in the copy the workers get, so that all workers read "
        "one copy in shared memory instead of each copying it (fork: page by page as it reads; "
        "spawn/forkserver: unpickled whole). Your object in the main process is not changed; "
        "``stats()[\"shared_dataset\"]`` lists what was shared (NOTE [shared datasets] in "
        "fastload/_share.py). An object whose class has pickling of its own (``__getstate__``, "
        "``__setstate__``, ``__reduce__``, ``__reduce_ex__``) is left as it is, nothing in it "
        "shared, and so are arrays, memmaps, open files and containers of them. ``False`` "
        "sends the dataset as it is.",
        boolean,
    ),
    Option(
        "shuffle_buffer", None, "int, optional",
        "For a :class:`fastload.ShardedStream` with ``shuffle=True``: each shard's samples are "
        "permuted within consecutive windows of this many samples (default 1024), besides the "
        "shard order (NOTE [stream order] in fastload/_stream.py). Other datasets are "
        "shuffled whole and refuse it.",
    ),
    Option(
        "on_error", "raise", '{"raise", "skip"}',
        "What a sample whose ``__getitem__`` raises does. ``\"raise\"``: its batch raises the "
        "error (rebuilt as :class:`WorkerError` from a worker) and the next ``next()`` goes on "
        "with the next batch, as torch's iterator does. ``\"skip\"``: the sample is replaced by "
        "the next sample of its batch that loads, wrapping round to the batch's first (a worker "
        "holds only its batch), so batches keep their size and the result is the same for any "
        "``num_workers``, start method and resume. The first 10 replacements are logged "
        "(logger ``fastload``); ``stats()[\"skipped\"]`` lists the latest 1,000 (``epoch``, "
        "``index``, ``error``, ``replaced_by``) and ``stats()[\"skipped_total\"]`` counts them. "
        "A batch whose every sample raises still raises. With ``__getitems__``, a call that "
        "raises is followed by one ``__getitem__`` per sample to find which. A sample that "
        "loads but does not fit the layout is not skipped (:class:`LayoutMismatchError`: "
        "declare it with ``ragged`` or ``stack=False``). Map-style datasets only (a stream's "
        "iterator cannot go on after it raised: skip inside it); NOTE [skipped samples] in "
        "fastload/_fill.py.",
        one_of("raise", "skip"),
    ),
    Option(
        "max_skips", None, "int, optional",
        "With ``on_error=\"skip\"``: more than this many replaced samples in one epoch raise "
        ":class:`SkipLimitError` (listing them; ``.skipped`` holds ``(index, \"Type: "
        "message\")`` pairs) and end the epoch. Counted per epoch (a resumed epoch counts from "
        "the resume). ``None``: no limit.",
        int_at_least(0, none_ok=True),
    ),
    Option(
        "share_rows", True, "bool",
        "Let idle workers load the remaining samples of the oldest unfinished batch, so the "
        "first batch and the last ones of an epoch do not wait for one worker while the others "
        "idle: the first batch of each epoch, its last ``2 * num_workers`` and those loaded "
        "ahead for the next epoch are shared (a batch that takes less than 20 ms to load is "
        "still taken whole by one worker), the others are each loaded by one worker. It "
        "applies to map-style datasets loaded one ``__getitem__`` at a time into fixed-shape "
        "batches (no ``__getitems__``, ragged or object leaves, or ``on_error=\"skip\"``), with "
        "two workers or more; the batches are the same either way, only which worker loads "
        "which sample changes (``get_worker_info().id`` may differ between the samples of a "
        "shared batch), and a shared batch raises the error of its lowest failing sample, as "
        "one worker would; ``stats()[\"shared_rows\"]`` says whether it applies. NOTE "
        "[pieces] in csrc/fl_ring.c.",
        boolean,
    ),
    Option(
        "seed_globals", None, "bool, optional",
        "Seed the global RNGs (``random``, ``numpy.random``, torch's default generator if "
        "torch is imported) before each sample from ``(seed, epoch, index)``, so augmentation "
        "drawn from them inside ``__getitem__`` is reproducible for any ``num_workers``, as "
        ":func:`sample_rng` is. ``None``: when the first sample draws from them (checked "
        "once; ~6 us per sample from then on). ``False``: never (each worker's RNGs are seeded "
        "once, from ``(seed, worker id)``). With ``num_workers=0`` your own RNG states are "
        "restored after each batch. Not with thread workers (they share the process's RNGs: "
        "use :func:`sample_rng`) or plain iterables. NOTE [global RNGs] in fastload/_rngs.py.",
        _bool_or_none,
    ),
    Option(
        "io_concurrency", 1, "int",
        "Samples of a batch each worker (or, with ``num_workers=0``, this process) loads at "
        "once, on that many threads of its own: for datasets that wait on storage (object "
        "stores, network file systems), where each read waits 10-100 ms. Rows stay in order "
        "and batches, errors, skips, resume and timeouts are as with 1; an ``async def "
        "__getitem__`` is awaited on the threads' event loops. The global RNGs are not seeded "
        "per sample with more than 1 (``seed_globals``): use :func:`sample_rng`. NOTE [reads in "
        "flight] in fastload/_io.py.",
        int_at_least(1),
    ),
    Option(
        "assign", "any", '{"any", "round_robin"}',
        "Which worker loads which batch. ``\"any\"``: the first free worker (and idle "
        "workers share a batch's rows, ``share_rows``). ``\"round_robin\"``: batch ``b`` of "
        "an epoch goes to worker ``b % num_workers``, as torch's DataLoader does, so a "
        "worker's own RNG streams (``seed_globals=False``) see the same samples run to run; "
        "one slow worker then holds the others back, and no rows are shared.",
        one_of("any", "round_robin"),
    ),
    Option(
        "in_order", True, "bool",
        "Deliver batches in the epoch's order. ``False``: each batch as soon as it is loaded, "
        "so a slow sample holds back no batch but its own, as torch's ``in_order=False``; "
        "with ``assign=\"round_robin\"`` the next batch goes to the next worker in turn that "
        "has fewer than ``prefetch`` batches outstanding, torch's assignment. Every batch of the "
        "epoch still comes exactly once; ``return_mask``'s mask is the delivered batch's. "
        "``state_dict()`` in the middle of such an epoch raises (a position cannot say which "
        "batches came): save between epochs. With ``num_workers=0`` batches are in order.",
        boolean,
    ),
)

BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}


def check_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (option name -> value) checked by their options' checks, in the options'
    order; returns them with each check's result (bools as bool). Names without a record, or
    records without a check, pass through unchanged."""
    out = dict(values)
    for opt in OPTIONS:
        if opt.check is not None and opt.name in out:
            out[opt.name] = opt.check(opt.name, out[opt.name])
    return out


# -- rendering -------------------------------------------------------------------------------
def docstring_parameters() -> str:
    """The numpydoc "Parameters" section of Loader's docstring (no indentation)."""
    lines = ["Parameters", "----------"]
    for opt in OPTIONS:
        lines.append(f"{opt.name} : {opt.type}")
        lines.extend(textwrap.wrap(opt.doc, width=92, initial_indent="    ",
                                   subsequent_indent="    ", break_on_hyphens=False,
                                   break_long_words=False))
    return "\n".join(lines)


_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc):`~?([^`]+)`")


def _markdown(rest: str) -> str:
    """reST inline markup of a description as Markdown."""
    return _ROLE.sub(r"`\1`", rest).replace("``", "`")


def _markdown_type(t: str) -> str:
    """numpydoc's type line as docs/api.md shows it: literals and tuples as code."""
    t = re.sub(r"\{([^}]*)\}", r"\1", t)
    return re.sub(r'("[^"]*"|\([^)]*\))', r"`\1`", t)


#: The first line of docs/api.md's options table (its end: the first blank line).
TABLE_HEAD = "| parameter | type | meaning |\n| --- | --- | --- |\n"


def api_table() -> str:
    """docs/api.md's table of Loader's options, ending with a newline."""
    rows = []
    for opt in OPTIONS:
        cells = (f"`{opt.name}`", _markdown_type(opt.type), _markdown(opt.doc))
        assert not any("|" in c for c in cells), f"a | in {opt.name}'s row"
        rows.append("| " + " | ".join(cells) + " |\n")
    return TABLE_HEAD + "".join(rows)


def api_signature() -> str:
    """docs/api.md's signature block of Loader (the code inside the fence)."""
    lines = ["fastload.Loader("]
    star = False
    for opt in OPTIONS:
        if not opt.positional and not star:
            lines.append("    *,")
            star = True
        if opt.default is REQUIRED:
            lines.append(f"    {opt.name},")
        else:
            default = opt.default
            shown = f'"{default}"' if isinstance(default, str) else repr(default)
            lines.append(f"    {opt.name}={shown},")
    lines.append(")")
    return "\n".join(lines) + "\n"


_SIGNATURE = re.compile(r"(```python\n)(fastload\.Loader\(\n.*?^\)\n)(```)", re.S | re.M)


def render_api(text: str) -> str:
    """docs/api.md's ``text`` with its Loader signature block and options table rendered
    from OPTIONS (ValueError if either is not found)."""
    sig = _SIGNATURE.search(text)
    start = text.find(TABLE_HEAD)
    if sig is None or start < 0:
        raise ValueError("docs/api.md: no Loader signature block or options table found")
    end = text.find("\n\n", start) + 1
    text = text[:start] + api_table() + text[end:]
    return _SIGNATURE.sub(lambda m: m.group(1) + api_signature() + m.group(3), text, count=1)


def main(argv: list[str]) -> int:
    """``python -m fastload._options docs/api.md``: rewrite that file's Loader signature and
    options table from OPTIONS; with no argument, print the table."""
    if not argv:
        sys.stdout.write(api_table())
        return 0
    for path in argv:
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = render_api(old)
        if new != old:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"{path}: rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
