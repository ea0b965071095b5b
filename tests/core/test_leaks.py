"""Leaks in the C core, torch-free, each in a fresh interpreter: memory per thread after
20 000 short-lived threads that each trace and touch their record, and 10^6
fx_tracing()/RLock cycles.  (On torch: torch_support/test_torch_faults.py.)

Bounds: at most 16 traced bytes per thread (a thread's record, its slot values and
its thread-state dict are all freed with it: measured ~0, the bound leaves room for
allocator noise), and for 10^6 cycles fewer than 100 new memory blocks and under
1 MiB of RSS.
"""
import subprocess
import sys
import textwrap

import pytest


def run_fresh(body: str) -> str:
    code = "import sys, threading, fxguard\nfrom fxguard import _core\n" + textwrap.dedent(body) + \
        "\nassert 'torch' not in sys.modules\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_twenty_thousand_short_lived_tracing_threads_leave_nothing_behind():
    out = run_fresh("""
        import gc, tracemalloc
        _core._configure(_core.MODE_PATCHED, defaults=(None,), factories=(dict,))
        view = _core.SlotView({"meta": 0})
        def body():
            with fxguard.fx_tracing():
                view.meta["x"] = 1
                assert fxguard.is_fx_tracing()
        def churn(n):
            for _ in range(n):
                t = threading.Thread(target=body); t.start(); t.join()
        churn(500); gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        churn(20_000)
        fxguard.is_fx_tracing(); gc.collect()
        per_thread = (tracemalloc.get_traced_memory()[0] - before) / 20_000
        print(f"{per_thread:.2f} bytes per thread")
        assert per_thread < 16, per_thread
        assert _core._tracing_records() == 0
    """)
    print(out)


def test_a_million_fx_tracing_and_lock_cycles_do_not_grow():
    out = run_fresh("""
        import gc
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096
        lock = fxguard.RLock()
        def cycles(n):
            for _ in range(n):
                with fxguard.fx_tracing():
                    with lock:
                        pass
                lock.acquire(); lock.release()
        cycles(10_000); gc.collect()
        blocks, memory = sys.getallocatedblocks(), rss()
        cycles(1_000_000); gc.collect()
        grown_blocks, grown_rss = sys.getallocatedblocks() - blocks, rss() - memory
        print(f"blocks {grown_blocks:+d}, rss {grown_rss:+d} bytes")
        assert grown_blocks < 100 and grown_rss < 1 << 20, (grown_blocks, grown_rss)
        assert lock.stats()["acquisitions"] == 2 * 1_010_000 and not lock.locked()
    """)
    print(out)
