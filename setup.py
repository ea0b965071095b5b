"""Build the C core, fxguard._core (raw CPython C API; no libtorch, no pybind11)."""
import os
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

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

    def get_outputs(self, include_bytecode=True):
        extra = [] if self.editable_mode else [
            os.path.join(self.build_lib, os.path.basename(STARTUP_PTH))]
        return super().get_outputs(include_bytecode) + extra

# CI builds with FXGUARD_WERROR=1 so that any warning fails the build; users
# on newer compilers still get a working install without it.
flags = ["-std=c11", "-Wall", "-Wextra"]
if os.environ.get("FXGUARD_WERROR") == "1":
    flags.append("-Werror")

setup(
    cmdclass={"build_py": build_py_with_startup_hook},
    ext_modules=[
        Extension(
            "fxguard._core",
            sources=sorted(glob("src/fxguard/_core/*.c")),
            depends=glob("src/fxguard/_core/*.h"),
            extra_compile_args=flags,
        )
    ],
)
