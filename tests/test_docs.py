"""The documentation runs: the Python blocks of docs/*.md and every script in examples/.

Every ```python block in the checked documents is preceded by a marker line:

    <!-- docs-test: run -->               executed; must exit 0
    <!-- docs-test: requires torch -->    executed when that module is installed, else skipped
    <!-- docs-test: skip (reason) -->     shown only (e.g. a signature)

A block without a marker fails the test, so that no example goes unchecked by accident. Each
block runs as a script of its own in a fresh interpreter (as a user would run it; with spawn or
forkserver the workers re-import it), with the fastload this test session imports.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastload

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
CHECKED_DOCS = ["migrating.md", "api.md"]
RUN_TIMEOUT_S = 120

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")


def _blocks() -> list[tuple[str, int, str, str]]:
    """(document, line, marker, code) for every ```python block of the checked documents."""
    out = []
    for name in CHECKED_DOCS:
        path = DOCS / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            previous_line = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mk = _MARKER.fullmatch(previous_line.strip())
            out.append((name, line, mk.group(1) if mk else "", m.group(1)))
    return out


BLOCKS = _blocks()


def _env(cwd: Path) -> dict[str, str]:
    """Make the child import the same fastload as this test session, and keep its cache (the
    shard-length index of streams without shard_len) in ``cwd``, not in the user's ~/.cache."""
    env = dict(os.environ)
    pkg_parent = str(Path(fastload.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    env["FASTLOAD_CACHE_DIR"] = str(cwd / "fastload-cache")
    return env


def _run_script(path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        cwd=cwd,
        env=_env(cwd),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    print(proc.stdout)
    print(proc.stderr, file=sys.stderr)
    return proc


def test_scripts_keep_the_cache_in_their_folder(tmp_path: Path) -> None:
    # The api.md stream example counts text shards: its index went to the user's ~/.cache.
    script = tmp_path / "where.py"
    script.write_text("from fastload._shard_lengths import cache_dir\nprint(cache_dir())\n",
                      encoding="utf-8")
    proc = _run_script(script, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / "fastload-cache")


def test_docs_have_python_blocks() -> None:
    if not DOCS.is_dir():
        pytest.skip("docs/ is not next to the tests")
    assert any(name == "migrating.md" for name, *_ in BLOCKS)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize(
    "doc,line,marker,code", BLOCKS, ids=[f"{d}:{ln}" for d, ln, _, _ in BLOCKS]
)
def test_doc_block(doc: str, line: int, marker: str, code: str, tmp_path: Path) -> None:
    where = f"docs/{doc} line {line}"
    assert marker, f"{where}: a ```python block needs a <!-- docs-test: ... --> marker line"
    if marker.startswith("skip"):
        pytest.skip(f"{where}: {marker}")
    req = re.fullmatch(r"requires (\w+)", marker)
    if req is not None:
        if importlib.util.find_spec(req.group(1)) is None:
            pytest.skip(f"{where}: needs {req.group(1)}, which is not installed")
    else:
        assert marker == "run", f"{where}: unknown marker {marker!r}"
    script = tmp_path / f"{Path(doc).stem}_{line}.py"
    script.write_text(code, encoding="utf-8")
    proc = _run_script(script, tmp_path)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"


def test_api_reference_covers_public_names() -> None:
    api = DOCS / "api.md"
    if not api.is_file():
        pytest.skip("docs/ is not next to the tests")
    text = api.read_text(encoding="utf-8")
    missing = [n for n in fastload.__all__ if f"`{n}`" not in text and f"## {n}" not in text]
    assert not missing, f"docs/api.md does not document {missing}"


EXAMPLE_SCRIPTS = sorted(EXAMPLES.glob("*.py")) if EXAMPLES.is_dir() else []


def test_examples_exist() -> None:
    if not EXAMPLES.is_dir():
        pytest.skip("examples/ is not next to the tests")
    names = {p.name for p in EXAMPLE_SCRIPTS}
    assert {"numpy_shards.py", "torch_training.py", "augmentation.py"} <= names


def test_the_shards_example_uses_fastloads_npyshards() -> None:
    # It wrote an NpyShards class of its own, next to the library's.
    path = EXAMPLES / "numpy_shards.py"
    if not path.is_file():
        pytest.skip("examples/ is not next to the tests")
    text = path.read_text(encoding="utf-8")
    assert "fastload.NpyShards(" in text and "class NpyShards" not in text


def test_the_readme_says_how_to_install_now_and_which_loader_to_use() -> None:
    if not (ROOT / "README.md").is_file():
        pytest.skip("README.md is not next to the tests")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# fastload\n\n```bash\npip install -e . && python -m fastload bench\n"
                           'pip install -e ".[test]" && python -m pytest\n```\n')
    top = text[:text.index("## Why fastload")]
    # Nothing is published yet: the README must not send a newcomer to a failing command alone.
    assert "Nothing is published on PyPI yet" in top and "`pip install .`" in top
    choices = top[top.index("**Which one do I use?**"):]
    for name in ("fastload.compat.torch.DataLoader", "fastload.Loader", "fastload.ArrayDataset",
                 "fastload.NpyShards", "fastload.ShardedStream"):
        assert f"`{name}`" in choices, name
        module, _, attr = name.rpartition(".")
        if module.endswith("torch") and importlib.util.find_spec("torch") is None:
            continue  # the drop-in needs torch, which is not installed here
        assert callable(getattr(importlib.import_module(module), attr)), name


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS, ids=[p.name for p in EXAMPLE_SCRIPTS])
def test_example_runs(script: Path, tmp_path: Path) -> None:
    # torch_training.py must also exit 0 without PyTorch (it says it skips).
    proc = _run_script(script, tmp_path)
    assert proc.returncode == 0, f"examples/{script.name} failed:\n{proc.stdout}\n{proc.stderr}"


def _readme_quickstart() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Quickstart"):]
    m = _FENCE.search(section)
    assert m is not None, "README.md's Quickstart has no ```python block"
    return m.group(1)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_readme_quickstart_runs_under_every_start_method(method: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if not (ROOT / "README.md").is_file():
        pytest.skip("README.md is not next to the tests")
    script = tmp_path / "quickstart.py"
    script.write_text(_readme_quickstart() + "\nprint('quickstart done')\n", encoding="utf-8")
    monkeypatch.setenv("FASTLOAD_START_METHOD", method)
    proc = _run_script(script, tmp_path)
    assert proc.returncode == 0, f"README quickstart under {method} failed:\n{proc.stderr}"
    assert "quickstart done" in proc.stdout


UNGUARDED = """\
import numpy as np
import fastload

print("module body ran")
loader = fastload.Loader(np.arange(100, dtype=np.float32), 10, num_workers=2, timeout=60)
print(sum(len(b) for b in loader))
"""


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_script_without_a_main_guard_gets_one_short_error(method: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE [unguarded main] in fastload/_pool.py: without it, every worker start (and restart)
    # printed multiprocessing's 60-line RuntimeError before a WorkerDied about "start-up".
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED, encoding="utf-8")
    monkeypatch.setenv("FASTLOAD_START_METHOD", method)
    proc = _run_script(script, tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert err.count("Traceback") == 1, err
    assert len(err.splitlines()) < 40, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fastload.errors.WorkerDied: ") and '__name__ == "__main__"' in last
    assert str(script) in last and "RuntimeError" not in err
