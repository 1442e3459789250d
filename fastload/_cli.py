"""Command-line helpers of ``python -m fastload bench`` and ``doctor`` (and the benchmarks'
harness): argparse types, so that a count or a duration that must be positive is refused at
parse time, naming the flag, rather than read as "not given" (``args.n or default`` ran the
default for ``--n 0``); ``--ragged``'s forms; the doctor's ``module:function`` argument."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["non_negative_int", "positive_float", "positive_int", "ragged_arg", "ragged_flag",
           "resolve"]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):  # NaN and inf too
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def ragged_arg(text: str) -> str | dict[str, str]:
    """``--ragged``: what ``Loader(ragged=)`` takes, as text: one mode for every array leaf
    (``pad``, ``packed``, ``list``) or a JSON object of leaf -> mode
    (``'{"tokens": "pad"}'``, or a path as errors print it: ``'{"sample[0]": "list"}'``)."""
    from ._ragged import MODES

    example = """'{"tokens": "pad"}'"""
    if text in MODES:
        return text
    if not text.lstrip().startswith("{"):
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(MODES)} or a JSON object of leaf -> mode, e.g. "
            f"{example}; got {text!r}")
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"not valid JSON ({e}): quote it for the shell, e.g. --ragged {example}") from None
    bad = [f"{k!r}: {v!r}" for k, v in value.items() if v not in MODES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"each leaf's mode must be one of {', '.join(MODES)}; got {', '.join(bad)}")
    return {str(k): str(v) for k, v in value.items()}


def ragged_flag(path: str) -> str:
    """``--ragged``'s value declaring the leaf at ``path`` padded, quoted for a POSIX shell."""
    import json
    import re
    import shlex

    key = re.fullmatch(r"sample\['([A-Za-z0-9_.-]+)'\]", path)  # a top-level key names itself
    return shlex.quote(json.dumps({key.group(1) if key else path: "pad"}))


def resolve(spec: str) -> Any:
    """``module:attr`` or ``path/to/file.py:attr`` -> the object (a dataset or a factory)."""
    import importlib
    import importlib.util

    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise SystemExit(f"doctor: expected module:function (e.g. my_data:make_dataset), got "
                         f"{spec!r}")
    if mod_name.endswith(".py") or os.sep in mod_name:
        if not os.path.isfile(mod_name):
            raise SystemExit(f"doctor: no file {mod_name!r}")
        sys.path.insert(0, os.path.dirname(os.path.abspath(mod_name)))
        name = os.path.splitext(os.path.basename(mod_name))[0]
        spec_ = importlib.util.spec_from_file_location(name, mod_name)
        assert spec_ is not None and spec_.loader is not None
        module = importlib.util.module_from_spec(spec_)
        sys.modules[name] = module  # picklable by name for spawn/forkserver workers
        spec_.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise SystemExit(f"doctor: cannot import {mod_name!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"doctor: {mod_name} has no {attr!r}") from None
    return obj
