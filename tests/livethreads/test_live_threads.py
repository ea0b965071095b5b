"""install(), uninstall(), install() with other options and importlib.reload
while threads are parked inside every function and context manager fxguard
rewrites.

The targets come from the installed plan (originals' record of every
``__code__`` it swapped), never from a list kept by hand.  A thread parks:

- in a generator (a @contextmanager's body): it runs the generator to its
  first ``yield`` and waits there, the generator suspended on no stack;
- in a plain function: a trace function of that thread alone blocks at the
  function's first line event.

Each thread calls its target with placeholder arguments (None, or the small
table below): its outcome (return type, or exception and message) must be the
one the same parked run gives with nothing changed while the threads were
parked, in the mode they were parked in.  A NameError for a name fxguard
retired, or any other difference, fails the case.  Afterwards the trace state
must be per thread (checked from two threads), no module global shadows
fxguard's view, and after uninstall every name is as stock had it.

Deterministic: Events order every step; timeouts only guard against hangs.
"""
import functools
import importlib
import inspect
import sys
import threading
import types

import pytest
import torch._dynamo  # noqa: F401  (its rows apply only once it is imported)
import torch.fx.traceback as fx_traceback

import fxguard
from fxguard import interpreter
from fxguard.machinery import originals

pytestmark = pytest.mark.skipif(not interpreter.gil_enabled(),
                                reason="other threads' frames are not walked with the GIL off")

HANG = 120  # seconds: a hang guard only
OTHER = {"compile_once": False}  # install() with other options than the defaults
# A generator that needs a real argument to reach its yield.
ARGS = {"annotate": ({},)}


@functools.lru_cache(maxsize=None)
def _plan():
    """(functions whose code install() swaps, modules whose globals it makes per
    thread, those globals) on this torch; made once, when a test first asks.
    The modules rows wait for are imported first, so their rows are in it too."""
    import importlib
    waiting = fxguard.install()["waiting"]
    fxguard.uninstall()
    for module in waiting:
        importlib.import_module(module)
    fxguard.install()
    try:
        patches = originals.applied()
        functions = [p.owner for p in patches
                     if p.attr == "__code__" and isinstance(p.owner, types.FunctionType)]
        owners = list(dict.fromkeys(p.owner for p in patches
                                    if p.attr == "__getattr__" and isinstance(p.owner, types.ModuleType)))
        globals_ = [(p.owner, p.attr) for p in patches
                    if p.value is originals.MISSING and isinstance(p.owner, types.ModuleType)]
    finally:
        fxguard.uninstall()
    return functions, owners, globals_


def _functions():
    return _plan()[0]


def _globals():
    return _plan()[2]


def _is_generator(fn):
    return bool(fn.__code__.co_flags & inspect.CO_GENERATOR)


class _NotSelf:
    """The placeholder ``self`` of a method that calls ``super()``: with None,
    CPython 3.12+ raises AttributeError or TypeError there depending on whether
    the code ran traced before (its LOAD_SUPER_ATTR path), so a parked run and its
    baseline could differ with nothing changed; with this, every path raises
    the same TypeError."""


def _arguments(fn):
    if fn.__name__ in ARGS:
        return ARGS[fn.__name__], {}
    code = fn.__code__
    required = code.co_argcount - len(fn.__defaults__ or ())
    kwonly = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    args = [None] * required
    if args and "__class__" in code.co_freevars:
        args[0] = _NotSelf()
    return tuple(args), {k: None for k in kwonly if k not in (fn.__kwdefaults__ or {})}


def _outcome(call):
    try:
        result = call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return f"returned {type(result).__name__}"


def _call(fn, parked, release):
    """Run fn parked: a generator at its yield, a function at its first line."""
    args, kwargs = _arguments(fn)
    if _is_generator(fn):
        gen = fn(*args, **kwargs)
        first = _outcome(lambda: next(gen))
        if not first.startswith("returned"):
            return first
        parked.set()
        assert release.wait(HANG)
        try:
            next(gen)
        except StopIteration:
            return first
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "did not stop"
    code = fn.__code__

    def in_frame(frame, event, arg):
        if event == "line" and not parked.is_set():
            parked.set()
            assert release.wait(HANG)
        return in_frame

    def tracer(frame, event, arg):
        return in_frame if event == "call" and frame.f_code is code else None

    sys.settrace(tracer)
    try:
        return _outcome(lambda: fn(*args, **kwargs))
    finally:
        sys.settrace(None)


BASELINE = {}  # (installed?) -> {fn: its outcome, parked with nothing changed meanwhile}


def _parked(change):
    """Park a thread in every target, run change(), then release them one at a
    time in a fixed order (each runs to its end before the next goes on: stock
    shares these globals between threads, so the order must not vary)."""
    threads, outcomes, errors = [], {}, []
    for fn in _functions():
        parked, release = threading.Event(), threading.Event()

        def run(fn=fn, parked=parked, release=release):
            try:
                outcomes[fn] = _call(fn, parked, release)
            except BaseException as e:  # the harness's own failure: reported below
                errors.append((fn, e))
            finally:
                parked.set()  # also where it returned before its yield
        thread = threading.Thread(target=run, daemon=True, name=f"parked-{fn.__qualname__}")
        thread.start()
        assert parked.wait(HANG), fn
        threads.append((thread, release))
    try:
        change()
    finally:
        for thread, release in threads:
            release.set()
            thread.join(HANG)
    assert not [t.name for t, _ in threads if t.is_alive()]
    assert errors == []
    return outcomes


def _parked_during(change):
    """How each outcome differs from the same run with nothing changed while the
    threads were parked (in the mode they were parked in: the code they run)."""
    installed = fxguard.is_installed()
    if installed not in BASELINE:
        options = fxguard.status()["options"]
        BASELINE[installed] = _parked(lambda: None)
        fxguard.uninstall()  # the baseline's threads changed stock globals, as stock does
        if options:
            fxguard.install(**options)
    expected = BASELINE[installed]
    outcomes = _parked(change)
    return {f"{fn.__module__}.{fn.__qualname__}": (expected[fn], outcomes[fn])
            for fn in _functions() if outcomes[fn] != expected[fn]}


def _in_thread(fn):
    box = []
    t = threading.Thread(target=lambda: box.append(_outcome(fn)))
    t.start()
    t.join(HANG)
    return box[0]


def _swept():
    """Names that waited for the parked frames are settled once those left."""
    done = threading.Event()
    held = getattr(originals, "held", tuple)  # (a fxguard without it: nothing is ever held)
    for _ in range(HANG * 100):
        if not held():
            return
        done.wait(0.01)
    raise AssertionError(f"still held: {held()}")


def _assert_per_thread():
    """One thread's node meta and flags are not another's, and no module global
    shadows fxguard's per-thread view."""
    _swept()
    assert fxguard.status()["mode"] != "not-installed"
    shadowing = [f"{m.__name__}.{n}" for m, n in _globals() if n in vars(m)]
    assert shadowing == []
    inside, checked = threading.Event(), threading.Event()
    seen = {}

    def writer():
        with fx_traceback.preserve_node_meta():
            fx_traceback.current_meta["fxguard-live"] = 1
            seen["own"] = "fxguard-live" in fx_traceback.get_current_meta()
            inside.set()
            assert checked.wait(HANG)

    def other():
        assert inside.wait(HANG)
        seen["other preserves"] = fx_traceback.has_preserved_node_meta()
        seen["other meta"] = "fxguard-live" in fx_traceback.current_meta
        checked.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG)
    assert seen == {"own": True, "other preserves": False, "other meta": False}


def _assert_stock():
    _swept()
    assert fxguard.status()["mode"] == "not-installed"
    missing = [f"{m.__name__}.{n}" for m, n in _globals() if n not in vars(m)]
    left = sorted({f"{m.__name__}.{k}" for m in {m for m, _ in _globals()} | set(_plan()[1])
                   for k in vars(m) if k.startswith("__fxguard")})
    assert (missing, left) == ([], [])
    assert _in_thread(fx_traceback.has_preserved_node_meta) == "returned bool"


def test_the_plan_has_targets():
    """The harness covers what the plan changes (a plan without generators or
    per-thread globals would make the cases below vacuous)."""
    functions, owners, globals_ = _plan()
    assert any(map(_is_generator, functions)) and globals_ and owners
    assert len(functions) > 20


def test_install_while_threads_are_inside():
    assert _parked_during(fxguard.install) == {}
    _assert_per_thread()


def test_uninstall_while_threads_are_inside():
    fxguard.install()
    assert _parked_during(fxguard.uninstall) == {}
    _assert_stock()


def test_install_with_other_options_while_threads_are_inside():
    fxguard.install()
    assert _parked_during(lambda: fxguard.install(**OTHER)) == {}
    assert fxguard.status()["options"]["compile_once"] is False
    _assert_per_thread()


# Reloading a module that defines classes others subclass or register
# (torch._ops, _python_dispatch, _symbolic_trace, ...) breaks stock torch in
# the process ("torch.Size is already registered as pytree node"): only the
# plan's modules whose reload stock survives are reloaded here.
RELOADABLE = ("torch.fx.traceback", "torch.compiler")


@pytest.mark.parametrize("module", RELOADABLE)
def test_reload_while_threads_are_inside(module):
    """In a child interpreter: a reload leaves this process's torch changed for
    the tests after it (dynamo's rules keep the old function objects, so
    torch.compiler.is_compiling read in compiled code is no longer folded)."""
    from guarded import run_test_in_child
    run_test_in_child(__file__, f"test_reload_in_this_process[{module}]",
                      "FXGUARD_TEST_RELOAD_HERE", timeout=900)


@pytest.mark.skipif(not __import__("os").environ.get("FXGUARD_TEST_RELOAD_HERE"),
                    reason="run by test_reload_while_threads_are_inside in a child interpreter")
@pytest.mark.parametrize("module", RELOADABLE)
def test_reload_in_this_process(module):
    """reload() puts stock functions and globals back: fxguard installs again,
    over the module's new functions and the old ones others imported by name."""
    assert module in {m.__name__ for m in _plan()[1]}  # one whose globals fxguard changes
    fxguard.install()
    old = [fn for fn in _functions() if fn.__module__ == module]
    assert _parked_during(lambda: importlib.reload(sys.modules[module])) == {}
    _assert_per_thread()
    new = [v for v in vars(sys.modules[module]).values() if isinstance(v, types.FunctionType)]
    assert new and not set(new) & set(old)
    swapped = {id(p.owner) for p in originals.applied() if p.attr == "__code__"}
    assert all(id(fn) in swapped for fn in old)  # what others imported stays per thread
    assert any(id(fn) in swapped for fn in new)
    fxguard.uninstall()
    _assert_stock()
