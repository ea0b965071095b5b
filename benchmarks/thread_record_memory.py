"""Memory left behind per short-lived thread, and by 10^6 enter/exit and lock cycles.

With fxguard installed, N threads are started and joined one after another; each
either enters fx_tracing() and reads a per-thread global (`fx_tracing`), or runs a
real torch.fx.symbolic_trace of a small module (`symbolic_trace`, N/20 threads).
Reported per case: traced bytes per thread (tracemalloc, after gc) and RSS bytes
per thread, for stock torch (not installed) and fxguard, in one process.  On torch
2.11, whose _stash_obj_in_tls keeps each thread's record without a reference, this
is where fxguard's kept records would show (before they were freed: ~270 B/thread).
Then 10^6 cycles of `with fx_tracing(): with lock: pass` + acquire/release: growth
of allocated blocks and RSS.  Prints one JSON line.

    python benchmarks/thread_record_memory.py [--threads 20000] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc

import torch

import _harness
from _harness import rss_bytes, start_and_join
import fxguard
from fxguard import _core


class Small(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def fx_tracing_body() -> None:
    with fxguard.fx_tracing():
        torch.compiler.is_compiling()  # a per-thread global, read from the record


def symbolic_trace_body() -> None:
    torch.fx.symbolic_trace(Small())


def per_thread(body, n: int) -> dict:
    start_and_join(body, max(n // 40, 10))  # warm-up: caches, lazy imports
    gc.collect()
    tracemalloc.start()
    before, rss_before, start = tracemalloc.get_traced_memory()[0], rss_bytes(), time.perf_counter()
    start_and_join(body, n)
    seconds = time.perf_counter() - start
    time.sleep(0.1)           # torch 2.11 drops its reference in the thread's C++ exit code
    fxguard.is_fx_tracing()   # the core's one-entry cache moves off the last dead thread
    _core._tracing_records()  # lets go of what torch no longer holds
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {"threads": n, "traced_bytes_per_thread": round(traced / n, 2),
            "rss_bytes_per_thread": round((rss_bytes() - rss_before) / n, 1),
            "seconds": round(seconds, 2)}


def cycles(n: int) -> dict:
    lock = fxguard.RLock()

    def run(k):
        for _ in range(k):
            with fxguard.fx_tracing():
                with lock:
                    pass
            lock.acquire()
            lock.release()

    run(10_000)
    gc.collect()
    blocks, memory, start = sys.getallocatedblocks(), rss_bytes(), time.perf_counter()
    run(n)
    seconds = time.perf_counter() - start
    gc.collect()
    return {"cycles": n, "blocks_grown": sys.getallocatedblocks() - blocks,
            "rss_grown_bytes": rss_bytes() - memory, "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=1_000_000)
    _harness.add_output_options(parser)
    args = parser.parse_args()
    results: dict = {}
    for mode in ("stock", "fxguard"):
        if mode == "fxguard":
            status = fxguard.install()
            results["mode"], results["stash_steals"] = status["mode"], _core._stash_steals()
        results[mode] = {"fx_tracing": per_thread(fx_tracing_body, args.threads),
                         "symbolic_trace": per_thread(symbolic_trace_body, args.threads // 20)}
    results["fxguard"]["cycles"] = cycles(args.cycles)
    fxguard.uninstall()
    _harness.Output(args).write({**_harness.envelope("thread_record_memory"), "results": results},
                                echo=True)


if __name__ == "__main__":
    main()
