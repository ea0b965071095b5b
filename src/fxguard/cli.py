"""The ``fxguard`` command (also ``python -m fxguard``): run | doctor | status.

``fxguard status`` prints what install() would do on the installed torch
(``fxguard.preview()``), computed in this process without changing anything.

``fxguard run [--options LIST] script.py args...`` and ``fxguard run [--options
LIST] -m module args...`` run the target as ``python script.py`` / ``python -m
module`` would (``__main__``, ``sys.argv``, ``sys.path[0]``, exit status,
tracebacks), with fxguard installed right after the target imports torch, and
FXGUARD=1 set so that its subprocesses (torchrun workers, spawned DataLoader
workers) get fxguard too.  torch is not imported before the target does: a
script may still set CUDA_VISIBLE_DEVICES or TORCH_LOGS before its own import.
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from typing import NoReturn

RUN_USAGE = "fxguard run [--options NAME=0|1,...] (script.py | -m module) [args ...]"
OPTIONS_HELP = "install() options: block_mask_lock=0,eager_backward=0 (names: docs/api.md)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":  # its own parser: everything after the target is the target's
        return run(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "status":
        return status(args.options, as_json=args.as_json, verbose=args.verbose)
    from . import doctor
    return doctor.main(json_path=args.json, verbose=args.verbose)


def _parser() -> argparse.ArgumentParser:
    from . import _install
    parser = argparse.ArgumentParser(
        prog="fxguard", description="Per-thread trace state for PyTorch. With no command: doctor.")
    parser.add_argument("--version", action="version", version=f"fxguard {_install.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{run,doctor,status}")
    commands.add_parser("run", add_help=False, usage=RUN_USAGE,
                        help="run a script or module with fxguard installed (fxguard run -h)")
    doctor = commands.add_parser("doctor", help="show the races on the installed torch, then the fix")
    doctor.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    doctor.add_argument("-v", "--verbose", action="store_true",
                        help="list every row install() planned, and torch's warnings in full")
    status = commands.add_parser(
        "status", help="what install() would do on the installed torch; changes nothing")
    status.add_argument("--options", default="", metavar="LIST", help=OPTIONS_HELP)
    status.add_argument("--json", dest="as_json", action="store_true",
                        help="print fxguard.preview() as JSON")
    status.add_argument("-v", "--verbose", action="store_true", help="list every row")
    parser.set_defaults(command="doctor", json=None, verbose=False, as_json=False)
    return parser


def status(options: str, as_json: bool = False, verbose: bool = False) -> int:
    """Print fxguard.preview() (this process never installs, so status() would
    only ever say "not-installed"): a summary, or JSON with ``as_json``."""
    import json

    import fxguard

    from .doctor import captured_warnings
    from .startup import parse_options
    try:
        chosen = parse_options(options)
    except ValueError as e:
        _parser().error(f"--options: {e}")
    with captured_warnings():  # torch's import-time notices (NumPy, TorchScript): not ours
        try:
            info = fxguard.preview(**chosen)
        except fxguard.UnsupportedTorchError as e:
            info = {**fxguard.status(), "preview": True, "error": str(e)}
    if as_json:
        print(json.dumps(info, indent=2))
    elif "error" in info:
        print(f"fxguard {info['fxguard']}  torch {info['torch']}  Python {info['python']}\n"
              f"install() would refuse: {info['error']}")
    else:
        print(_summary(info, verbose))
    return 1 if "error" in info else 0


def _summary(info: dict, verbose: bool) -> str:
    import textwrap

    from .doctor import OUTCOMES, row_lines
    cc, points, waiting = info["concurrent_compiles"], info["patch_points"], info["waiting"]
    counts = ", ".join(f"{n} {kind}" for kind in OUTCOMES
                       if (n := sum(p["outcome"] == kind for p in points)))
    lines = [f"fxguard {info['fxguard']}  torch {info['torch']}  Python {info['python']}",
             f"install() would run in mode {info['mode']} (FX flag layout: {info['layout']}); "
             "nothing was changed",
             f"install() would plan {len(points)} rows: {counts}",
             "  (a row: one thing install() changes in torch, docs/rows.md; by option below"
             + (")" if verbose else ", --verbose: every row)"),
             *_rows_by_option(points, info["options"], verbose)]
    if waiting:
        lines += textwrap.wrap(
            "waiting: applied when their module is imported: " + ", ".join(
                f"{module} ({len(rows)})" for module, rows in waiting.items()), 96,
            subsequent_indent="  ")
        lines.append(DIFFERS_FROM_DOCTOR)
    if not verbose:  # rows fxguard stood down on, always in full
        lines += [line for p in points if p["outcome"] == "not covered" for line in row_lines(p)]
    lines += [f"autograd workers: {info['autograd_workers']}",
              f"concurrent_compiles: {'on' if cc['enabled'] else 'off'}; {cc['tested']}"]
    return "\n".join(lines)


# Why `fxguard doctor` counts more rows patched than status (both right for their process).
DIFFERS_FROM_DOCTOR = ("  fxguard doctor counts these as patched: its probes import those "
                       "modules before it installs")
READERS = "fast readers"  # rows made for the reader functions of the per-thread globals


def _rows_by_option(points: list[dict], options: dict, verbose: bool) -> list[str]:
    """The rows grouped by the option that turns them off ("always": none), a line
    per option counting outcomes; with ``verbose``, each row under its option."""
    from .doctor import OUTCOMES, row_lines
    owner = _option_of_each_row()
    groups: dict[str, list[dict]] = {"always": [], READERS: []}
    groups.update((f"{o} ({'on' if on else 'off'})", []) for o, on in options.items())
    for p in points:
        option = owner.get((p["what"], p["where"]), READERS)
        name = option if option in (None, READERS) else \
            f"{option} ({'on' if options[option] else 'off'})"
        groups[name or "always"].append(p)
    groups = {name: group for name, group in groups.items() if group}
    width = max(map(len, groups)) + 2
    lines = []
    for name, group in groups.items():
        counts = ", ".join(f"{n} {kind}" for kind in OUTCOMES
                           if (n := sum(p["outcome"] == kind for p in group)))
        if name.endswith(" (off)"):
            counts += f": install({name.split()[0]}=True) turns them on"
        lines.append(f"  {name.ljust(width)}{counts}")
        for p in group if verbose else ():
            lines += row_lines(p, indent="    ")
    return lines


def _option_of_each_row() -> dict[tuple[str, str], str | None]:
    """(what, where) of each status row -> the option its row follows (None: always)."""
    from .machinery.changes import Outcome
    from .torch_support import rows
    return {(r.what, r.where): None if row.option is None else row.option.value
            for row in rows.ROWS for r in row.report(Outcome.PATCHED)}


def run(argv: list[str]) -> int:
    """Parse fxguard's own options (those before the target), then run the target.

    The options are checked now, before the target runs: ``--options``, or
    without it FXGUARD_OPTIONS from the environment.  A bad one exits 2 naming
    its source: whoever typed ``fxguard run`` asked for fxguard, so running the
    target stock would not be what they typed (under FXGUARD=1 alone, a bad
    FXGUARD_OPTIONS only warns: see startup.py)."""
    target_at = _target_index(argv)
    parser = argparse.ArgumentParser(
        prog="fxguard run", usage=RUN_USAGE,
        description="Run a Python script or module with fxguard installed (also in its "
                    "subprocesses, through FXGUARD=1).")
    parser.add_argument("--options", default=None, metavar="LIST",
                        help=OPTIONS_HELP + "; default: FXGUARD_OPTIONS")
    parser.add_argument("-m", dest="module", metavar="module", help="run a module as a script")
    args = parser.parse_args(argv[:target_at])
    rest = argv[target_at:]
    if args.module is None and not rest:
        parser.error("give a script or -m module")
    import _fxguard_startup  # the FXGUARD=1 hook: install right after the target imports torch

    from .startup import install_from_env, parse_options
    source, text = (("--options", args.options) if args.options is not None
                    else ("FXGUARD_OPTIONS", os.environ.get("FXGUARD_OPTIONS", "")))
    try:
        parse_options(text)
    except ValueError as e:
        parser.error(f"{source}: {e}")
    if args.options is not None:
        os.environ["FXGUARD_OPTIONS"] = text  # children inherit these
    os.environ["FXGUARD"] = "1"
    _fxguard_startup.after_import("torch", lambda torch: install_from_env())
    if args.module is not None:
        run_module(args.module, rest)
    else:
        run_script(rest[0], rest[1:])
    return 0


def _target_index(argv: list[str]) -> int:
    """Where fxguard's options end: at the script, or just past ``-m module``."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--options":
            i += 2
        elif arg == "-m":
            return min(i + 2, len(argv))
        elif arg == "--":
            return i + 1
        elif arg.startswith("-"):  # --options=..., -h; argparse rejects the unknown
            i += 1
        else:
            return i
    return i


def run_script(path: str, args: list[str]) -> None:
    """``python path args``: a file, or a directory or zip with __main__.py."""
    if not os.path.exists(path):
        _exit_like_python(f"can't open file {os.path.abspath(path)!r}: "
                          "[Errno 2] No such file or directory")
    sys.argv = [path, *args]
    if os.path.isdir(path) or not path.endswith(".py") and _is_zip(path):
        _set_path0(os.path.abspath(path))
        _call_target(lambda: _runpy()._run_module_as_main("__main__", alter_argv=False))
        return
    _set_path0(os.path.dirname(os.path.realpath(path)))
    absolute = os.path.abspath(path)
    with open(absolute, "rb") as f:
        source = f.read()
    from importlib.machinery import SourceFileLoader
    main = _fresh_main()
    main.__file__, main.__cached__ = absolute, None
    main.__loader__ = SourceFileLoader("__main__", absolute)
    code = compile(source, absolute, "exec", dont_inherit=True)
    _call_target(lambda: exec(code, main.__dict__))


def run_module(name: str, args: list[str]) -> None:
    """``python -m name args``: runpy, as the interpreter itself does it."""
    sys.argv = ["-m", *args]  # runpy puts the module's file in argv[0]
    _set_path0(os.getcwd())
    _fresh_main()
    _call_target(lambda: _runpy()._run_module_as_main(name, alter_argv=True))


def _runpy():
    import runpy
    return runpy


def _is_zip(path: str) -> bool:
    import zipfile
    return zipfile.is_zipfile(path)


def _set_path0(directory: str) -> None:
    """The target's directory replaces ours (fxguard's bin dir or the cwd) as
    sys.path[0]; with -P (safe_path) Python adds none, so neither do we."""
    if getattr(sys.flags, "safe_path", False):
        return
    sys.path[0] = directory


def _fresh_main() -> types.ModuleType:
    """A new ``__main__`` module, kept after the run (pickle and atexit need it)."""
    main = types.ModuleType("__main__")
    main.__builtins__ = sys.modules["builtins"]
    main.__spec__ = None
    sys.modules["__main__"] = main
    return main


def _call_target(target) -> None:
    """Run the target; an uncaught exception is reported as Python reports it
    (sys.excepthook, status 1; KeyboardInterrupt dies by SIGINT), with this
    module's frames cut off the traceback (runpy's stay: ``python -m`` shows
    them too).  SystemExit passes through."""
    try:
        target()
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        if tb is not None:
            e.__traceback__ = tb  # the hook prints the exception's own traceback
        sys.excepthook(type(e), e, e.__traceback__)
        if isinstance(e, KeyboardInterrupt):
            _die_by_sigint()
        raise SystemExit(1) from None


def _die_by_sigint() -> NoReturn:
    import signal
    sys.stdout.flush(), sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(130)  # where SIGINT does not end the process (not POSIX)


def _exit_like_python(message: str) -> NoReturn:
    print(f"{sys.orig_argv[0]}: {message}", file=sys.stderr)
    raise SystemExit(2)
