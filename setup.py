"""The one compiled module: ingest's fast path (ingest/_core.c). Everything else about
the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ingest._core", ["ingest/_core.c"],
                             extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"])])
