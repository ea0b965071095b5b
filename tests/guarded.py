"""Race tests run both ways: guard off must fail on a torch that races."""
import itertools
import json
import subprocess
import sys
import threading

import pytest

from fxguard.machinery.settle import current_frames


def torch_races() -> bool:
    """Whether the installed torch keeps the FX-tracing flag process-wide."""
    from torch.fx import _symbolic_trace

    from fxguard.torch_support import facts
    return facts.detect_layout(_symbolic_trace) == facts.MODULE_GLOBAL


def stock_loses_config() -> bool:
    """Whether a stock thread starts without its starter's torch config (2.12+,
    Python without thread_inherit_context)."""
    from fxguard.torch_support import facts
    return facts.config_is_per_thread() and not facts.python_inherits_context()


def both_ways(races=torch_races):
    """Parametrize over guard off (strict xfail where torch races) and on."""
    return pytest.mark.parametrize("guard", [
        pytest.param("off", marks=pytest.mark.xfail(
            races(), strict=True, reason="stock torch races: the test must catch it")),
        "on",
    ], indirect=True)


def needs(path: str):
    """Skip where the installed torch lacks ``path`` ('pkg.mod.attr'): older releases."""
    import importlib
    module, _, attr = path.rpartition(".")
    try:
        present = hasattr(importlib.import_module(module), attr)
    except ImportError:
        present = False
    return pytest.mark.skipif(not present, reason=f"this torch has no {path}")


def child_json(args, out, *, env, cwd, label: str):
    """Run ``python args...`` (it writes JSON to ``out``), assert it exited 0, and
    return that JSON: one differential run."""
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{label} exited {done.returncode}:\n" + done.stderr[-4000:]
    return json.loads(out.read_text())


def run_raising(targets, timeout: float = 60.0, on_error=None, made=None) -> None:
    """Run each target on a thread of its own and wait for all: the first
    exception of any is raised here (``on_error()`` runs at once when one
    raises, to free the others), then a thread still running after ``timeout``
    fails the test; ``made(threads)`` sees the threads before they start."""
    import time
    errors = []

    def body(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)
            if on_error is not None:
                on_error()
    threads = [threading.Thread(target=body, args=(t,), daemon=True,
                                name=getattr(t, "__name__", None)) for t in targets]
    if made is not None:
        made(threads)
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {timeout:.0f} s: {alive}"


def run_together(*targets, timeout: float = 60.0) -> None:
    """Start one thread per target, wait for all; what one raised is raised here."""
    run_raising(targets, timeout=timeout)


def finish(*threads, timeout: float = 60.0) -> None:
    """Join ``threads``; one still running after ``timeout`` (a hang guard) fails the test."""
    import time
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {timeout:.0f} s: {alive}"


# -- concurrent_compiles: three ways ----------------------------------------------
# "stock": torch as it is; "option off": fxguard.install() (concurrent_compiles
# off); "on": fxguard.install(concurrent_compiles=True).  Where dynamo's
# compile_lock hides a race (two compiles never overlap), the first two run
# with compile_lock made a no-op (what turning the lock off alone would do).

CONCURRENT_WAYS = ("stock", "option off", "on")


def concurrent_ways(races=True):
    """Parametrize ``way``: the first two must fail where torch races (strict xfail)."""
    fails = pytest.mark.xfail(races() if callable(races) else races, strict=True,
                              reason="process-wide without the option: the test must catch it")
    return pytest.mark.parametrize("way", [pytest.param("stock", marks=fails),
                                           pytest.param("option off", marks=fails), "on"])


class NoLock:
    """compile_lock made a no-op: compiles overlap without any of the option's rows."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _is_owned(self):
        return False


def apply_way(way: str, monkeypatch, lock_hides: bool) -> dict:
    """Put torch in ``way``; returns status().  Undone by the clean_torch fixture
    (uninstall) and monkeypatch (the no-op lock)."""
    import fxguard
    if way == "on":
        return fxguard.install(concurrent_compiles=True)
    info = fxguard.install() if way == "option off" else fxguard.status()
    if lock_hides:
        import torch._dynamo.convert_frame as convert_frame
        monkeypatch.setattr(convert_frame, "compile_lock", NoLock())
    return info


def held_in(thread, code) -> bool:
    """Whether ``thread`` is blocked in ``code`` (a code object, or a predicate
    on frames): a frame of its stack runs it, and inside that frame only
    threading's waits run (Condition.wait, Event.wait, ...), or none (a C-level
    wait such as a lock's acquire)."""
    frame = current_frames().get(thread.ident)
    while frame is not None:
        if code(frame) if callable(code) else frame.f_code is code:
            return True
        if frame.f_code.co_filename != threading.__file__:
            return False
        frame = frame.f_back
    return False


def on_stack(thread, code) -> bool:
    """Whether any of ``thread``'s Python frames runs ``code``."""
    frame = current_frames().get(thread.ident)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def child_env(**extra: str) -> dict:
    """The environment of a child interpreter that imports what this one does,
    the tests' own modules too (wherever the checkout lies)."""
    import os
    import sys
    tests = os.path.dirname(os.path.abspath(__file__))
    path = [os.path.join(tests, "races"), tests] + [p for p in sys.path if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


_fresh_names = itertools.count()


def fresh_function(source: str, name: str = "f", namespace: dict | None = None):
    """Function ``name`` defined by ``source`` in a code object nothing saw
    before, with its source where inspect finds it (linecache): torch 2.11
    compiles a function without one through a wrapper code the whole process
    shares (external_utils.wrap_inline, pytorch/pytorch#124269), whose cache
    entries outlive it and share one recompile_limit (past it, every later
    such function runs eager) and which a skip marks instead of the function."""
    import linecache
    filename = f"<fxguard fresh {next(_fresh_names)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {} if namespace is None else namespace
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def wait_until(predicate, what: str, timeout: float = 120.0) -> None:
    """Poll ``predicate`` (a state, never a duration: the timeout only ends a hung test)."""
    import time
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.005)


def gil_off() -> bool:
    """A free-threaded build running without the GIL now."""
    from fxguard import interpreter
    return not interpreter.gil_enabled()


# Some concurrent_compiles tests watch other threads' frames (sys._current_frames),
# which races with those threads without the GIL; its stress met torch's own C++
# state there (PyHandleCache's assert in FakeTensor's cache).  The option is not
# claimed without the GIL (README, "Concurrent compiles", limits).
needs_the_gil = pytest.mark.skipif(gil_off(), reason="concurrent_compiles is not tested without "
                                   "the GIL (README, Concurrent compiles)")


# Compile once stands down without the GIL (torch_support/compile_once.py).
needs_the_gil_for_compile_once = pytest.mark.skipif(
    gil_off(), reason="compile once is not available with the GIL off (README)")


class ObservedLock:
    """torch's own compile_lock, with who waits for it in view."""

    def __init__(self, lock):
        self.lock, self.waiting = lock, set()

    def __enter__(self):
        self.waiting.add(threading.get_ident())
        try:
            return self.lock.__enter__()
        finally:
            self.waiting.discard(threading.get_ident())

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)

    def _is_owned(self):
        return self.lock._is_owned()


def holding_op(name: str, on_fake):
    """A custom op (a copy) whose fake implementation, run while a compile
    traces it, first calls ``on_fake()``: where a test holds a thread."""
    import torch

    @torch.library.custom_op(name, mutates_args=())
    def hold(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @hold.register_fake
    def _(x):
        on_fake()
        return torch.empty_like(x)
    return hold


def apply(changes) -> None:
    """Apply planned changes (machinery tests: no other thread runs the code)."""
    from fxguard.machinery import originals
    originals.apply_all(changes, lambda codes: None)


def run_test_in_child(test_file: str, test_id: str, flag: str, timeout: float = 1800) -> None:
    """Run ``test_file::test_id`` in a child interpreter with ``flag``=1 set (the
    test skips without it): for tests that leave torch changed in their process."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{os.path.abspath(test_file)}::{test_id}"],
        cwd=root, env=child_env(**{flag: "1"}), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-6000:] + out.stderr[-2000:]
