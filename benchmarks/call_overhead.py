"""Per-call cost of what torch calls on every step, stock vs fxguard, in one process.

Reported as ratios to the stock figure measured alongside (never as absolute
claims): is_fx_tracing(), is_fx_symbolic_tracing() through torch's own
function objects before and after install(), fxguard's C functions, the same
while another thread is tracing, and the block-mask lock's uncontended cycle
against threading.Lock and threading.RLock.

    python benchmarks/call_overhead.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import threading
import time
import timeit

import torch

import fxguard

N = 200_000
REPEATS = 7


def best_ns(stmt, number=N) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=REPEATS)) / number * 1e9


def lock_cycle(lock):
    def cycle():
        with lock:
            pass
    return cycle


def acquire_release(lock):
    acquire, release = lock.acquire, lock.release

    def cycle():
        acquire()
        release()
    return cycle


def measure() -> dict:
    st = torch.fx._symbolic_trace
    tracing, symbolic = st.is_fx_tracing, st.is_fx_symbolic_tracing  # the objects torch holds
    tracing()  # the once-only warning, out of the way
    fxguard.uninstall()
    r = {"stock is_fx_tracing": best_ns(tracing),
         "stock is_fx_symbolic_tracing": best_ns(symbolic)}
    fxguard.install()
    r["patched is_fx_tracing"] = best_ns(tracing)
    r["patched is_fx_symbolic_tracing"] = best_ns(symbolic)
    r["fxguard.is_fx_tracing (C)"] = best_ns(fxguard.is_fx_tracing)
    r["fxguard.is_fx_symbolic_tracing (C)"] = best_ns(fxguard.is_fx_symbolic_tracing)
    # While another thread traces, a thread with no cell of its own asks torch's
    # TLS (it could be an autograd worker acting for the tracer).
    inside, release = threading.Event(), threading.Event()

    def tracer():
        with fxguard.fx_tracing():
            inside.set()
            release.wait(120)

    t = threading.Thread(target=tracer)
    t.start()
    inside.wait(10)
    fresh = {}
    f = threading.Thread(target=lambda: fresh.update(v=best_ns(symbolic, N // 4)))
    f.start()
    f.join()
    r["patched is_fx_symbolic_tracing, other thread tracing, caller never traced"] = fresh["v"]
    with fxguard.fx_tracing(False):  # now this thread has a cell of its own
        r["patched is_fx_symbolic_tracing, other thread tracing, caller has a cell"] = best_ns(symbolic)
    release.set()
    t.join()
    fxguard.uninstall()
    r["threading.Lock with-cycle"] = best_ns(lock_cycle(threading.Lock()))
    r["threading.RLock with-cycle"] = best_ns(lock_cycle(threading.RLock()))
    r["fxguard.RLock with-cycle"] = best_ns(lock_cycle(fxguard.RLock()))
    r["threading.Lock acquire+release"] = best_ns(acquire_release(threading.Lock()))
    r["threading.RLock acquire+release"] = best_ns(acquire_release(threading.RLock()))
    r["fxguard.RLock acquire+release"] = best_ns(acquire_release(fxguard.RLock()))
    return r


RATIOS = {  # figure: baseline it is divided by
    "patched is_fx_tracing": "stock is_fx_tracing",
    "patched is_fx_symbolic_tracing": "stock is_fx_symbolic_tracing",
    "fxguard.is_fx_tracing (C)": "stock is_fx_tracing",
    "fxguard.is_fx_symbolic_tracing (C)": "stock is_fx_symbolic_tracing",
    "patched is_fx_symbolic_tracing, other thread tracing, caller never traced": "stock is_fx_symbolic_tracing",
    "patched is_fx_symbolic_tracing, other thread tracing, caller has a cell": "stock is_fx_symbolic_tracing",
    "fxguard.RLock with-cycle": "threading.Lock with-cycle",
    "threading.RLock with-cycle": "threading.Lock with-cycle",
    "fxguard.RLock acquire+release": "threading.Lock acquire+release",
    "threading.RLock acquire+release": "threading.Lock acquire+release",
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    ns = measure()
    info = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor(), "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    print(f"torch {info['torch']}  Python {info['python']}  {info['machine']}  {info['date']}")
    print(f"{'figure':<76} {'ns/call':>8} {'ratio':>7}  baseline")
    for name, value in ns.items():
        base = RATIOS.get(name)
        ratio = f"{value / ns[base]:.2f}x" if base else ""
        print(f"{name:<76} {value:8.1f} {ratio:>7}  {base or ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": info, "ns_per_call": ns,
                       "ratios": {k: ns[k] / ns[b] for k, b in RATIOS.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
