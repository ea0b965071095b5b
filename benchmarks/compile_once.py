"""Compile once: time until every thread has stepped, and graphs compiled.

Three workers step through the same sequence lengths with one shared compiled
MLP and one shared compiled flex_attention (forward; CPU flex_attention has no
backward), each with its own weights and inputs, released together from a
barrier once everything but the compiles is ready.  Each mode runs in a fresh
process with a fresh inductor cache (cold compiles; the processes of
``processes`` share one, as processes on one machine do):

  processes            3 processes x 1 thread, stock torch
  threads              3 threads, stock torch (each thread compiles a copy)
  fxguard-no-share     3 threads, fxguard.install(compile_once=False)
  fxguard              3 threads, fxguard.install() (compile once on)
  one-lock             3 threads, one process-wide lock around each whole step

    python benchmarks/compile_once.py --save                 # all modes, CPU
    python benchmarks/compile_once.py --device cuda --save

Reported: per mode the first step of each worker, the time until every worker
has stepped, until every worker is through every length, and dynamo's graph
count (``unique_graphs``, summed over processes); ratios to ``processes`` and to
``one-lock`` within each round (modes run interleaved, ``--repeat`` rounds), and
their median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import _harness

MODES = ("processes", "threads", "fxguard-no-share", "fxguard", "one-lock")
SIZES = {"cpu": dict(dim=64, heads=4, batch=2, seq_lens=(128, 256)),
         "cuda": dict(dim=512, heads=8, batch=4, seq_lens=(1024, 2048, 4096))}


def build(torch, device: str, size: dict):
    """Shared compiled functions, and the block masks (made before the clock runs)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mlp(x, w1, b1, w2, b2):
        return torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2

    compiled_mlp = torch.compile(mlp, dynamic=False)
    compiled_flex = torch.compile(flex_attention, dynamic=False)

    def causal(b, h, q, kv):
        return q >= kv
    masks = {s: create_block_mask(causal, None, None, s, s, device=device)
             for s in size["seq_lens"]}
    return compiled_mlp, compiled_flex, masks


def make_worker(torch, device: str, size: dict, seed: int):
    """One worker's weights and its step for a sequence length."""
    dim, heads, batch = size["dim"], size["heads"], size["batch"]
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(device)
    weights = dict(w1=w(dim, 4 * dim), b1=w(4 * dim), w2=w(4 * dim, dim), b2=w(dim),
                   wqkv=w(dim, 3 * dim))
    inputs = {s: torch.randn(batch, s, dim, generator=g).to(device) for s in size["seq_lens"]}

    def step(compiled_mlp, compiled_flex, masks, s):
        with torch.no_grad():
            x = inputs[s]
            h = compiled_mlp(x, weights["w1"], weights["b1"], weights["w2"], weights["b2"])
            qkv = (h @ weights["wqkv"]).view(batch, s, 3, heads, dim // heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            out = compiled_flex(q, k, v, block_mask=masks[s])
            return float(out.float().sum())
    return step


def graphs(torch) -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def run_threads(args, mode: str) -> dict:
    import torch
    size = SIZES[args.device]
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # torch 2.11 CPU wheels
    fxguard = None
    if mode.startswith("fxguard"):
        import fxguard
        fxguard.install(compile_once=mode == "fxguard")
    compiled_mlp, compiled_flex, masks = build(torch, args.device, size)
    steps = [make_worker(torch, args.device, size, seed) for seed in range(args.workers)]
    before = graphs(torch)
    step_lock = threading.Lock() if mode == "one-lock" else None
    barrier = threading.Barrier(args.workers + 1)
    first, done, errors = [None] * args.workers, [None] * args.workers, []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            for n, s in enumerate(size["seq_lens"]):
                if step_lock is not None:
                    with step_lock:
                        steps[i](compiled_mlp, compiled_flex, masks, s)
                else:
                    steps[i](compiled_mlp, compiled_flex, masks, s)
                if n == 0:
                    first[i] = time.perf_counter() - start
            done[i] = time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 - reported
            errors.append(f"{type(e).__name__}: {str(e)[:300]}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.workers)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    shared = fxguard and fxguard.status()["compile_once"]
    return {"first_step_s": first, "all_lengths_s": done, "graphs": graphs(torch) - before,
            "compiles_avoided": shared["compiles_avoided"] if shared else None, "errors": errors}


def process_worker(args, ready, go, out) -> None:
    import torch
    size = SIZES[args.device]
    compiled_mlp, compiled_flex, masks = build(torch, args.device, size)
    step = make_worker(torch, args.device, size, args.seed)
    before = graphs(torch)
    ready.put(1)
    go.wait()
    start = time.perf_counter()
    first, error = None, None
    try:
        for n, s in enumerate(size["seq_lens"]):
            step(compiled_mlp, compiled_flex, masks, s)
            if n == 0:
                first = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - reported
        error = f"{type(e).__name__}: {str(e)[:300]}"
    out.put((args.seed, first, time.perf_counter() - start, graphs(torch) - before, error))


def run_processes(args) -> dict:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = []
    for i in range(args.workers):
        worker_args = argparse.Namespace(**{**vars(args), "seed": i})
        procs.append(ctx.Process(target=process_worker, args=(worker_args, ready, go, out)))
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=args.timeout)
    go.set()
    results = sorted(out.get(timeout=args.timeout) for _ in procs)
    for p in procs:
        p.join()
    return {"first_step_s": [r[1] for r in results], "all_lengths_s": [r[2] for r in results],
            "graphs": sum(r[3] for r in results), "graphs_per_process": [r[3] for r in results],
            "compiles_avoided": None, "errors": [r[4] for r in results if r[4]]}


def child(args) -> None:
    result = run_processes(args) if args.mode == "processes" else run_threads(args, args.mode)
    with open(args.out, "w") as f:
        json.dump(result, f)


def summarize(result: dict) -> dict:
    ok = [t for t in result["first_step_s"] if t is not None]
    result["all_stepped_s"] = max(ok) if len(ok) == len(result["first_step_s"]) else None
    done = [t for t in result["all_lengths_s"] if t is not None]
    result["all_through_s"] = max(done) if len(done) == len(result["all_lengths_s"]) else None
    return result


def run_mode(args, mode: str) -> dict:
    """One mode in a fresh process with fresh inductor and triton caches."""
    began = time.perf_counter()
    result = _harness.in_fresh_process(__file__, [
        "--mode", mode, "--device", args.device, "--workers", str(args.workers),
        "--timeout", str(args.timeout)], timeout=args.timeout)
    if "first_step_s" in result:
        result = {**summarize(result), "status": "ok"}
    result["process_wall_s"] = time.perf_counter() - began
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=sorted(SIZES))
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds over the modes (interleaved); medians are reported")
    _harness.add_output_options(parser)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        return child(args)
    report = {**_harness.envelope("compile_once", import_torch=True),
              "settings": {"device": args.device, "workers": args.workers,
                           "repeat": args.repeat, **SIZES[args.device]}, "modes": {}}
    samples: dict[str, list] = {}
    for round_ in range(args.repeat):
        for mode in args.modes.split(","):
            result = run_mode(args, mode)
            samples.setdefault(mode, []).append(result)
            print(f"{round_} {mode:22s} " + json.dumps({k: result.get(k) for k in (
                "status", "all_stepped_s", "all_through_s", "graphs", "compiles_avoided",
                "errors")}), flush=True)
    for mode, runs in samples.items():
        ok = [r for r in runs if r["status"] == "ok"]
        report["modes"][mode] = {
            "samples": runs,
            **{key: statistics.median(r[key] for r in ok) if ok and all(r.get(key) for r in ok)
               else None for key in ("all_stepped_s", "all_through_s")},
            "graphs": [r.get("graphs") for r in runs]}
    ratios: dict = {}  # per round (same minutes, same load), then the median over rounds
    for base in ("processes", "one-lock"):
        for mode, runs in samples.items():
            for key in ("all_stepped_s", "all_through_s"):
                per_round = [r[key] / b[key] for r, b in zip(runs, samples.get(base, []))
                             if r.get(key) and b.get(key)]
                if per_round:
                    ratios.setdefault(f"vs {base}", {}).setdefault(mode, {})[key] = {
                        "median": round(statistics.median(per_round), 3),
                        "rounds": [round(x, 3) for x in per_round]}
    report["ratios"] = ratios
    print(json.dumps(ratios, indent=1))
    _harness.Output(args).write(report)


if __name__ == "__main__":
    main()
