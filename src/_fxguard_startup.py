"""fxguard's start-up hook: what ``fxguard-startup.pth`` runs when FXGUARD is set.

A top-level module, not part of the ``fxguard`` package, so that a process
started with FXGUARD=1 pays for importing fxguard only once it imports torch:
until then this module and a meta-path finder are all there is.  The finder
waits for ``import torch``, lets torch finish importing, installs fxguard,
and takes itself off ``sys.meta_path`` (wrapt's post-import hooks work the
same way).  Only the standard library's already-loaded modules are used here.
"""
import os
import sys

ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")
_activated = False  # two site dirs with the .pth (a venv over a base that has it): once


def activate() -> None:
    """Called by the .pth line: install fxguard when torch is imported."""
    global _activated
    if _activated:
        return
    _activated = True
    value = os.environ.get("FXGUARD", "").strip().lower()
    if value in OFF:
        return
    if value not in ON:
        import logging  # only on this error path: start-up stays light
        logging.getLogger("fxguard").warning(
            "FXGUARD=%r: expected 1 (on) or 0 (off); fxguard not activated",
            os.environ["FXGUARD"])
        return
    if not getattr(sys, "_is_gil_enabled", lambda: True)():  # free-threaded, GIL off now
        _watch_gil()
    after_import("torch", _install_from_env)


# Warnings shown before fxguard is imported, kept for fxguard.interpreter (GIL off
# only): CPython's "GIL has been enabled to load module ..." is a RuntimeWarning,
# and fxguard.interpreter knows its words; this module must not import fxguard.
_runtime_warnings: list | None = []  # None once handed to fxguard.interpreter


def _watch_gil() -> None:
    """Keep the RuntimeWarnings shown until fxguard is imported at ``import torch``,
    which then reads them (``_install_from_env``) and watches on its own."""
    import warnings
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        kept = _runtime_warnings  # read once: another thread may hand it over meanwhile
        if kept is not None and issubclass(category, RuntimeWarning):
            kept.append(str(message))
        return shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def _install_from_env(torch_module: object) -> None:
    global _runtime_warnings
    # torch is loaded now: fxguard's import is cheap beside it (the one import of fxguard here)
    from fxguard import interpreter, startup
    kept, _runtime_warnings = _runtime_warnings, None  # fxguard.interpreter watches from now
    for message in kept or ():
        interpreter.note(message)
    startup.install_from_env()


def after_import(name: str, callback) -> None:
    """Call ``callback(module)`` right after module ``name`` finishes importing
    (at once if it already has)."""
    module = sys.modules.get(name)
    if module is not None and not _initializing(module):
        callback(module)
        return
    sys.meta_path.insert(0, _AfterImportFinder(name, callback))


def _initializing(module: object) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _AfterImportFinder:
    """A meta-path finder that finds nothing itself: it asks the finders after
    it for ``name``, wraps the loader they return, and leaves sys.meta_path."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        self.remove()
        for finder in list(sys.meta_path):
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenCall(spec.loader, self.callback)
                return spec
        return None

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


class _ThenCall:
    """Loader wrapper: the real loader executes the module, then the callback runs.
    The module's ``__loader__`` and ``__spec__.loader`` are the real loader again
    before its code runs, so the module never sees this wrapper."""

    def __init__(self, loader, callback) -> None:
        self.loader, self.callback = loader, callback

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.callback(module)
