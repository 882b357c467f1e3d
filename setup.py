"""Build of the compiled parts (issue "native"); everything else is in pyproject.toml.

``pidgate.protocol._speedups`` (the per-request path), ``pidgate.quota._bloomspeed`` (the
layered Bloom filter's hash, scan and writes for a new PID) and
``pidgate.pipeline.reading._eventscan`` (the activity job's event-line reader) are built from
their .pyx by Cython (a build requirement, so pip fetches it) and the machine's C compiler.
All three are optional: where they cannot be compiled (no compiler, no Python headers) the
build prints one warning and goes on, and pidgate runs its pure-Python path (``pidgate
serve`` says so in one log line, ``pure_python_data_path``; the Bloom filter computes in
Python; the event reader falls back to pyarrow's JSON parser; same results).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """``build_ext`` for which a failed compile is a warning, not an error. setuptools' own
    ``Extension(optional=True)`` lets some failures through (a compiler that exits non-zero is
    reported as a ``CalledProcessError`` by recent setuptools, which it does not catch)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # any build failure leaves the pure path
            self._warn(error)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            self._warn(error)

    @staticmethod
    def _warn(error: BaseException) -> None:
        print(
            f"WARNING: pidgate's compiled data path was not built ({error}); pidgate will run "
            "its pure-Python path. Install a C compiler and the Python headers (Debian: "
            "apt-get install gcc python3-dev) and reinstall for the compiled one.",
            file=sys.stderr,
        )


try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython (pip always has it: build-system.requires)
    extensions: list[Extension] = []
else:
    extensions = cythonize(
        [
            Extension("pidgate.protocol._speedups", ["src/pidgate/protocol/_speedups.pyx"]),
            Extension("pidgate.quota._bloomspeed", ["src/pidgate/quota/_bloomspeed.pyx"]),
            Extension("pidgate.proxy.serving._express", ["src/pidgate/proxy/serving/_express.pyx"]),
            Extension(
                "pidgate.pipeline.reading._eventscan",
                ["src/pidgate/pipeline/reading/_eventscan.pyx"],
            ),
        ],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
