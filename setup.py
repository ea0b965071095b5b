"""Build the C core, fxguard._core (raw CPython C API; no libtorch, no pybind11)."""
import os
from glob import glob

from setuptools import Extension, setup

# CI builds with FXGUARD_WERROR=1 so that any warning fails the build; users
# on newer compilers still get a working install without it.
flags = ["-std=c11", "-Wall", "-Wextra"]
if os.environ.get("FXGUARD_WERROR") == "1":
    flags.append("-Werror")

setup(
    ext_modules=[
        Extension(
            "fxguard._core",
            sources=sorted(glob("src/fxguard/_core/*.c")),
            depends=glob("src/fxguard/_core/*.h"),
            extra_compile_args=flags,
        )
    ],
)
