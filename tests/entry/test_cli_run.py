"""``fxguard run`` against plain ``python``: same __main__, argv, sys.path[0],
exit status and traceback.  Torch-free targets (fast); the torch side is in
test_use_it.py."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

SHOW = """\
import os, pickle, sys
class Local: pass
main = sys.modules["__main__"]
spec = __spec__ and (__spec__.name, __spec__.origin, type(__spec__.loader).__name__)
print("name", __name__, "file", __file__, "spec", spec, "package", __package__)
print("cached", __cached__, "builtins", type(__builtins__).__name__)
print("loader", type(__loader__).__name__, "main is this module", main.__dict__ is globals())
print("argv", sys.argv)
print("path0", sys.path[0])
print("pickles a __main__ class", type(pickle.loads(pickle.dumps(Local()))).__name__)
print("torch imported", "torch" in sys.modules)
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
"""


def run(*args, cwd, env=None, python=sys.executable):
    return subprocess.run([python, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def both(tmp_path, target_args, **kw):
    """(plain python, fxguard run) on the same target."""
    return (run(*target_args, cwd=tmp_path, **kw),
            run("-m", "fxguard", "run", *target_args, cwd=tmp_path, **kw))


@pytest.fixture
def script(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "show.py"
    path.write_text(SHOW)
    return "sub/show.py"


def test_script_sees_what_python_gives_it(tmp_path, script):
    plain, guarded = both(tmp_path, [script, "a", "--flag", "3"])
    assert plain.returncode == guarded.returncode == 3, guarded.stderr
    assert guarded.stdout == plain.stdout
    assert "path0 " + str(tmp_path / "sub") in plain.stdout
    assert "torch imported False" in guarded.stdout  # run imports torch only when the target does


def test_module_sees_what_python_gives_it(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "show.py").write_text(SHOW)
    (pkg / "__main__.py").write_text(SHOW)
    for target in (["-m", "pkg.show", "x", "0"], ["-m", "pkg", "-v", "5"]):
        plain, guarded = both(tmp_path, target)
        assert guarded.returncode == plain.returncode, guarded.stderr
        assert guarded.stdout == plain.stdout
        assert plain.stdout.count(str(tmp_path)) >= 2


def test_directory_with_main_runs_like_python(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(SHOW)
    plain, guarded = both(tmp_path, ["app", "7"])
    assert plain.returncode == guarded.returncode == 7
    assert guarded.stdout == plain.stdout


def test_traceback_and_status_are_pythons(tmp_path):
    (tmp_path / "fails.py").write_text(textwrap.dedent("""\
        def inner():
            raise ValueError("boom")
        try:
            inner()
        except ValueError as e:
            raise KeyError("outer") from e
    """))
    plain, guarded = both(tmp_path, ["fails.py"])
    assert plain.returncode == guarded.returncode == 1
    assert guarded.stderr == plain.stderr
    assert "fxguard" not in guarded.stderr and "runpy" not in guarded.stderr


def test_module_traceback_is_pythons(tmp_path):
    (tmp_path / "failmod.py").write_text("def f():\n    1 / 0\nf()\n")
    plain, guarded = both(tmp_path, ["-m", "failmod"])
    assert plain.returncode == guarded.returncode == 1
    assert guarded.stderr == plain.stderr


def test_keyboard_interrupt_dies_by_sigint_like_python(tmp_path):
    (tmp_path / "interrupted.py").write_text("raise KeyboardInterrupt\n")
    plain, guarded = both(tmp_path, ["interrupted.py"])
    assert plain.returncode == guarded.returncode == -signal.SIGINT
    assert guarded.stderr == plain.stderr


def test_missing_targets_fail_like_python(tmp_path):
    plain, guarded = both(tmp_path, ["nowhere.py"])
    assert plain.returncode == guarded.returncode == 2
    assert guarded.stderr.split(": ", 1)[1] == plain.stderr.split(": ", 1)[1]
    plain, guarded = both(tmp_path, ["-m", "no_such_module_here"])
    assert plain.returncode == guarded.returncode == 1
    assert guarded.stderr.split(": ", 1)[1] == plain.stderr.split(": ", 1)[1]


def test_bad_options_are_refused_before_the_target_runs(tmp_path, script):
    proc = run("-m", "fxguard", "run", "--options", "turbo=1", script, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "unknown option 'turbo'" in proc.stderr and "block_mask_lock" in proc.stderr
    proc = run("-m", "fxguard", "run", cwd=tmp_path)
    assert proc.returncode == 2 and "give a script or -m module" in proc.stderr


def test_run_sets_the_environment_its_children_inherit(tmp_path):
    (tmp_path / "env.py").write_text(
        "import os; print(os.environ['FXGUARD'], os.environ['FXGUARD_OPTIONS'])\n")
    proc = run("-m", "fxguard", "run", "--options", "eager_backward=0", "env.py", cwd=tmp_path,
               env={**os.environ, "FXGUARD": "0"})
    assert proc.stdout.split() == ["1", "eager_backward=0"], proc.stderr


def test_bad_options_from_the_environment_are_refused_before_the_target_runs(tmp_path):
    """Whoever typed ``fxguard run`` asked for fxguard: a bad FXGUARD_OPTIONS exits 2
    naming FXGUARD_OPTIONS (not --options, which was never typed), as a bad --options
    does, and the target never runs stock.  (FXGUARD=1 alone only warns: test_startup_hook.)"""
    (tmp_path / "uses_torch.py").write_text(
        "import torch, fxguard\nprint('installed', fxguard.is_installed())\n")
    proc = run("-m", "fxguard", "run", "uses_torch.py", cwd=tmp_path,
               env={**os.environ, "FXGUARD_OPTIONS": "bogus=1"})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "error: FXGUARD_OPTIONS: unknown option 'bogus'" in proc.stderr
    assert "error: --options" not in proc.stderr
    proc = run("-m", "fxguard", "run", "uses_torch.py", cwd=tmp_path,
               env={**os.environ, "FXGUARD_OPTIONS": "eager_backward=maybe"})
    assert proc.returncode == 2 and "FXGUARD_OPTIONS: 'eager_backward=maybe'" in proc.stderr
    proc = run("-m", "fxguard", "run", "uses_torch.py", cwd=tmp_path,
               env={**os.environ, "FXGUARD_OPTIONS": "eager_backward=0"})
    assert proc.returncode == 0 and proc.stdout.split() == ["installed", "True"], proc.stderr


def test_options_typed_on_the_command_line_win_over_the_environment(tmp_path):
    (tmp_path / "env.py").write_text("import os; print(os.environ['FXGUARD_OPTIONS'])\n")
    proc = run("-m", "fxguard", "run", "--options", "eager_backward=0", "env.py", cwd=tmp_path,
               env={**os.environ, "FXGUARD_OPTIONS": "bogus=1"})
    assert proc.returncode == 0 and proc.stdout.split() == ["eager_backward=0"], proc.stderr
    proc = run("-m", "fxguard", "run", "--options", "bogus=1", "env.py", cwd=tmp_path,
               env={**os.environ, "FXGUARD_OPTIONS": "eager_backward=0"})
    assert proc.returncode == 2 and "--options: unknown option 'bogus'" in proc.stderr


def test_help_names_every_command(tmp_path):
    proc = run("-m", "fxguard", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("run", "doctor", "status"):
        assert f"\n    {command} " in proc.stdout, proc.stdout
    proc = run("-m", "fxguard", "bogus", cwd=tmp_path)
    assert proc.returncode == 2 and "'run'" in proc.stderr and "'status'" in proc.stderr
    proc = run("-m", "fxguard", "run", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "--options" in proc.stdout


@pytest.mark.slow
def test_status_from_a_shell_says_what_install_would_do(tmp_path):
    """A new process has installed nothing: status prints install()'s plan for
    the installed torch, every row with its outcome, and says it changed nothing."""
    import json
    proc = run("-m", "fxguard", "status", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["preview"] is True and "nothing was changed" in info["note"]
    assert info["torch"] and info["layout"] in ("module-global", "upstream-thread-local")
    assert info["mode"] in ("patched", "upstream-thread-local")
    assert info["patch_points"] and all(r["outcome"] for r in info["patch_points"])
    assert all(r["reason"] for r in info["patch_points"])  # shows the reason: the text users read
    assert "torch._dynamo" in info["waiting"]  # the RNG row, and compile once where the GIL is on
    proc = run("-m", "fxguard", "status", "--json", "--options", "block_mask_lock=0", cwd=tmp_path)
    rows = {r["what"]: r["outcome"] for r in json.loads(proc.stdout)["patch_points"]}
    assert rows["block-mask lock"] == "option off"
    proc = run("-m", "fxguard", "status", "--options", "turbo=1", cwd=tmp_path)
    assert proc.returncode == 2 and "--options: unknown option 'turbo'" in proc.stderr


def test_status_summary_and_version(tmp_path):
    """By default status prints a summary a person reads (one line per kind of
    outcome), nothing on stderr; --verbose lists every row; --version says who."""
    proc = run("-m", "fxguard", "status", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 24 and "nothing was changed" in proc.stdout
    assert any(line.startswith("install() would plan ") and " patched" in line for line in lines)
    # a fresh process has not imported the compiler: its rows wait, and status says for what
    # and why doctor (whose probes import the compiler first) counts them as patched
    assert any("applied when their module is imported: torch._dynamo" in line for line in lines)
    assert any("fxguard doctor counts these as patched" in line for line in lines)
    verbose = run("-m", "fxguard", "status", "--verbose", cwd=tmp_path).stdout
    assert "torch.fx._symbolic_trace" in verbose and len(verbose.splitlines()) > len(lines)
    import fxguard
    for argv in (("-m", "fxguard", "--version"),):
        proc = run(*argv, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout.strip() == f"fxguard {fxguard.__version__}"


@pytest.mark.slow
def test_status_groups_the_rows_by_the_option_that_turns_them_off(tmp_path):
    """Every row that is "option off" by default is concurrent_compiles' (the one option
    off by default), and status says so on that option's line, with how to turn it on."""
    import json

    import fxguard
    info = json.loads(run("-m", "fxguard", "status", "--json", cwd=tmp_path).stdout)
    off = sum(p["outcome"] == "option off" for p in info["patch_points"])
    text = run("-m", "fxguard", "status", cwd=tmp_path).stdout
    by_option = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert set(by_option) >= {"always", "block_mask_lock", "concurrent_compiles"}, text
    assert f"{off} option off: install(concurrent_compiles=True)" in by_option["concurrent_compiles"]
    others = [line for name, line in by_option.items() if name != "concurrent_compiles"]
    assert not any("option off" in line for line in others), text
    counted = sum(int(n) for line in by_option.values() for n in
                  __import__("re").findall(r"(\d+) (?:patched|waiting|option off|not )", line))
    assert counted == len(info["patch_points"]), text  # every row in exactly one group
    assert fxguard.__version__ in text
