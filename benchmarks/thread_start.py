"""Cost of Thread.start() + join() with and without fxguard's config_follows_thread, in one process.

Each round times N start+join of a thread that does nothing, stock (not
installed) and with fxguard.install(), back to back in alternating order, so
drift and other work on the machine hit both alike; a gc.collect() before
each round keeps install()'s garbage out of the timings.  Reported: the median
round of each, in microseconds, and the ratio fxguard/stock as the median of
the rounds' paired ratios (goal: <= 1.2).  Two cases: the starting thread has no torch config
overrides, and it has 12 (11 scalars and a list, which each thread gets its
own copy of; a compile leaves a handful).  Prints one JSON line.

    python benchmarks/thread_start.py [--n 200] [--rounds 41] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time

import torch._dynamo.config as dyn
import torch._inductor.config as ind

import _harness
import fxguard


def noop() -> None:
    pass


def one_round(n: int) -> float:
    """Microseconds per start()+join()."""
    start = time.perf_counter()
    _harness.start_and_join(noop, n)
    return (time.perf_counter() - start) / n * 1e6


@contextlib.contextmanager
def overrides():
    """12 overrides in this thread, undone afterwards."""
    with dyn.patch(recompile_limit=64, accumulated_recompile_limit=512, capture_scalar_outputs=True,
                   capture_dynamic_output_shape_ops=True, assume_static_by_default=False,
                   automatic_dynamic_shapes=False, suppress_errors=True, verbose=True,
                   optimize_ddp=False), \
            ind.patch(max_autotune=True, _fuse_ddp_bucket_size=30,
                      custom_should_partition_ops=["aten::mm", "aten::bmm"]):
        yield


def measure(n: int, rounds: int) -> dict:
    results = {}
    for case, ctx in (("no overrides", contextlib.nullcontext), ("12 overrides", overrides)):
        times: dict[str, list[float]] = {"stock": [], "fxguard": []}
        with ctx():
            overrides_now = len(fxguard.config_snapshot())
            one_round(n // 5)  # warm-up
            for r in range(rounds):
                for mode in (("stock", "fxguard") if r % 2 == 0 else ("fxguard", "stock")):
                    if mode == "fxguard":
                        status = fxguard.install()
                        row = next(p for p in status["patch_points"] if p["what"] == "config follows thread")
                        assert row["patched"], row
                    else:
                        fxguard.uninstall()
                    gc.collect()  # install()'s own garbage must not be collected inside a round
                    times[mode].append(one_round(n))
            fxguard.uninstall()
        stock, patched = statistics.median(times["stock"]), statistics.median(times["fxguard"])
        ratio = statistics.median(f / s for f, s in zip(times["fxguard"], times["stock"]))
        results[case] = {"config_overrides_in_starter": overrides_now, "stock_us": round(stock, 2),
                         "fxguard_us": round(patched, 2), "ratio": round(ratio, 3),
                         "stock_us_rounds": [round(t, 1) for t in times["stock"]],
                         "fxguard_us_rounds": [round(t, 1) for t in times["fxguard"]]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="start+join per round and mode")
    parser.add_argument("--rounds", type=int, default=41)
    _harness.add_output_options(parser)
    args = parser.parse_args()
    results = measure(args.n, args.rounds)
    report = {**_harness.envelope("thread_start"), "n_per_round": args.n, "rounds": args.rounds,
              "goal_ratio": 1.2, "results": results}
    _harness.Output(args).write(report, echo=True)


if __name__ == "__main__":
    main()
