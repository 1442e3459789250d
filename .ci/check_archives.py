"""What the archives must (not) hold; the expected sources are globbed from this tree."""
import glob, sys, tarfile, zipfile

sdist, wheel = sys.argv[1], sys.argv[2]
with tarfile.open(sdist) as t:
    s_names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
with zipfile.ZipFile(wheel) as z:
    w_names = set(z.namelist())
need_s = set(glob.glob("csrc/*.[ch]") + glob.glob("csrc/tests/*.[ch]") + ["csrc/tests/Makefile"])
py_files = set(glob.glob("fastload/**/*.py", recursive=True))  # subpackages too
need_s |= py_files
for pat in ("fastload/*.pyx", "fastload/*.pxd", "fastload/*.pyi",
            "tests/*.py", "benchmarks/*.py", "docs/*.md", "examples/*.py"):
    need_s |= set(glob.glob(pat))
need_s |= {"fastload/py.typed", "README.md", "LICENSE", "pyproject.toml", "setup.py",
           "MANIFEST.in", "CHANGELOG.md", "CONTRIBUTING.md"}
bad = sorted(need_s - s_names)
bad += [f"sdist must not hold {n}" for n in sorted(s_names)
        if n.endswith((".so", ".o")) or (n.startswith("fastload/") and n.endswith(".c"))]
need_w = {"fastload/py.typed", "fastload/_ring.pyi", "fastload/_pack.pyi"} | py_files
bad += [f"wheel lacks {n}" for n in sorted(need_w - w_names)]
for mod in ("_ring", "_pack"):
    if not any(n.startswith(f"fastload/{mod}.") and n.endswith(".so") for n in w_names):
        bad.append(f"wheel lacks the compiled fastload/{mod}*.so")
bad += [f"wheel must not hold {n}" for n in sorted(w_names) if n.endswith((".pyx", ".pxd", ".c"))]
if bad:
    sys.exit("packaging check failed:\n  " + "\n  ".join(bad))
print(f"sdist: {len(s_names)} files, wheel: {len(w_names)} files: contents as expected")
