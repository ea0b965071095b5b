"""README's "Use it", end to end: a wheel built from this tree, installed in a
fresh virtual environment, and examples/trace_vs_compiled_call.py run each way.
Stock torch fails it (where torch races); every way of turning fxguard on
passes it: import, ``fxguard run``, FXGUARD=1 (the .pth, also in torchrun
workers and subprocesses), ``pytest --fxguard``.

The venv sees this interpreter's torch through a path file rather than
--system-site-packages, so it works from inside another venv (CI's)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from guarded import torch_races

pytestmark = pytest.mark.slow  # minutes: `pytest --full` (CI) runs it

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RACE = os.path.join(ROOT, "examples", "trace_vs_compiled_call.py")
RACED = 1 if torch_races() else 0  # stock torch's exit status on trace_vs_compiled_call.py
# A process that ran that race with fxguard installed used to abort at interpreter exit
# now and then ("terminate called without an active exception": torch's thread-locals of a
# just-ended thread destroyed during finalization); install() now waits for them at exit,
# and any abort fails here.


def assert_ran_fixed(proc):
    assert "compiled call ran" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with fxguard installed from a wheel built from this tree."""
    tmp = tmp_path_factory.mktemp("use_it")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), ROOT]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # Offline with this environment's setuptools where it can build wheels (the H200 has
    # no network); else pip fetches a build environment (CI's torch 2.11 venv lacks `wheel`).
    if subprocess.run(build + ["--no-build-isolation"], env=env, timeout=600).returncode:
        subprocess.run(build, check=True, env=env, timeout=600)
    [wheel] = (tmp / "dist").glob("fxguard-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    python = str(tmp / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                    "--no-index", "--ignore-installed", str(wheel)], check=True, timeout=300,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    torch_site = os.path.dirname(os.path.dirname(torch.__file__))
    with open(os.path.join(site, "_parent_torch.pth"), "w") as f:
        f.write(torch_site + "\n")  # torch, pytest; fxguard's files there come after the venv's
    assert os.path.exists(os.path.join(site, "fxguard-startup.pth"))
    work = tmp / "work"
    work.mkdir()
    shutil.copy(RACE, work / "trace_vs_compiled_call.py")
    return {"python": python, "bin": str(tmp / "venv" / "bin"), "cwd": str(work)}


def run(venv, *args, **env):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("FXGUARD") and k != "PYTHONPATH"}
    return subprocess.run(args, cwd=venv["cwd"], env={**environ, **env}, capture_output=True,
                          text=True, timeout=600)


def test_the_venv_uses_the_wheel(venv):
    proc = run(venv, venv["python"], "-c", "import fxguard; print(fxguard.__file__)")
    assert proc.stdout.startswith(os.path.dirname(venv["bin"])), proc.stdout + proc.stderr


def test_stock_torch(venv):
    proc = run(venv, venv["python"], "trace_vs_compiled_call.py")
    assert proc.returncode == RACED, proc.stdout + proc.stderr
    assert "fxguard installed: False" in proc.stdout


def test_import_and_install(venv):
    proc = run(venv, venv["python"], "-c", "import fxguard, runpy; fxguard.install(); "
               "runpy.run_path('trace_vs_compiled_call.py', run_name='__main__')")
    assert_ran_fixed(proc)
    assert "fxguard installed: True; compiled call ran" in proc.stdout


def test_fxguard_run_console_script(venv):
    proc = run(venv, os.path.join(venv["bin"], "fxguard"), "run", "trace_vs_compiled_call.py")
    assert_ran_fixed(proc)
    assert "fxguard installed: True; compiled call ran" in proc.stdout


def test_fxguard_environment_variable(venv):
    proc = run(venv, venv["python"], "trace_vs_compiled_call.py", FXGUARD="1")
    assert_ran_fixed(proc)
    assert "fxguard installed: True; compiled call ran" in proc.stdout


def test_subprocesses_of_fxguard_run_get_it(venv):
    with open(os.path.join(venv["cwd"], "parent.py"), "w") as f:
        f.write("import subprocess, sys\n"
                "sys.exit(subprocess.run([sys.executable, 'trace_vs_compiled_call.py']).returncode)\n")
    proc = run(venv, venv["python"], "-m", "fxguard", "run", "parent.py")
    assert_ran_fixed(proc)
    assert "fxguard installed: True; compiled call ran" in proc.stdout


def test_pytest_flag(venv):
    args = (venv["python"], "-m", "pytest", "-p", "no:cacheprovider", "trace_vs_compiled_call.py")
    stock = run(venv, *args)
    assert stock.returncode == RACED, stock.stdout + stock.stderr
    guarded = run(venv, *args, "--fxguard")
    assert guarded.returncode == 0, guarded.stdout + guarded.stderr
    assert "fxguard 0.1.0: " in guarded.stdout and "fxguard 0.1.0: " not in stock.stdout


def test_torchrun_workers(venv):
    """README's torchrun example: FXGUARD=1 reaches every worker (no process group)."""
    proc = run(venv, venv["python"], "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "trace_vs_compiled_call.py", FXGUARD="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"trace-vs-compiled-call rank {rank}: fxguard installed: True; compiled call ran" in proc.stdout
