"""Run torch's own DataLoader tests against ``fastload.compat.torch.DataLoader`` (issue 28).

    python tools/torch_suite.py PATH/TO/test_dataloader.py [--against torch] [-k EXPR] [--list]

Not run by CI, and torch's test file is never part of this repository: you give the path of
a copy of pytorch's ``test/test_dataloader.py`` (e.g. from a pytorch checkout at the tag you
want: ``git -C pytorch show v2.6.0:test/test_dataloader.py > /tmp/test_dataloader.py``).
CONTRIBUTING.md says how to run it. Needs torch, pytest, psutil and expecttest
(``pip install expecttest``: torch.testing._internal imports it).

What it does, in a scratch folder (``--scratch``, default a new temporary one):

* copies the file there under its own name (its tests import themselves by file name) with one
  line put first, ``import _fastload_torch_suite``, and writes that module next to it: it
  replaces ``torch.utils.data.DataLoader`` (and ``torch.utils.data.dataloader.DataLoader``)
  with fastload's drop-in before the test module imports the name. Every process that imports
  the test module gets the same replacement: the tests' own spawned processes
  (``ErrorTrackingProcess``) and fastload's workers. ``--against torch`` leaves torch's
  DataLoader in place, to check whether a failure is torch's own on this machine.
* selects the applicable tests (``applicable()``): every test whose code (with the
  module's helpers and the class's methods it calls, followed by name) names DataLoader; not
  those that build one only in the program text of a ``python -c`` subprocess, which imports
  torch's own. Tests skipped on this machine by torch's own decorators (CUDA, CUDA
  IPC, ``@slowTest`` without ``PYTORCH_TEST_WITH_SLOW=1``, Linux-flaky) are counted apart.
* runs them with pytest, one process, and prints the count, the failures, the skips and the
  exclusions with their reasons. The exit status is 0 when every applicable test passed.
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

PATCH_MODULE = "_fastload_torch_suite"
PATCH = '''\
"""Written by fastload's tools/torch_suite.py: torch's DataLoader replaced by fastload's."""
import os

if os.environ.get("FASTLOAD_TORCH_SUITE_AGAINST", "fastload") == "fastload":
    import torch.utils.data
    import torch.utils.data.dataloader

    from fastload.compat.torch import DataLoader

    torch.utils.data.DataLoader = DataLoader
    torch.utils.data.dataloader.DataLoader = DataLoader
'''

#: Why a test that mentions DataLoader only in a string is not applicable: that string is a
#: program run with ``python -c``, which imports torch's own DataLoader.
IN_SUBPROCESS = ("builds torch's own DataLoader in a `python -c` subprocess, which no "
                 "replacement reaches")

#: Names whose mention means a DataLoader is built (torch.utils.data.DataLoader is an
#: attribute named DataLoader).
_LOADER_NAMES = {"DataLoader", "_get_data_loader"}


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def applicable(source: str) -> tuple[list[str], dict[str, str]]:
    """(``Cls::test`` of the tests that build a DataLoader; {``Cls::test``: why excluded} for
    those that mention one only in a program's text). Test classes see their bases' tests,
    as unittest collects them; functions are followed by name through the module and the
    class."""
    tree = ast.parse(source)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        out: dict[str, ast.FunctionDef] = {}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out.update(methods(classes[base.id]))
        out.update({n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)})
        return out

    def is_test_case(cls: ast.ClassDef) -> bool:
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if name == "TestCase" or (name in classes and is_test_case(classes[name])):
                return True
        return False

    chosen: list[str] = []
    excluded: dict[str, str] = {}
    for cls in classes.values():
        if not is_test_case(cls):
            continue
        own = methods(cls)
        for name in sorted(n for n in own if n.startswith("test_")):
            seen: set[str] = set()
            todo = [own[name]]
            builds = False
            while todo and not builds:
                names = _names(todo.pop())
                builds = bool(names & _LOADER_NAMES)
                for n in names - seen:
                    seen.add(n)
                    if n in own:
                        todo.append(own[n])
                    elif n in funcs:
                        todo.append(funcs[n])
            node = f"{cls.name}::{name}"
            if builds:
                chosen.append(node)
            elif any(isinstance(n, ast.Constant) and "DataLoader(" in str(n.value)
                     for n in ast.walk(own[name])):
                excluded[node] = IN_SUBPROCESS
    return chosen, excluded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_file", type=pathlib.Path, help="a copy of torch's test_dataloader.py")
    ap.add_argument("--against", choices=("fastload", "torch"), default="fastload",
                    help="whose DataLoader the tests get (torch: to check torch's own result)")
    ap.add_argument("--scratch", type=pathlib.Path, default=None,
                    help="folder to run in (default: a new temporary folder, removed after)")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k on top of the selection")
    ap.add_argument("--list", action="store_true", help="print the selection and stop")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole run")
    args = ap.parse_args(argv)

    src_path = args.test_file
    if not src_path.is_file():
        ap.error(f"{src_path} is not a file: give the path of a copy of pytorch's "
                 "test/test_dataloader.py")
    source = src_path.read_text()
    if "class TestDataLoader(" not in source:
        ap.error(f"{src_path} has no class TestDataLoader: is it pytorch's "
                 "test/test_dataloader.py?")
    scratch = args.scratch or pathlib.Path(tempfile.mkdtemp(prefix="torch_suite_"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        return _run(args, scratch, source)
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _collected(scratch: pathlib.Path, name: str, env: dict[str, str]) -> list[str]:
    """The node ids pytest collects from the copy (``Cls::test``): device-type tests are
    instantiated per device and parametrized (``TestXCPU::test_y_context_fork_cpu``)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         "--rootdir", str(scratch), name],
        cwd=scratch, env=env, capture_output=True, text=True, timeout=600, check=False)
    return [line.split("::", 1)[1] for line in out.stdout.splitlines()
            if line.startswith(f"{name}::")]


def _select(collected: list[str], chosen: list[str]) -> list[str]:
    """The collected node ids of the chosen tests: ``Cls::test`` itself, or an instance of a
    device-type test (class name + device, test name + parameters and device)."""
    out = []
    for node in collected:
        cls, test = node.split("::", 1)
        if any(cls.startswith(c) and (test == t or test.startswith(t + "_"))
               for c, t in (n.split("::") for n in chosen)):
            out.append(node)
    return out


def _run(args: argparse.Namespace, scratch: pathlib.Path, source: str) -> int:
    name = args.test_file.name
    (scratch / name).write_text(f"import {PATCH_MODULE}  # noqa: F401  (tools/torch_suite.py)\n"
                                + source)
    (scratch / f"{PATCH_MODULE}.py").write_text(PATCH)
    report = scratch / "report.xml"
    env = dict(os.environ, FASTLOAD_TORCH_SUITE_AGAINST=args.against)
    chosen, excluded = applicable(source)
    collected = _collected(scratch, name, env)
    if not collected:
        print(f"pytest collected no test from {args.test_file} (is expecttest installed?)",
              file=sys.stderr)
        return 2
    chosen = _select(collected, chosen)
    if args.list:
        print("\n".join(chosen))
        print(f"\n{len(chosen)} selected of {len(collected)} collected; excluded:")
        for node, why in excluded.items():
            print(f"  {node}: {why}")
        return 0
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
           f"--junitxml={report}", "--rootdir", str(scratch),
           *(["-k", args.keyword] if args.keyword else []),
           *[f"{name}::{node}" for node in chosen]]
    print(f"running {len(chosen)} tests of {args.test_file} against {args.against}'s "
          f"DataLoader in {scratch}", flush=True)
    try:
        subprocess.run(cmd, cwd=scratch, env=env, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"the run took over {args.timeout:.0f} s and was stopped", file=sys.stderr)
        return 2
    if not report.exists():
        print("pytest wrote no report (see its output above)", file=sys.stderr)
        return 2
    passed, failed, skipped = [], [], []
    for case in ET.parse(report).iter("testcase"):
        node = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        if case.find("skipped") is not None:
            reason = case.find("skipped").get("message", "")  # type: ignore[union-attr]
            skipped.append(f"{node}: {reason}")
        elif case.find("failure") is not None or case.find("error") is not None:
            failed.append(node)
        else:
            passed.append(node)
    applicable_n = len(passed) + len(failed)
    ran = len(passed) + len(failed) + len(skipped)
    print(f"\n{len(chosen)} tests build a DataLoader ({len(excluded)} more excluded, below); "
          f"{ran} run{' (-k)' if args.keyword else ''}, {len(skipped)} of them skipped here by "
          f"torch's own decorators; applicable {applicable_n}: {len(passed)} passed, "
          f"{len(failed)} failed (against {args.against})")
    for node in failed:
        print(f"  FAILED {node}")
    for line in skipped:
        print(f"  skipped {line}")
    for node, why in excluded.items():
        print(f"  excluded {node}: {why}")
    return 0 if not failed and applicable_n else 1


if __name__ == "__main__":
    sys.exit(main())
