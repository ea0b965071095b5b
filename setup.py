"""Build the C core, fxguard._core (raw CPython C API; no libtorch, no pybind11)."""
import os
import sys
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.install_lib import install_lib

STARTUP_PTH = "src/fxguard-startup.pth"


class build_py_with_startup_hook(build_py):
    """Put fxguard-startup.pth at the top of the build, so that wheels and
    ``pip install .`` place it in site-packages, where Python runs it at start-up
    (it reads FXGUARD; see src/_fxguard_startup.py).  Editable installs map
    src/ onto sys.path and leave it out: there, use ``fxguard run``."""

    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(STARTUP_PTH, os.path.join(self.build_lib, os.path.basename(STARTUP_PTH)))

    def byte_compile(self, files):
        if not sys.dont_write_bytecode:  # see install_lib_quiet
            super().byte_compile(files)

    def get_outputs(self, include_bytecode=True):
        extra = [] if self.editable_mode else [
            os.path.join(self.build_lib, os.path.basename(STARTUP_PTH))]
        return super().get_outputs(include_bytecode) + extra

class install_lib_quiet(install_lib):
    """pip builds with bytecode writing off, and distutils then warns once per
    command that it skips byte-compiling; pip compiles at install time anyway."""

    def byte_compile(self, files):
        if not sys.dont_write_bytecode:
            super().byte_compile(files)


# CI builds with FXGUARD_WERROR=1 so that any warning fails the build; users
# on newer compilers still get a working install without it.
flags = ["-std=c11", "-Wall", "-Wextra"]
if os.environ.get("FXGUARD_WERROR") == "1":
    flags.append("-Werror")

setup(
    cmdclass={"build_py": build_py_with_startup_hook, "install_lib": install_lib_quiet},
    ext_modules=[
        Extension(
            "fxguard._core",
            sources=sorted(glob("src/fxguard/_core/*.c")),
            depends=glob("src/fxguard/_core/*.h"),
            extra_compile_args=flags,
        )
    ],
)
