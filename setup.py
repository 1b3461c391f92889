"""The one compiled part, ``zephon_torch._copy`` (see zephon_torch/_copy.c); everything else is
in pyproject.toml. Optional: where it cannot be built, the package copies with numpy instead
(zephon_torch/ops/_copy.py) and works the same, slower."""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "zephon_torch._copy",
            ["zephon_torch/_copy.c"],
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
            optional=True,
        )
    ]
)
