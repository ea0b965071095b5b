"""The C core on its own: thread slots, the context manager, the descriptor, refcounts.

Each test runs in a fresh interpreter that never imports torch, so the core
is exercised without it (and proves ``import fxguard`` does not import torch).
"""
import subprocess
import sys
import textwrap

import pytest


def run_without_torch(body: str) -> None:
    code = "import sys, threading, fxguard\n" + textwrap.dedent(body) + \
        "\nassert 'torch' not in sys.modules, 'fxguard imported torch'\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_import_does_not_import_torch():
    run_without_torch("assert fxguard.status()['mode'] == 'not-installed'")


def test_each_thread_starts_false_and_sees_only_its_own_flag():
    run_without_torch("""
        inside, release, seen = threading.Event(), threading.Event(), []
        def tracer():
            with fxguard.fx_tracing():
                inside.set(); release.wait(10)
                seen.append(('tracer', fxguard.is_fx_tracing()))
        t = threading.Thread(target=tracer); t.start(); inside.wait(10)
        seen.append(('main', fxguard.is_fx_tracing()))
        other = threading.Thread(target=lambda: seen.append(('new', fxguard.is_fx_tracing())))
        other.start(); other.join(); release.set(); t.join()
        assert sorted(seen) == [('main', False), ('new', False), ('tracer', True)], seen
        assert fxguard._core._tracing_records() == 0
    """)


def test_fx_tracing_restores_on_exception_and_nests():
    run_without_torch("""
        try:
            with fxguard.fx_tracing():
                assert fxguard.is_fx_tracing()
                raise KeyError('boom')
        except KeyError:
            pass
        assert not fxguard.is_fx_tracing()
        with fxguard.fx_tracing(True):
            with fxguard.fx_tracing(False):
                assert not fxguard.is_fx_tracing() and not fxguard.is_fx_symbolic_tracing()
                with fxguard.fx_tracing(True):
                    assert fxguard.is_fx_tracing() and fxguard.is_fx_symbolic_tracing()
                assert not fxguard.is_fx_tracing()
            assert fxguard.is_fx_tracing()
        assert not fxguard.is_fx_tracing()
        cm = fxguard.fx_tracing()
        with cm:
            try:
                cm.__enter__()
                raise AssertionError('re-entering one fx_tracing object must fail')
            except RuntimeError:
                pass
        with cm:  # reusable once exited
            assert fxguard.is_fx_tracing()
        try:
            fxguard.fx_tracing().__exit__(None, None, None)
            raise AssertionError('exit without enter must fail')
        except RuntimeError:
            pass
        try:
            fxguard.fx_tracing(active=1, extra=2)
            raise AssertionError
        except TypeError:
            pass
    """)


def test_fx_tracing_takes_a_bool_or_an_int():
    """A bool or an int (__index__), as threading.Lock.acquire(blocking=) takes up
    to Python 3.11, on every Python: "yes" and [] are refused, not read as True."""
    run_without_torch("""
        for bad in ("yes", [], None, 1.0):
            for call in (lambda: fxguard.fx_tracing(bad), lambda: fxguard.fx_tracing(active=bad)):
                try:
                    call()
                    raise AssertionError(f"{bad!r} accepted")
                except TypeError as e:
                    assert "cannot be interpreted as an integer" in str(e), e
        for good, expected in ((True, True), (False, False), (1, True), (0, False), (2 ** 70, True)):
            with fxguard.fx_tracing(good):
                assert fxguard.is_fx_tracing() is expected
            assert not fxguard.is_fx_tracing()
    """)


@pytest.mark.parametrize("what", ["fx_tracing", "threads", "readers"])
def test_hundred_thousand_calls_do_not_grow_memory(what):
    run_without_torch(f"""
        import gc, tracemalloc
        def in_thread():
            with fxguard.fx_tracing():
                pass
        def loop(n):
            for _ in range(n):
                if {what!r} == 'fx_tracing':
                    with fxguard.fx_tracing():
                        fxguard.is_fx_tracing()
                elif {what!r} == 'threads':
                    if _ % 100 == 0:  # 1000 threads, each leaving a cell behind
                        t = threading.Thread(target=in_thread); t.start(); t.join()
                else:
                    fxguard.is_fx_tracing(); fxguard.is_fx_symbolic_tracing()
        loop(1000)  # warm caches
        gc.collect()
        blocks = sys.getallocatedblocks()
        tracemalloc.start()
        loop(100_000)
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        grown = sys.getallocatedblocks() - blocks
        assert current < 64 * 1024, current
        assert grown < 200, grown
    """)


def test_rlock_basics_without_torch():
    run_without_torch("""
        lock = fxguard.block_mask_lock
        assert isinstance(lock, fxguard.RLock)
        with lock:
            with lock:
                assert lock.stats()['depth'] == 2
        assert not lock.locked()
    """)


# The subinterpreter module: private, renamed in 3.13 (create() takes a config there).
SUBINTERPRETERS = {
    "_xxsubinterpreters": "interpreters.create(isolated=True)",
    "_interpreters": "interpreters.create('isolated')",
}


@pytest.mark.skipif(sys.version_info < (3, 12), reason="a GIL per interpreter: 3.12+")
def test_the_core_works_in_a_subinterpreter_with_its_own_gil():
    """module.c declares Py_MOD_PER_INTERPRETER_GIL_SUPPORTED: the core runs in
    an isolated interpreter (a GIL of its own).  In a child process, as every
    test here: creating a subinterpreter turns PyGILState_Check() off for the
    rest of the process, and torch's autograd engine then refuses every
    backward ("called while holding the GIL")."""
    import importlib.util
    name = next((n for n in SUBINTERPRETERS if importlib.util.find_spec(n)), None)
    if name is None:
        pytest.skip("no subinterpreter module in this Python")
    # The core alone, loaded from its file: the package imports hashlib, which
    # crashes the process at exit once an isolated subinterpreter used it
    # (CPython 3.12.1: "free(): invalid pointer"), fxguard or not.
    core = importlib.util.find_spec("fxguard._core").origin
    inner = textwrap.dedent(f"""
        import importlib.util, threading, time
        spec = importlib.util.spec_from_file_location("fxguard._core", {core!r})
        _core = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_core)
        with _core.fx_tracing():
            assert _core.is_fx_tracing()
        lock = _core.RLock()
        def contend():
            with lock:
                pass
        with lock:
            t = threading.Thread(target=contend)
            t.start()
            time.sleep(0.05)
        t.join()
        assert not _core.is_fx_tracing() and lock.stats()["contended"] == 1
        print("inner ran")
    """)
    outer = textwrap.dedent(f"""
        import {name} as interpreters
        interp = {SUBINTERPRETERS[name]}
        try:
            interpreters.run_string(interp, {inner!r})
        finally:
            interpreters.destroy(interp)
    """)
    proc = subprocess.run([sys.executable, "-c", outer], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "inner ran" in proc.stdout, proc.stdout + proc.stderr
