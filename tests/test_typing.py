"""Static checks, run as tests: ``mypy --strict``, ``ruff check`` and ``mypy.stubtest``.

The configuration lives in pyproject.toml ([tool.mypy], [tool.ruff]). Each test skips, naming
the missing tool, when that tool is not installed (``pip install -e ".[test]"`` installs them),
and when the source tree is not next to the tests (cibuildwheel runs the tests from a copy).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "fastload"

#: stubtest allowlist (regular expressions): names the compiled modules expose that are not
#: fastload's API and cannot be described by a stub. Cython 3 leaves each cdef class's pickling
#: helpers and its doctest dictionary in the module namespace.
STUBTEST_ALLOWLIST = """\
fastload\\._(ring|pack)\\.__(reduce|setstate)_cython__
fastload\\._(ring|pack)\\.__test__
"""


def _need_tool(module: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{pip_name} is not installed (pip install {pip_name}, or -e '.[test]')")


def _need_source_tree() -> None:
    if not (SRC / "__init__.py").is_file() or not (ROOT / "pyproject.toml").is_file():
        pytest.skip("the fastload source tree is not next to the tests")


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    print(proc.stdout)
    print(proc.stderr, file=sys.stderr)
    return proc


@pytest.mark.timeout(360)
def test_mypy_strict(tmp_path: Path) -> None:
    _need_tool("mypy", "mypy")
    _need_source_tree()
    proc = _run(["-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "fastload"])
    assert proc.returncode == 0, f"mypy --strict fastload failed:\n{proc.stdout}{proc.stderr}"


@pytest.mark.timeout(120)
def test_ruff() -> None:
    _need_tool("ruff", "ruff")
    _need_source_tree()
    paths = [p for p in ("fastload", "tests", "benchmarks", "examples") if (ROOT / p).is_dir()]
    proc = _run(["-m", "ruff", "check", "--no-cache", *paths])
    assert proc.returncode == 0, f"ruff check failed:\n{proc.stdout}{proc.stderr}"


@pytest.mark.timeout(360)
def test_stubtest(tmp_path: Path) -> None:
    _need_tool("mypy", "mypy")
    _need_source_tree()
    compiled = [
        p
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        for p in SRC.glob(f"_ring{suffix}")
    ]
    if not compiled:
        pytest.skip("the compiled core is not built in the source tree (pip install -e .)")
    allowlist = tmp_path / "stubtest-allowlist.txt"
    allowlist.write_text(STUBTEST_ALLOWLIST)
    proc = _run(
        [
            "-m", "mypy.stubtest",
            "--mypy-config-file", str(ROOT / "pyproject.toml"),
            "--allowlist", str(allowlist),
            "--ignore-unused-allowlist",  # the entries depend on the Cython version
            "fastload._ring", "fastload._pack",
        ]
    )
    assert proc.returncode == 0, f"stubtest failed:\n{proc.stdout}{proc.stderr}"


def test_py_typed_and_stubs_ship() -> None:
    """PEP 561: the marker and the stubs of both compiled modules are package data."""
    _need_source_tree()
    assert (SRC / "py.typed").is_file()
    for name in ("_ring", "_pack"):
        assert (SRC / f"{name}.pyi").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"py.typed"' in pyproject and '"*.pyi"' in pyproject
