"""Does a warm thread keep stepping while another thread compiles?

One thread compiles fresh graphs (inductor); N-1 warm threads loop the
drafter step: eager ``create_block_mask`` + a compiled ``flex_attention``
forward, on a fixed shape.  Per mode (stock torch, one lock around every step
and compile, fxguard), each in a fresh process:

- ratio: warm steps/s during the compiles ÷ warm steps/s with no compile running;
- longest wait: the longest gap between two steps of one warm thread during
  the compiles, and the median step with no compile running;
- errors (exceptions in steps) and leaks (``torch.compiler.is_compiling()``
  True in a warm thread, which makes transformers pick uncompiled flex).

The GIL caps a warm thread while another compiles, stock torch included, so
fxguard is judged against stock's own ratio.  On a free-threaded Python the
children inherit ``PYTHON_GIL`` (``PYTHON_GIL=0``: the GIL off, although
triton's import would turn it on); each mode reports whether it ran with it.

    python benchmarks/compile_stall.py [--device cuda] [--threads 3] [--json out.json] [--save]

``--eager-flex``: the warm step calls ``flex_attention`` uncompiled (torch
wraps it in ``_set_compilation_env`` and a cached HOP compile), the path where
fxguard's config-window lock (torch <= 2.12) holds dynamo's compile_lock;
mode ``fxguard-nowindow`` is fxguard with ``config_window_lock=False``; --save writes
to results/compile_stall_eager_flex/.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import _harness

MODES = ("stock", "serialized", "fxguard")
OPTIONS = {"fxguard": {}, "fxguard-nowindow": {"config_window_lock": False}}


def child(mode: str, device: str, threads: int, compiles: int, solo_s: float, out: str,
          eager_flex: bool = False) -> None:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if mode in OPTIONS:
        import fxguard
        fxguard.install(**OPTIONS[mode])
    lock = threading.Lock() if mode == "serialized" else None
    seq = 256
    flex = flex_attention if eager_flex else torch.compile(flex_attention)
    q, k, v = (torch.randn(1, 4, seq, 64, device=device) for _ in range(3))

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def step() -> bool:
        block_mask = create_block_mask(causal, 1, 1, seq, seq, device=device)
        flex(q, k, v, block_mask=block_mask)
        if device == "cuda":
            torch.cuda.synchronize()
        return torch.compiler.is_compiling()

    step()  # compile flex once, before anything is timed
    stop = threading.Event()
    stamps: list[list[float]] = [[] for _ in range(threads - 1)]
    errors: list[str] = []
    leaks = [0]

    def warm(i: int) -> None:
        step()
        while not stop.is_set():
            try:
                if lock:
                    with lock:
                        leaked = step()
                else:
                    leaked = step()
                leaks[0] += leaked
            except Exception as e:  # every failure counts
                errors.append(_harness.error_kind(e))
            stamps[i].append(time.perf_counter())

    workers = [threading.Thread(target=warm, args=(i,), daemon=True) for i in range(threads - 1)]
    for t in workers:
        t.start()
    time.sleep(1.0)  # every warm thread is stepping
    solo = (time.perf_counter(), None)
    time.sleep(solo_s)
    window = [time.perf_counter(), None]
    solo = (solo[0], window[0])
    x = torch.randn(64, 64, device=device)
    compile_seconds = []
    for i in range(compiles):
        namespace: dict = {}
        exec(f"def fresh_{i}(x):\n    return (x.sin() * {i + 2}).cos() @ x + x.mean() * {i}", namespace)
        start = time.perf_counter()
        if lock:
            with lock:
                torch.compile(namespace[f"fresh_{i}"])(x)
        else:
            torch.compile(namespace[f"fresh_{i}"])(x)
        compile_seconds.append(time.perf_counter() - start)
    window[1] = time.perf_counter()
    stop.set()
    for t in workers:
        t.join(60)

    def rate(a: float, b: float) -> float:
        return sum(sum(a <= s < b for s in st) for st in stamps) / (b - a) / len(stamps)

    def gaps(a: float, b: float) -> list[float]:
        return [y - x for st in stamps for x, y in zip(st, st[1:]) if a <= y < b]

    solo_rate, stall_rate = rate(*solo), rate(*window)
    result = {
        "mode": mode, "solo_steps_per_s": round(solo_rate, 2), "stall_steps_per_s": round(stall_rate, 2),
        "ratio": round(stall_rate / solo_rate, 3) if solo_rate else None,
        "warm_steps_during_compiles": sum(sum(window[0] <= s < window[1] for s in st) for st in stamps),
        "median_step_s": round(statistics.median(gaps(*solo)), 5) if gaps(*solo) else None,
        "longest_wait_s": round(max(gaps(*window), default=window[1] - window[0]), 4),
        "compile_seconds": [round(s, 2) for s in compile_seconds],
        "errors": len(errors), "error_kinds": sorted(set(errors))[:5], "is_compiling_leaks": leaks[0],
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),  # at the end: triton may turn it on
    }
    with open(out, "w") as f:
        json.dump(result, f)


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    argv = ["--child", mode, "--device", args.device, "--threads", str(args.threads),
            "--compiles", str(args.compiles), "--solo", str(args.solo)]
    argv += ["--eager-flex"] if args.eager_flex else []
    result = _harness.in_fresh_process(__file__, argv, caches=("inductor",), timeout=args.timeout,
                                       env={"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "PYTHONUNBUFFERED": "1"})
    return dict(result, status="ok") if "status" not in result else {"mode": mode, **result}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="warm threads + the compiling one")
    p.add_argument("--compiles", type=int, default=4)
    p.add_argument("--solo", type=float, default=3.0, help="seconds measured with no compile running")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--eager-flex", action="store_true", help="warm steps call flex_attention uncompiled")
    _harness.add_output_options(p)
    p.add_argument("--child")
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        child(args.child, args.device, args.threads, args.compiles, args.solo, args.out, args.eager_flex)
        return 0
    report = {**_harness.envelope("compile_stall_eager_flex" if args.eager_flex else "compile_stall",
                                  import_torch=True),
              "args": {k: v for k, v in vars(args).items() if k not in ("child", "out", "json", "save")},
              "modes": {}}
    for mode in args.modes.split(","):
        report["modes"][mode] = r = run_mode(mode, args)
        print(json.dumps(r), flush=True)
    stock, ours = report["modes"].get("stock", {}), report["modes"].get("fxguard", {})
    if stock.get("ratio") and ours.get("ratio"):
        report["fxguard_ratio_vs_stock"] = round(ours["ratio"] / stock["ratio"], 3)
        print("fxguard ratio / stock ratio:", report["fxguard_ratio_vs_stock"])
    _harness.Output(args).write(report)
    return 0 if all(m.get("status") == "ok" for m in report["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
