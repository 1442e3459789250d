"""Loader's options defined once (fastload/_options.py): the signature, the docstring and
docs/api.md agree with the records; bool options are checked; batch_plan refuses what it
overrides; copy=True sets no slots aside for held batches."""

from __future__ import annotations

import dataclasses
import doctest
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from fastload import _options
from fastload._config import LoaderConfig
from fastload._options import BY_NAME, OPTIONS, REQUIRED
from fastload.loader import Loader

ROOT = Path(__file__).resolve().parents[1]
BOOLS = [o.name for o in OPTIONS if o.type == "bool"]


def test_signature_is_the_records():
    params = [p for p in inspect.signature(Loader.__init__).parameters.values()
              if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert [p.name for p in params] == [o.name for o in OPTIONS]
    for p, o in zip(params, OPTIONS):
        default = REQUIRED if p.default is inspect.Parameter.empty else p.default
        assert default == o.default and type(default) is type(o.default), o.name
        positional = p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert positional == o.positional, o.name


def test_docstring_has_every_option_and_its_examples_run():
    doc = Loader.__doc__ or ""
    assert _options.docstring_parameters().replace("\n", "\n    ") in doc
    for o in OPTIONS:
        assert f"\n    {o.name} : {o.type}\n" in doc
    assert "Examples\n    --------" in doc
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(Loader, "Loader", globs={})
    assert test.examples
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
    assert result.failed == 0


def test_api_md_agrees_with_the_records():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert _options.render_api(text) == text, (
        "docs/api.md's Loader signature or options table differs from fastload/_options.py: "
        "run python -m fastload._options docs/api.md"
    )
    assert _options.api_table() in text
    for name in BOOLS + ["share_rows", "on_error", "max_skips", "shuffle_buffer"]:
        assert f"| `{name}` |" in text


#: Options that LoaderConfig holds in another form (or not at all), and where they go.
NOT_CONFIG_FIELDS = {
    "dataset": "the Engine's", "pool": "the Engine's (num_workers is the pool's)",
    "ragged": "sample_spec", "pad_value": "sample_spec", "pad_to_multiple": "sample_spec",
    "stack": "sample_spec", "shuffle_buffer": "the stream view's (fastload/_stream.py)",
}


def test_loader_config_holds_every_option():
    fields = {f.name for f in dataclasses.fields(LoaderConfig)}
    for o in OPTIONS:
        assert (o.name in fields) != (o.name in NOT_CONFIG_FIELDS), o.name


def test_loader_config_build_defaults_are_the_records():
    params = inspect.signature(LoaderConfig.build).parameters
    for o in OPTIONS:
        p = params.get(o.name)
        if p is not None and p.default is not inspect.Parameter.empty:
            assert p.default == o.default, o.name


def test_readme_api_block_shows_the_records_defaults():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text[text.index("loader = fastload.Loader(") : text.index("\n)\n")]
    shown = dict(re.findall(r"\b(\w+)=(None|True|False|\"\w+\"|-?\d+)", block))
    assert len(shown) >= 10
    for name, value in shown.items():
        assert name in BY_NAME, name
        default = BY_NAME[name].default
        assert value == (f'"{default}"' if isinstance(default, str) else repr(default)), name


def test_bool_options_are_listed():
    assert set(BOOLS) == {"shuffle", "drop_last", "copy", "return_mask", "stack",
                          "share_dataset", "share_rows", "in_order"}


@pytest.mark.parametrize("name", BOOLS)
@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (np.bool_(True), True), (np.bool_(False), False),
    (1, True), (0, False), (np.int64(1), True),
])
def test_bool_options_take_bools_and_0_1(name, value, expected):
    assert _options.boolean(name, value) is expected
    # and the loader takes it (shuffle and share_rows included)
    with Loader(np.arange(4), 2, num_workers=0, **{name: value}) as loader:
        assert len(list(loader)) >= 1


@pytest.mark.parametrize("name", BOOLS)
@pytest.mark.parametrize("value, shown", [
    ("False", "'False' (a str)"), (None, "None (a NoneType)"), (2, "2 (an int)"),
    (1.0, "1.0 (a float)"), ([], "[] (a list)"), (np.int64(2), "np.int64(2) (an int64)"),
])
def test_bool_options_refuse_anything_else_naming_it(name, value, shown):
    shown = shown if np.__version__ >= "2" else shown.replace("np.int64(2)", "2")
    msg = f"{name} must be True or False, got {shown}"
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        Loader(np.arange(4), 2, num_workers=0, **{name: value})


def test_share_dataset_false_as_a_string_is_refused():
    # was: sharing turned ON ("False" is truthy)
    with pytest.raises(TypeError, match=r"share_dataset must be True or False, got 'False' "
                                        r"\(a str\)"):
        Loader(np.arange(4), 2, num_workers=0, share_dataset="False")


def test_stack_0_is_taken_as_false():
    with Loader([np.zeros(2), np.ones(3)], 2, num_workers=0, stack=0) as loader:
        (batch,) = list(loader)
    assert isinstance(batch, list) and [len(a) for a in batch] == [2, 3]


@pytest.mark.parametrize("kw, what", [
    (dict(shuffle=True), "shuffle=True"),
    (dict(shard=(0, 2)), r"shard=\(0, 2\)"),
    (dict(shard="auto"), "shard='auto'"),
    (dict(shard=(0, 1)), r"shard=\(0, 1\)"),
])
def test_batch_plan_refuses_shuffle_and_shard(kw, what):
    with pytest.raises(ValueError, match=rf"^{what} does not apply with batch_plan: .*inside "
                                         "batch_plan"):
        Loader(np.arange(8), 2, num_workers=0, batch_plan=lambda e: [[0, 1]], **kw)


def test_batch_plan_alone_and_with_shuffle_false_still_works():
    with Loader(np.arange(8), 2, num_workers=0, shuffle=False, shard=None,
                batch_plan=lambda e: [[3, 1], [0]]) as loader:
        assert [b.tolist() for b in loader] == [[3, 1], [0]]


def _nslots(**kw):
    with Loader(np.arange(16, dtype=np.float32), 2, num_workers=2, prefetch=2,
                start_method="fork", **kw) as loader:
        it = iter(loader)
        next(it)
        stats = loader.stats()
        del it
    return stats


@pytest.mark.timeout(60)
def test_copy_sets_no_slots_aside_for_held_batches():
    copied = _nslots(copy=True)
    assert copied["nslots"] == _nslots(max_held=0)["nslots"] == 2 * 2
    assert copied["nslots"] < _nslots()["nslots"]
    assert copied["copied_batches"] == 0  # copies asked for are not counted as fallbacks


def test_copy_true_still_returns_owned_copies():
    with Loader(np.arange(6, dtype=np.float32), 2, num_workers=0, copy=True,
                max_held=5) as loader:
        batches = list(loader)
    assert all(b.base is None or isinstance(b.base, np.ndarray) for b in batches)
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]
