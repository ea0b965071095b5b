"""FXGUARD=1 / FXGUARD_OPTIONS: the start-up hook and its policy, and the
"fxguard" logger.  The .pth itself is exercised from an installed wheel in
test_use_it.py; here the line it runs is run by hand, in a fresh interpreter."""
import logging
import os
import subprocess
import sys

import pytest
import torch

import fxguard
from fxguard import startup
from fxguard.machinery import originals

PTH = os.path.join(os.path.dirname(fxguard.__file__), os.pardir, "fxguard-startup.pth")


def python_with_hook(body: str, **env: str) -> subprocess.CompletedProcess:
    """A fresh interpreter that runs the .pth's line first, as site would."""
    with open(PTH) as f:
        pth_line = f.read().strip()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FXGUARD")}
    return subprocess.run([sys.executable, "-c", pth_line + "\n" + body], env={**environ, **env},
                          capture_output=True, text=True, timeout=300)


def test_unset_costs_an_environment_lookup_and_nothing_else():
    proc = python_with_hook("import sys; print([type(f).__name__ for f in sys.meta_path], "
                            "'_fxguard_startup' in sys.modules, 'fxguard' in sys.modules)")
    assert "_AfterImportFinder" not in proc.stdout, proc.stderr
    assert proc.stdout.split()[-2:] == ["False", "False"], proc.stderr
    proc = python_with_hook("import sys; print('_fxguard_startup' in sys.modules)", FXGUARD="0")
    assert proc.stdout.split() == ["False"]


def test_set_waits_for_torch_then_installs_and_leaves_no_trace():
    proc = python_with_hook("""
import sys
assert 'fxguard' not in sys.modules, 'fxguard imported before torch'
hooks = [f for f in sys.meta_path if type(f).__name__ == '_AfterImportFinder']
assert len(hooks) == 1
import torch, fxguard
assert fxguard.is_installed()
assert not any(type(f).__name__ == '_AfterImportFinder' for f in sys.meta_path)
assert type(torch.__loader__).__name__ == 'SourceFileLoader', torch.__loader__
assert torch.__spec__.loader is torch.__loader__
print(fxguard.status()['options'])
""", FXGUARD="1", FXGUARD_OPTIONS="block_mask_lock=0, eager_backward=off")
    assert proc.returncode == 0, proc.stderr
    assert "'block_mask_lock': False" in proc.stdout and "'eager_backward': False" in proc.stdout


def test_bad_values_warn_and_the_program_runs_unpatched():
    proc = python_with_hook("import torch, fxguard; print(fxguard.is_installed())",
                            FXGUARD="1", FXGUARD_OPTIONS="turbo=1")
    assert proc.returncode == 0 and proc.stdout.split() == ["False"]
    assert "FXGUARD_OPTIONS: unknown option 'turbo'" in proc.stderr
    assert "fxguard not installed, torch runs unpatched" in proc.stderr
    proc = python_with_hook("import sys; print('_fxguard_startup' in sys.modules)",
                            FXGUARD="maybe")
    assert proc.returncode == 0
    assert "FXGUARD='maybe': expected 1 (on) or 0 (off); fxguard not activated" in proc.stderr


@pytest.mark.parametrize("text, options", [
    ("", {}), ("block_mask_lock=0", {"block_mask_lock": False}),
    (" eager_backward = TRUE ,config_window_lock=no,", {"eager_backward": True,
                                                        "config_window_lock": False}),
])
def test_parse_options(text, options):
    assert startup.parse_options(text) == options


@pytest.mark.parametrize("text, message", [
    ("turbo=1", "unknown option 'turbo'; known: block_mask_lock"),
    ("block_mask_lock", "expected block_mask_lock=1 or block_mask_lock=0"),
    ("block_mask_lock=maybe", "expected block_mask_lock=1"),
])
def test_parse_options_names_the_bad_entry(text, message):
    with pytest.raises(ValueError, match=message):
        startup.parse_options(text)


def test_unknown_torch_from_env_warns_and_runs_unpatched(monkeypatch, caplog):
    monkeypatch.setitem(vars(torch.fx._symbolic_trace), "_is_fx_tracing_flag", 0)
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        assert startup.install_from_env({"FXGUARD": "1"}) is False
    assert not fxguard.is_installed() and originals.applied() == ()
    [record] = caplog.records
    assert record.levelname == "WARNING" and "does not know this torch" in record.message
    with pytest.raises(fxguard.UnsupportedTorchError):  # a direct install() still raises
        fxguard.install()


def test_install_logs_what_it_patched(caplog):
    with caplog.at_level(logging.INFO, logger="fxguard"):
        s = fxguard.install()
    [record] = [r for r in caplog.records if r.levelname == "INFO"]
    assert f"installed on torch {torch.__version__} ({s['mode']})" in record.message
    for row in s["patch_points"]:
        # "what where": two rows may change one function (get_obj), one of them not needed
        assert (f"{row['what']} {row['where']}" in record.message) is row["patched"], row


def test_inductor_compile_workers_are_left_alone(monkeypatch):
    worker = os.path.join(os.path.dirname(torch.__file__), "_inductor", "compile_worker",
                          "__main__.py")
    monkeypatch.setattr(sys, "argv", [worker, "--workers=2"])
    assert startup.install_from_env({"FXGUARD": "1"}) is False
    assert not fxguard.is_installed()
