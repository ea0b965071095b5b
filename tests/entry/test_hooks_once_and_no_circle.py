"""The hooks fxguard sets on the process: once each, however often install()
runs; and the FXGUARD=1 start-up hook stays below the package (an import of
fxguard never imports it back: no circle through it)."""
import ast
import os
import subprocess
import sys
import textwrap

import pytest

import _fxguard_startup

import fxguard


@pytest.mark.slow
def test_install_uninstall_install_adds_no_second_hook():
    body = textwrap.dedent("""
        import atexit, os, sys
        forks, exits = [], []
        real_fork, real_exit = os.register_at_fork, atexit.register
        os.register_at_fork = lambda **hooks: (forks.append(hooks.get("after_in_child")),
                                               real_fork(**hooks))[1]
        atexit.register = lambda f, *a, **k: (exits.append(f), real_exit(f, *a, **k))[1]
        import torch
        import fxguard
        from fxguard import _core
        from fxguard.machinery import import_watch

        def finders():
            return [type(f).__name__ for f in sys.meta_path
                    if isinstance(f, (import_watch.Watcher, import_watch._NoImports))]

        seen = []
        for _ in range(3):
            fxguard.install(concurrent_compiles=True)
            seen.append(finders())
            fxguard.uninstall()
            seen.append(finders())
        fxguard.install(concurrent_compiles=True)
        def core(f):  # the C core's hook: bound to its registry's capsule
            return type(getattr(f, "__self__", None)).__name__ == "PyCapsule"
        mine = ["C core" if core(f) else f.__module__ for f in forks
                if core(f) or (getattr(f, "__module__", None) or "").startswith("fxguard")]
        print(mine)
        print([f is _core._await_thread_exits for f in exits
               if getattr(f, "__self__", None) is _core or
               (getattr(f, "__module__", None) or "").startswith("fxguard")])
        print(all(hasattr(torch._C, f"_{name}_obj_in_tls") for name in ("stash", "get"))
              and hasattr(torch._C, "_is_key_in_tls"))
        print(seen)
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FXGUARD")}
    environ["FXGUARD_ALLOW_UNTESTED"] = "concurrent_compiles"  # the GIL off: installed, not run
    proc = subprocess.run([sys.executable, "-c", body], env=environ, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    forks, exits, carried, finders = proc.stdout.splitlines()[-4:]
    # the C core's own (a C function, no module), then the room's one for Python callbacks
    assert forks == "['C core', 'fxguard.machinery.process_hooks']"
    # records carried into torch's thread-locals: one exit hook waits for exiting threads
    assert exits == ("[True]" if carried == "True" else "[]")
    # at most one watcher on sys.meta_path while installed, none after uninstall
    for installed, uninstalled in zip(*[iter(ast.literal_eval(finders))] * 2):
        assert installed in ([], ["Watcher"]) and uninstalled == []


def imports_of(path: str, package: str) -> tuple[set[str], set[str]]:
    """(module-level, in-function) absolute names a module imports; relative
    imports resolved against ``package``."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    top, inner = set(), set()
    at_top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = {base} | {f"{base}.{a.name}" for a in node.names}
        else:
            continue
        (top if id(node) in at_top else inner).update(names)
    return top, inner


def package_modules() -> dict[str, tuple[str, str]]:
    """fxguard's modules as installed: name -> (file, package its relative imports use)."""
    root = os.path.dirname(fxguard.__file__)
    found = {}
    for folder, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, file), os.path.dirname(root))
                name = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
                package = name if file == "__init__.py" else name.rpartition(".")[0]
                found[name] = (os.path.join(folder, file), package)
    return found


def test_no_circle_through_the_start_up_hook():
    """Every module the hook's imports of fxguard can reach, lazy imports
    counted: none imports the hook back (fxguard.interpreter did)."""
    modules = package_modules()
    top, inner = imports_of(_fxguard_startup.__file__, "")
    reached, todo = set(), [name for name in top | inner if name.split(".")[0] == "fxguard"]
    while todo:
        name = todo.pop()
        if name in reached or name not in modules:
            continue
        reached.add(name)
        top, inner = imports_of(*modules[name])
        for imported in top | inner:
            parts = imported.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
            if parts[0] == "_fxguard_startup":
                raise AssertionError(f"{name} imports the start-up hook")
    assert {"fxguard.interpreter", "fxguard._install", "fxguard.startup"} <= reached


def test_the_start_up_hook_imports_fxguard_only_once_torch_is_there():
    top, inner = imports_of(_fxguard_startup.__file__, "")
    assert top == {"os", "sys"}  # at module level: only what the interpreter has loaded anyway
    tree = ast.parse(open(_fxguard_startup.__file__, encoding="utf-8").read())
    importing = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 for node in ast.walk(f) if isinstance(node, ast.ImportFrom)
                 and (node.module or "").split(".")[0] == "fxguard"}
    assert importing == {"_install_from_env"}  # called right after torch finished importing


def test_the_hook_hands_the_warnings_it_kept_to_fxguard_when_it_imports_it():
    """Free-threaded, GIL off: the hook keeps what was shown before fxguard was
    imported; fxguard.interpreter picks out the modules that turned the GIL on.
    (Run here by hand on any build: the hook watches only with the GIL off.)"""
    body = textwrap.dedent("""
        import warnings
        import _fxguard_startup
        _fxguard_startup._watch_gil()
        warnings.warn("The global interpreter lock (GIL) has been enabled to load module "
                      "'early_ext', which has not declared that it can run safely without "
                      "the GIL.", RuntimeWarning)
        warnings.warn("not about the GIL", UserWarning)
        import torch
        _fxguard_startup._install_from_env(torch)
        from fxguard import interpreter
        print(interpreter._enabled_by[:1], _fxguard_startup._runtime_warnings)
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FXGUARD")}
    proc = subprocess.run([sys.executable, "-c", body], env=environ, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # handed over first (3.13t: torch's import may add triton's), then no more kept
    assert proc.stdout.splitlines()[-1] == "['early_ext'] None"
