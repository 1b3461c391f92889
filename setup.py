"""The one compiled part, ``zephon_torch._native`` (see zephon_torch/_native.c); everything else
is in pyproject.toml. Optional: where it cannot be built, numpy runs its loops instead
(zephon_torch/_compiled.py) and the package works the same, slower."""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "zephon_torch._native",
            ["zephon_torch/_native.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=True,
        )
    ]
)
