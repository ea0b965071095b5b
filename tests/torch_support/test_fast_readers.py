"""Fast readers: one-line readers answered by a C Reader, and what uninstall puts back."""
from __future__ import annotations

import gc
import inspect
import sys
import types
import weakref

import pytest

import fxguard
from fxguard import _core
from fxguard.machinery import originals
from fxguard.machinery.changes import Change

vectorcall_only = pytest.mark.skipif(not _core.VECTORCALL_READERS,
                                     reason="this Python ignores a function's vectorcall (3.11)")


@pytest.fixture
def one_slot():
    """The core configured with one slot whose initial value is 'reader'."""
    if fxguard.is_installed():
        pytest.skip("needs the core to itself")
    _core._configure(_core.MODE_PATCHED, defaults=("reader",), factories=(None,))
    yield
    _core._configure(_core.MODE_OFF)


def function_carrying(reader):
    """def f(): return 'code', with the Reader as its code's last constant."""
    namespace = {}
    exec("def f():\n    return 'code'\n", namespace)
    f = namespace["f"]
    f.__code__ = f.__code__.replace(co_consts=f.__code__.co_consts + (reader,))
    return f


def test_read_is_the_calling_threads_value(one_slot):
    reader = _core.Reader(_core.READ_VALUE, 0)
    assert reader.read() == "reader"
    with pytest.raises(TypeError):
        reader.read(1)


def test_bad_reader_arguments_change_nothing():
    with pytest.raises(ValueError):
        _core.Reader(7)
    with pytest.raises(ValueError):
        _core.Reader(_core.READ_SYMBOLIC, 0)
    reader = _core.Reader(_core.READ_VALUE, 0)
    for bad in (len, 3):
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            reader.function = bad
    plain = function_carrying(_core.Reader(_core.READ_VALUE, 0))  # carries another reader
    with pytest.raises((ValueError, RuntimeError)):
        reader.function = plain
    assert reader.function is None and plain() == "code"
    namespace = {}
    exec("def g(x=1):\n    return x\n", namespace)  # parameters: never served from C
    g = namespace["g"]
    g.__code__ = g.__code__.replace(co_consts=g.__code__.co_consts + (reader,))
    with pytest.raises((ValueError, RuntimeError)):
        reader.function = g
    assert reader.function is None and g() == 1


@vectorcall_only
def test_vectorcall_reaches_specialised_call_sites(one_slot):
    reader = _core.Reader(_core.READ_VALUE, 0)
    f = function_carrying(reader)

    def site():
        return f()

    code, signature = f.__code__, inspect.signature(f)
    assert {site() for _ in range(2000)} == {"code"}  # the site is specialised now
    reader.function = f
    assert {site() for _ in range(2000)} == {"reader"}
    assert f.__code__ is code and inspect.signature(f) == signature
    with pytest.raises(TypeError):
        f(1)  # arguments: the code runs and raises as it would
    reader.function = None
    assert {site() for _ in range(2000)} == {"code"}


@vectorcall_only
def test_swapping_code_while_attached_runs_the_new_code(one_slot):
    reader = _core.Reader(_core.READ_VALUE, 0)
    f = function_carrying(reader)
    reader.function = f
    original = f.__code__
    f.__code__ = (lambda: "other").__code__
    assert f() == "other"
    f.__code__ = original
    assert f() == "reader"
    reader.function = None


def function_calling_first(reader, namespace):
    """def f(): note(); return 'code', in namespace, carrying the Reader."""
    exec("def f():\n    note()\n    return 'code'\n", namespace)
    f = namespace["f"]
    f.__code__ = f.__code__.replace(co_consts=f.__code__.co_consts + (reader,))
    return f


@vectorcall_only
def test_a_served_call_calls_first_as_the_code_would(one_slot):
    calls = []
    namespace = {"note": lambda: calls.append("note")}
    reader = _core.Reader(_core.READ_VALUE, 0, first="note")
    f = function_calling_first(reader, namespace)
    reader.function = f
    assert f() == "reader" and calls == ["note"]
    namespace["note"] = lambda: calls.append("rebound")  # looked up per call, as code does
    assert f() == "reader" and calls == ["note", "rebound"]

    def boom():
        raise LookupError("from first")
    namespace["note"] = boom
    with pytest.raises(LookupError, match="from first"):
        f()
    del namespace["note"]
    with pytest.raises(NameError, match="note"):
        f()
    reader.function = None
    with pytest.raises(NameError, match="note"):
        f()  # the code says the same


def test_first_must_be_a_name():
    with pytest.raises(TypeError, match="first"):
        _core.Reader(_core.READ_VALUE, 0, first=print)
    assert "first" in inspect.signature(_core.Reader).parameters


@pytest.mark.skipif(sys.version_info < (3, 11), reason="no function versions before 3.11")
def test_reverting_a_code_patch_restores_the_function_version():
    namespace = {}
    exec("def f():\n    return 1\n", namespace)
    f = namespace["f"]

    def site():
        return f()

    for _ in range(2000):
        site()
    before = _core._function_version(f)
    patch = originals.apply(Change("test", f, "__code__", (lambda: 2).__code__))
    assert site() == 2
    originals.revert(patch)
    originals._applied.remove(patch)
    assert site() == 1 and _core._function_version(f) == before


def test_lock_binds_enter_and_exit_once_and_is_still_collected():
    lock = fxguard.RLock()
    with lock:
        assert lock._is_owned()
    assert lock.__enter__ is lock.__enter__ and lock.__exit__ is lock.__exit__
    assert inspect.signature(fxguard.RLock.__enter__) is not None
    ref = weakref.ref(lock)
    del lock
    gc.collect()  # lock <-> its bound methods: a cycle the collector sees
    assert ref() is None


# -- on torch -------------------------------------------------------------------------------

def fast_readers():
    pytest.importorskip("torch")
    import importlib

    from fxguard.torch_support.trace_state import PER_THREAD
    for row in PER_THREAD:
        module = importlib.import_module(row.module)
        for name in dict.fromkeys(reader.name for reader in row.readers):
            if hasattr(module, name):  # older torch lacks some
                yield getattr(module, name), name


@pytest.fixture
def installed():
    pytest.importorskip("torch")
    fxguard.install()
    yield
    fxguard.uninstall()


def test_fast_readers_agree_with_their_code(installed):
    from torch.fx import traceback as fx_traceback
    for fn, _ in fast_readers():
        by_code = types.FunctionType(fn.__code__, fn.__globals__)  # stock vectorcall: runs the code
        assert fn() == by_code(), fn.__name__
        with fxguard.fx_tracing(), fx_traceback.preserve_node_meta():
            assert fn() == by_code(), fn.__name__


def test_every_fast_reader_of_this_torch_is_served_or_left_on_purpose(installed):
    """A torch release that changes a reader's body shows up here first: the
    reader then runs its rewritten code (correct, slower)."""
    rows = [r for r in fxguard.status()["patch_points"] if r["what"] == "fast reader"]
    assert rows, "no fast reader applies to this torch"
    assert not [r for r in rows if r["outcome"] == "not covered"], rows


def test_is_fx_tracing_still_calls_its_warning_on_every_call(installed, monkeypatch):
    """Stock is_fx_tracing() calls is_fx_tracing_warning() (lru-cached: it logs
    once) every time; served from C it still does, and finds it by name."""
    from torch.fx import _symbolic_trace
    if not hasattr(_symbolic_trace, "is_fx_tracing_warning"):
        pytest.skip("torch <= 2.8: is_fx_tracing() warns about nothing")
    calls = []
    monkeypatch.setattr(_symbolic_trace, "is_fx_tracing_warning", lambda: calls.append(1))
    assert _symbolic_trace.is_fx_tracing() is False
    with fxguard.fx_tracing():
        assert _symbolic_trace.is_fx_tracing() is True
    assert calls == [1, 1]


def test_fast_readers_fold_under_fullgraph():
    """Every reader stock dynamo folds under fullgraph still folds after install()
    (torch 2.9 skips get_current_meta: stock cannot either)."""
    import torch

    def folds(fn):
        def step(x):
            return x + (1 if fn() else 0)
        torch._dynamo.reset()
        try:
            torch.compile(step, fullgraph=True, backend="eager")(torch.ones(2))
        except torch._dynamo.exc.Unsupported:
            return False
        return True

    stock = {name for fn, name in fast_readers() if folds(fn)}
    assert stock, "stock dynamo folds none of the readers"
    fxguard.install()
    try:
        assert {name for fn, name in fast_readers() if folds(fn)} >= stock
    finally:
        fxguard.uninstall()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="no function versions before 3.11")
def test_uninstall_restores_readers_exactly():
    pytest.importorskip("torch")
    fxguard.uninstall()
    fns = [fn for fn, _ in fast_readers()]
    sites = [lambda fn=fn: fn() for fn in fns]
    for _ in range(2000):
        for site in sites:
            site()
    before = [(fn.__code__, _core._function_version(fn)) for fn in fns]
    fxguard.install()
    fxguard.uninstall()
    after = [(fn.__code__, _core._function_version(fn)) for fn in fns]
    assert after == before
