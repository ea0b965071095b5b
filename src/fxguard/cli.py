"""The ``fxguard`` command (also ``python -m fxguard``): run | doctor | status.

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":
        return run(argv[1:])
    from . import doctor
    return doctor.main(argv)


def run(argv: list[str]) -> int:
    """Parse fxguard's own options (those before the target), then run the target."""
    target_at = _target_index(argv)
    parser = argparse.ArgumentParser(
        prog="fxguard run", usage=RUN_USAGE,
        description="Run a Python script or module with fxguard installed (also in its "
                    "subprocesses, through FXGUARD=1).")
    parser.add_argument("--options", default=os.environ.get("FXGUARD_OPTIONS", ""),
                        metavar="LIST", help="install() options, as in FXGUARD_OPTIONS: "
                                             "block_mask_lock=0,eager_backward=0")
    parser.add_argument("-m", dest="module", metavar="module", help="run a module as a script")
    args = parser.parse_args(argv[:target_at])
    rest = argv[target_at:]
    if args.module is None and not rest:
        parser.error("give a script or -m module")
    from .startup import install_when_torch_imported, parse_options
    try:
        parse_options(args.options)
    except ValueError as e:
        parser.error(f"--options: {e}")
    os.environ.update(FXGUARD="1", FXGUARD_OPTIONS=args.options)  # children inherit these
    install_when_torch_imported()
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
