"""Extension declarations only; all metadata lives in pyproject.toml.

The compiled core is required: a missing compiler is an error that says what to install
(fastload has no slow pure-Python engine to fall back to silently).
Environment:
  FASTLOAD_DEBUG_BUILD=1  -O0 -g, FL_DEBUG asserts, Cython bounds checks (for sanitizer runs)
  FASTLOAD_PORTABLE=1     compile the portable wait path (no futex) even on Linux
  FASTLOAD_SANITIZE=1     build with -fsanitize=address,undefined (run with LD_PRELOAD=libasan)
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CYTHON_RANGE = ((3, 0), (4, 0))

try:
    import Cython
    from Cython.Build import cythonize
except ImportError:  # pragma: no cover - build-system requires Cython
    sys.exit("fastload: building needs Cython>=3.0,<4 (pip install 'Cython>=3,<4')")

_cy = tuple(int(p) for p in Cython.__version__.split(".")[:2] if p.isdigit())
if not (CYTHON_RANGE[0] <= _cy < CYTHON_RANGE[1]):
    sys.exit(f"fastload: Cython {Cython.__version__} found, need >=3.0,<4")

debug = os.environ.get("FASTLOAD_DEBUG_BUILD") == "1"
portable = os.environ.get("FASTLOAD_PORTABLE") == "1"
sanitize = os.environ.get("FASTLOAD_SANITIZE") == "1"

compile_args = ["-std=c11", "-Wall", "-Wno-unused-function"]
link_args: list = []
macros = [("_GNU_SOURCE", None)]
if debug:
    compile_args += ["-O0", "-g", "-UNDEBUG"]
    macros.append(("FL_DEBUG", "1"))
if portable:
    macros.append(("FL_NO_FUTEX", "1"))
if sanitize:
    compile_args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    link_args += ["-fsanitize=address,undefined"]

# What `python -m fastload info` reports as the build (fastload._ring.BUILD_FLAGS).
_build_words = [w for w, on in (("FASTLOAD_DEBUG_BUILD=1", debug),
                                ("FASTLOAD_PORTABLE=1", portable),
                                ("FASTLOAD_SANITIZE=1", sanitize)) if on] or ["release"]
_build_flags = " ".join(_build_words + compile_args
                        + ([f"CFLAGS={os.environ['CFLAGS']}"] if os.environ.get("CFLAGS") else []))
macros.append(("FL_BUILD_FLAGS", '"' + _build_flags.replace("\\", "/").replace('"', "'") + '"'))

C_SOURCES = ["csrc/fl_ring.c", "csrc/fl_bell.c", "csrc/fl_wait.c", "csrc/fl_pack.c", "csrc/fl_status.c"]


def ext(name: str) -> Extension:
    return Extension(
        f"fastload.{name}",
        sources=[f"fastload/{name}.pyx", *C_SOURCES],
        include_dirs=["csrc"],
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )


class BuildExt(build_ext):
    """Turns compiler failures into one actionable message."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # setuptools raises several unrelated types here
            raise SystemExit(self._help(e)) from e

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            raise SystemExit(self._help(e)) from e

    @staticmethod
    def _help(e: BaseException) -> str:
        return (
            f"fastload: building the compiled core failed ({type(e).__name__}: {e}).\n"
            "fastload needs a C11 compiler and the Python headers, e.g.\n"
            "  Debian/Ubuntu: apt-get install build-essential python3-dev\n"
            "  Fedora/RHEL:   dnf install gcc python3-devel\n"
            "  macOS:         xcode-select --install"
        )


directives = {
    "language_level": "3",
    "boundscheck": debug,
    "wraparound": False,
    "initializedcheck": debug,
    "cdivision": True,
    "embedsignature": True,
    "linetrace": debug,
}

setup(
    ext_modules=cythonize(
        [ext("_ring"), ext("_pack")],
        compiler_directives=directives,
        include_path=["fastload"],
    ),
    cmdclass={"build_ext": BuildExt},
)
