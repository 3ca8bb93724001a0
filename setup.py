"""The one thing pyproject.toml cannot say without an experimental table: the C the package builds.

That is the zygote's fork loop (`sandbox/guest/forkloop.c` says why it is C): a plain C library
that the zygote loads through ctypes, built as an extension so that every install and wheel
builds it. Optional: without a C compiler the package installs all the same and the zygote
forks from its Python loop (the process backend logs that it does).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("sandbox.guest.libforkloop", sources=["sandbox/guest/forkloop.c"], optional=True)
    ]
)
