"""The C core without the GIL (free-threaded CPython, 3.13t): importing it keeps the
GIL off, and with the GIL off no lock-protected update is lost, the tracing count
comes back to 0, and the core stress (tests/core/stress.py) holds every invariant.

Skipped unless pytest itself runs on a free-threaded build.  Each test runs in a
fresh interpreter with PYTHON_GIL=0, so it measures the core even where something
imported first would have turned the GIL back on.  Before the core protected its
state, with PYTHON_GIL=0 on 2 cores the lock test lost 53 746 of its 400 000
increments, and the stress failed with lost updates, "cannot release
un-acquired lock", a tracing count left at 2 and RuntimeErrors from
threading.Condition (or hung).
"""
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"),
                                reason="needs a free-threaded CPython (3.13t)")

STRESS = Path(__file__).with_name("stress.py")


def run(args, gil=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    if gil is not None:
        env["PYTHON_GIL"] = gil
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def test_importing_the_core_keeps_the_gil_off():
    code, out = run(["-W", "error::RuntimeWarning", "-c",
                     "import sys, fxguard, fxguard._core; sys.exit(sys._is_gil_enabled())"])
    assert code == 0, out


def test_no_lock_protected_increment_is_lost_and_the_tracing_count_returns_to_zero():
    code, out = run(["-c", textwrap.dedent("""
        import sys, threading, fxguard
        from fxguard import _core
        assert not sys._is_gil_enabled()
        THREADS, ROUNDS = 8, 50_000
        lock, counter, start = fxguard.RLock(), [0], threading.Barrier(8)
        def work(n):
            start.wait()
            for i in range(ROUNDS):
                if i % 2:
                    with lock:
                        counter[0] += 1
                else:
                    lock.acquire()
                    with fxguard.fx_tracing():
                        counter[0] += 1
                    lock.release()
        threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
        for t in threads: t.start()
        for t in threads: t.join()
        lost = THREADS * ROUNDS - counter[0]
        print(f"{counter[0]} of {THREADS * ROUNDS}: {lost} lost")
        assert lost == 0
        assert _core._tracing_records() == 0 and not fxguard.is_fx_tracing()
        assert not lock.locked() and lock.stats()["acquisitions"] == THREADS * ROUNDS
    """)], gil="0")
    assert code == 0, out


def test_core_stress_without_the_gil():
    code, out = run([str(STRESS), "4", "6"], gil="0")
    assert code == 0 and "GIL off" in out and "0 errors" in out, out
