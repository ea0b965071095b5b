"""Per-call cost of what torch calls on every step, stock vs fxguard, in one process.

Reported as ratios to the stock figure measured alongside (never as absolute
claims).  Two modes:

- torch (default): torch's own reader function objects (is_fx_symbolic_tracing,
  is_fx_tracing, is_compiling, get_current_meta) after install() and after
  uninstall(), each timed alongside a stock twin (the reader's stock code over
  a copy of its module's globals, taken before install()); fxguard's C
  readers; the same while another thread is tracing; the block-mask lock's
  uncontended cycle against threading.Lock.
- ``--mechanism``: no torch.  The same machinery (per_thread_globals.Planner,
  the C Reader, originals) applied to plain one-line readers of a throwaway module,
  so the *mechanism* can be measured on Pythons without a torch wheel.  These
  are not torch figures.

    python benchmarks/call_overhead.py [--mechanism] [--json out.json] [--save]

(--save: results/call_overhead/, or results/call_overhead_mechanism/ with --mechanism.)
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import itertools
import os
import shutil
import sys
import tempfile
import threading
import timeit
import types

import _harness
import fxguard
from fxguard import _core
from fxguard.machinery import originals
from fxguard.machinery.per_thread_globals import FastReader, PerThread, Planner

N = 20_000
REPEATS = 40  # best of many short runs; figures that are compared run interleaved (a busy machine drifts)


def best_ns(*fns, number=N) -> list[float]:
    """Each fn called from a Python call site (timeit's loop, which CPython
    specialises), the fns taking turns; best ns per call of each."""
    best = [float("inf")] * len(fns)
    for _ in range(REPEATS):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], timeit.timeit(fn, number=number) / number * 1e9)
    return best


def from_c(fn, number=N):
    """A loop that calls fn from C: iter(fn, sentinel) calls it on each step."""
    def run():
        for _ in itertools.islice(iter(fn, Ellipsis), number):
            pass
    return run


def best_ns_from_c(*fns) -> list[float]:
    return [t / N for t in best_ns(*[from_c(fn) for fn in fns], number=1)]


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


COPIES = 4  # threading's locks: the best of several objects (see measure_locks)


def measure_locks(r: dict) -> None:
    """An OS lock's cost depends on where its semaphore landed in memory: on the
    2-core VM one threading.Lock object cycles in 170 ns, another of the same
    process in 900.  Each threading figure is the best of COPIES objects, so the
    ratios are against stock's best case."""
    kinds = {"threading.Lock": [threading.Lock() for _ in range(COPIES)],
             "threading.RLock": [threading.RLock() for _ in range(COPIES)],
             "fxguard.block_mask_lock": [fxguard.block_mask_lock]}
    for label, cycle in (("with-cycle", lock_cycle), ("acquire+release", acquire_release)):
        locks = [(name, lock) for name, objs in kinds.items() for lock in objs]
        for (name, _), ns in zip(locks, best_ns(*[cycle(lock) for _, lock in locks])):
            key = f"{name} {label}"
            r[key] = min(r.get(key, ns), ns)


LOCK_RATIOS = {
    "fxguard.block_mask_lock with-cycle": "threading.Lock with-cycle",
    "threading.RLock with-cycle": "threading.Lock with-cycle",
    "fxguard.block_mask_lock acquire+release": "threading.Lock acquire+release",
    "threading.RLock acquire+release": "threading.Lock acquire+release",
}


# -- torch -------------------------------------------------------------------------

def stock_twin(fn):
    """fn's stock code over a copy of its module's globals, taken before install():
    stock torch's reader, which can be timed alongside the patched one."""
    twin = types.FunctionType(fn.__code__, dict(fn.__globals__), fn.__name__, fn.__defaults__,
                              fn.__closure__)
    twin.__kwdefaults__ = fn.__kwdefaults__
    return twin


def measure_torch() -> dict:
    import torch
    st, tb = torch.fx._symbolic_trace, torch.fx.traceback
    readers = {"is_fx_tracing": st.is_fx_tracing, "is_fx_symbolic_tracing": st.is_fx_symbolic_tracing,
               "is_compiling": torch.compiler.is_compiling,
               "get_current_meta": tb.get_current_meta}  # the objects torch holds
    st.is_fx_tracing()  # the once-only warning, out of the way
    fxguard.uninstall()
    twins = {name: stock_twin(fn) for name, fn in readers.items()}
    c_readers = {"fxguard.is_fx_tracing (C)": fxguard.is_fx_tracing,
                 "fxguard.is_fx_symbolic_tracing (C)": fxguard.is_fx_symbolic_tracing}
    r: dict[str, float] = {}

    def keep_best(names, values):
        for name, value in zip(names, values):
            r[name] = min(r.get(name, value), value)

    # Every ratio divides by the stock twin timed in the same interleaved loop.
    stock_names = [f"stock {n}" for n in readers]
    for _ in range(ROUNDS):
        fxguard.install()
        keep_best(stock_names + [f"patched {n}" for n in readers] + list(c_readers),
                  best_ns(*twins.values(), *readers.values(), *c_readers.values()))
        fxguard.uninstall()
        keep_best([f"{n} (stock twin, uninstalled)" for n in readers] +
                  [f"stock {n} after uninstall" for n in readers],
                  best_ns(*twins.values(), *readers.values()))
    fxguard.install()
    symbolic, twin = readers["is_fx_symbolic_tracing"], twins["is_fx_symbolic_tracing"]
    # While another thread traces, a thread's first read gives it a record (it
    # asks once whether it is an autograd worker acting for the tracer).
    inside, release = threading.Event(), threading.Event()

    def tracer():
        with fxguard.fx_tracing():
            inside.set()
            release.wait(120)

    t = threading.Thread(target=tracer)
    t.start()
    inside.wait(10)
    fresh = {}
    f = threading.Thread(target=lambda: fresh.update(v=best_ns(twin, symbolic, number=N // 4)))
    f.start()
    f.join()
    r["is_fx_symbolic_tracing (stock twin), other thread tracing, caller never traced"], \
        r["patched is_fx_symbolic_tracing, other thread tracing, caller never traced"] = fresh["v"]
    with fxguard.fx_tracing(False):  # now this thread has a record of its own
        r["is_fx_symbolic_tracing (stock twin), other thread tracing, caller has a record"], \
            r["patched is_fx_symbolic_tracing, other thread tracing, caller has a record"] = \
            best_ns(twin, symbolic)
    release.set()
    t.join()
    fxguard.uninstall()
    measure_locks(r)
    return r


ROUNDS = 3
TORCH_READERS = ("is_fx_tracing", "is_fx_symbolic_tracing", "is_compiling", "get_current_meta")
TORCH_RATIOS = {
    **{f"patched {n}": f"stock {n}" for n in TORCH_READERS},
    **{f"stock {n} after uninstall": f"{n} (stock twin, uninstalled)" for n in TORCH_READERS},
    "fxguard.is_fx_tracing (C)": "stock is_fx_tracing",
    "fxguard.is_fx_symbolic_tracing (C)": "stock is_fx_symbolic_tracing",
    **{f"patched is_fx_symbolic_tracing, other thread tracing, caller {c}":
       f"is_fx_symbolic_tracing (stock twin), other thread tracing, caller {c}"
       for c in ("never traced", "has a record")},
    **LOCK_RATIOS,
}


# -- mechanism (no torch) ------------------------------------------------------------

TARGET = '''\
flag = False
value = None
other = None


def is_compiling():
    return False


def is_symbolic():  # the shape of torch's is_fx_symbolic_tracing
    return flag and not is_compiling()


def get_value():    # served by a C Reader once patched
    return value


def get_other():    # rewritten code only (reads through the SlotView)
    return other
'''


def load_target(name: str):
    """A fresh module from TARGET's source (the rewrite needs a file)."""
    folder = tempfile.mkdtemp(prefix="fxguard_mechanism_")
    atexit.register(shutil.rmtree, folder, True)
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(TARGET)
    sys.path.insert(0, folder)
    return importlib.import_module(name)


def patch_mechanism(module) -> None:
    planner = Planner()
    planner.add(PerThread(module.__name__, "value", None, readers=(FastReader("get_value"),)))
    planner.add(PerThread(module.__name__, "other", None))
    for change in planner.changes("mechanism"):
        originals.apply(change)
    defaults, factories = planner.defaults()
    _core._configure(_core.MODE_PATCHED, defaults=defaults, factories=factories)


def unpatch_mechanism() -> None:
    originals.revert_all()
    _core._configure(_core.MODE_OFF)


def measure_mechanism() -> dict:
    m = load_target("fxguard_mechanism_target")
    twin = load_target("fxguard_mechanism_twin")  # never patched: stock, measured alongside
    patch_mechanism(m)
    r = {}
    r["stock reader"], r["fast reader (C Reader)"] = best_ns(twin.get_value, m.get_value)
    r["stock reader, called from C"], r["fast reader, called from C"] = \
        best_ns_from_c(twin.get_value, m.get_value)
    r["stock reader, other"], r["rewritten reader (SlotView, no Reader)"] = \
        best_ns(twin.get_other, m.get_other)
    r["stock is_symbolic (Python)"], r["fxguard.is_fx_symbolic_tracing (C)"] = \
        best_ns(twin.is_symbolic, fxguard.is_fx_symbolic_tracing)
    unpatch_mechanism()
    r["stock reader (twin)"], r["stock reader after unpatch"] = best_ns(twin.get_value, m.get_value)
    measure_locks(r)
    return r


MECHANISM_RATIOS = {
    "fast reader (C Reader)": "stock reader",
    "fast reader, called from C": "stock reader, called from C",
    "rewritten reader (SlotView, no Reader)": "stock reader, other",
    "fxguard.is_fx_symbolic_tracing (C)": "stock is_symbolic (Python)",
    "stock reader after unpatch": "stock reader (twin)",
    **LOCK_RATIOS,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mechanism", action="store_true",
                   help="no torch: the machinery on plain readers (not torch figures)")
    _harness.add_output_options(p)
    args = p.parse_args()
    if args.mechanism:
        ns, ratios = measure_mechanism(), MECHANISM_RATIOS
    else:
        ns, ratios = measure_torch(), TORCH_RATIOS  # imports torch: the envelope reads its version
    report = {**_harness.envelope("call_overhead_mechanism" if args.mechanism else "call_overhead"),
              "mode": "mechanism (no torch)" if args.mechanism else "torch",
              "vectorcall_readers": bool(_core.VECTORCALL_READERS), "ns_per_call": ns,
              "ratios": {k: ns[k] / ns[b] for k, b in ratios.items()}}
    _harness.print_figures(report, baselines=ratios)
    _harness.Output(args).write(report)


if __name__ == "__main__":
    main()
