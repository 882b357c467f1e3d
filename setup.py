"""Build of the compiled per-request path (issue "native"); everything else is in pyproject.toml.

``pidgate.protocol._speedups`` is built from its .pyx by Cython (a build requirement, so pip
fetches it) and the machine's C compiler. It is optional: without a compiler the build warns and
goes on, and pidgate runs its pure-Python path (``pidgate serve`` says so in one log line).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython (pip always has it: build-system.requires)
    extensions = []
else:
    extensions = cythonize(
        [
            Extension(
                "pidgate.protocol._speedups",
                ["src/pidgate/protocol/_speedups.pyx"],
                optional=True,  # no compiler: a warning, and the pure path
            )
        ],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=extensions)
