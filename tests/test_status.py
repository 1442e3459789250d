"""The C status codes (csrc/fl_status.h, exported as fastload._ring.STATUS_CODES) and the Python
mirror (fastload._status.Status) must agree name for name and value for value."""

from __future__ import annotations

import pytest

import fastload
from fastload import _ring
from fastload._status import Status, raise_for_status


def test_status_codes_match_python_enum():
    assert _ring.STATUS_CODES == {m.name: m.value for m in Status}


def test_status_codes_are_distinct_and_ok_is_zero():
    values = list(_ring.STATUS_CODES.values())
    assert len(set(values)) == len(values)
    assert _ring.STATUS_CODES["OK"] == 0
    assert all(v < 0 for k, v in _ring.STATUS_CODES.items() if k != "OK")


@pytest.mark.parametrize("name", sorted(m.name for m in Status))
def test_every_code_has_its_own_message(name):
    msg = _ring.strerror(Status[name].value)
    assert msg and msg != _ring.strerror(12345)


def test_unknown_code_has_a_message():
    assert "unknown" in _ring.strerror(12345)


@pytest.mark.parametrize(
    "name, exc",
    [
        ("ETIMEOUT", fastload.LoaderTimeoutError),
        ("ELAYOUT", fastload.LayoutMismatchError),
        ("EINVAL", ValueError),
        ("ERANGE", fastload.SampleTooLargeError),
        ("ENOSPACE", fastload.SampleTooLargeError),
        ("ESTATE", fastload.FastloadError),
        ("ESTOPPED", fastload.FastloadError),
    ],
)
def test_raise_for_status_maps_codes(name, exc):
    rc = Status[name].value
    with pytest.raises(exc) as info:
        raise_for_status(rc, _ring.strerror(rc), "doing a thing")
    assert "doing a thing" in str(info.value) and f"code {rc}" in str(info.value)


def test_error_hierarchy_keeps_builtin_bases():
    assert issubclass(fastload.LoaderTimeoutError, TimeoutError)
    assert issubclass(fastload.LayoutMismatchError, ValueError)
    assert issubclass(fastload.LoaderClosedError, RuntimeError)
    assert issubclass(fastload.WorkerDied, RuntimeError)
    with pytest.warns(DeprecationWarning, match="use fastload.WorkerDied"):
        assert fastload.WorkerCrashedError is fastload.WorkerDied
    with pytest.warns(DeprecationWarning):
        assert fastload.errors.WorkerCrashedError is fastload.WorkerDied
    for cls in (fastload.LoaderTimeoutError, fastload.LayoutMismatchError,
                fastload.LoaderClosedError, fastload.WorkerDied, fastload.WorkerError,
                fastload.SampleTooLargeError):
        assert issubclass(cls, fastload.FastloadError)
