"""The pytest plugin: ``--fxguard`` installs for the session and says so in the
header; without it the plugin does nothing (this suite's own runs)."""
import os
import subprocess
import sys

import pytest

CHECK = """\
import sys
import fxguard

def test_state():
    print("STATE", fxguard.is_installed(), "torch" in sys.modules)
"""


def pytest_run(tmp_path, *args):
    (tmp_path / "test_state.py").write_text(CHECK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXGUARD")}
    return subprocess.run([sys.executable, "-m", "pytest", *load_plugin(),
                           "-p", "no:cacheprovider", "-s", "test_state.py", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)


def load_plugin() -> list[str]:
    """By module name, unless fxguard's metadata on sys.path has the pytest11
    entry point (an install, or the egg-info a build leaves in src/)."""
    from importlib.metadata import entry_points
    if any(ep.value == "fxguard.pytest_plugin" for ep in entry_points(group="pytest11")):
        return []
    return ["-p", "fxguard.pytest_plugin"]


@pytest.mark.slow
def test_flag_installs_for_the_session_and_names_the_mode(tmp_path):
    proc = pytest_run(tmp_path, "--fxguard", "--fxguard-options", "eager_backward=0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STATE True True" in proc.stdout
    import torch
    mode = "upstream-thread-local" if hasattr(torch.fx._symbolic_trace, "_get_is_fx_tracing") \
        else "patched"
    assert f"fxguard 0.1.0: {mode} (torch {torch.__version__}" in proc.stdout


def test_without_the_flag_nothing_changes(tmp_path):
    proc = pytest_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STATE False False" in proc.stdout and "fxguard 0.1.0" not in proc.stdout


def test_bad_options_are_a_usage_error(tmp_path):
    proc = pytest_run(tmp_path, "--fxguard", "--fxguard-options", "turbo=1")
    assert proc.returncode == 4  # pytest's usage-error status
    assert "--fxguard-options: unknown option 'turbo'" in proc.stderr
