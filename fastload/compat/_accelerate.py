"""NOTE [accelerate] lives on ``keep_fastload_in_accelerate``: accelerate's ``prepare()``
rebuilds a ``fastload.compat.torch.DataLoader`` as a fastload one (imported by
fastload.compat.torch, which re-exports it; accelerate itself is imported only if the user's
program already has)."""

from __future__ import annotations

from typing import Any

__all__ = ["keep_fastload_in_accelerate", "register"]

#: fastload.compat.torch.DataLoader, registered by that module when it is imported (this module
#: imports nothing of it: no import cycle).
_DATALOADER: list[type] = []


def register(cls: type) -> None:
    """The DataLoader class accelerate is to build (fastload.compat.torch's)."""
    _DATALOADER[:] = [cls]


def keep_fastload_in_accelerate() -> bool:
    """NOTE [accelerate]
    ``Accelerator.prepare(dl)`` does not wrap a DataLoader: it builds a new one
    (``accelerate.data_loader.DataLoaderShard``, around a *torch* ``DataLoader`` it constructs
    from ``dl``'s attributes with its own ``BatchSamplerShard``), so a fastload DataLoader would
    come back as torch's: right data, rank by rank, but loaded by torch's workers. Once this has
    run, accelerate's ``prepare_data_loader`` and ``skip_first_batches`` build that inner
    DataLoader as a fastload DataLoader whenever the loader handed to them is one (torch's
    loaders are left to accelerate as they are; fastload's ``max_held`` and ``copy`` carry
    over). accelerate builds the inner loader by a module-level name, ``DataLoader``, which is
    swapped for fastload's for the duration of that one call. Run when this module is imported
    and when a DataLoader is created, if accelerate is imported by then; call it yourself if you
    import accelerate after creating your loaders. Returns whether accelerate is hooked.
    """
    import sys

    if "accelerate" not in sys.modules:
        return False
    try:
        import accelerate.accelerator as acc
        import accelerate.data_loader as adl
    except ImportError:
        return False
    for module in (acc, adl):
        for name in ("prepare_data_loader", "skip_first_batches"):
            fn = getattr(module, name, None)
            if fn is not None and not getattr(fn, "_fastload", False):
                setattr(module, name, _rebuilding_fastload(fn, adl))
    return True


def _fastload_source(obj: Any) -> Any:
    """The fastload DataLoader behind what accelerate was handed (itself, or a DataLoaderShard
    around one, for skip_first_batches)."""
    if not _DATALOADER:
        return None
    for dl in (obj, getattr(obj, "base_dataloader", None)):
        if isinstance(dl, _DATALOADER[0]):
            return dl
    return None


def _rebuilding_fastload(fn: Any, adl: Any) -> Any:
    import functools

    @functools.wraps(fn)
    def call(dataloader: Any = None, *args: Any, **kwargs: Any) -> Any:
        src = _fastload_source(dataloader)
        if src is None:
            return fn(dataloader, *args, **kwargs)
        torch_dl = adl.DataLoader

        def build(dataset: Any, *a: Any, **kw: Any) -> Any:
            kw.setdefault("max_held", src._max_held)
            kw.setdefault("copy", src._copy)
            return type(src)(dataset, *a, **kw)

        adl.DataLoader = build
        try:
            return fn(dataloader, *args, **kwargs)
        finally:
            adl.DataLoader = torch_dl

    call._fastload = True  # type: ignore[attr-defined]
    return call
