"""N threads compile distinct graphs: fxguard's concurrent_compiles on vs off vs N processes.

Each thread compiles a graph of its own (inductor) and runs it once; the figure
is the wall time until every thread has run its graph.  Thread i's graph, new
every round (new shapes and constants, so no cache of a previous round
answers): 0 flex_attention with an eager create_block_mask, 1 an MLP with
backward, 2 a norm + softmax, then again from 0.

- warm (one process, alternating rounds): fxguard installed with
  ``concurrent_compiles=True`` ("on") or without ("off": dynamo's compile_lock
  serialises the compiles), one-time set-up done before the first round;
  ratio on ÷ off per pair of rounds, and the median.
- processes: N warm processes, each compiling one thread's graph of the same
  round at once (no GIL or lock shared); ratio ÷ off.
- cold (``--cold``): each way once in a fresh process with empty caches
  (first compiles: inductor's one-time set-up included).

Every result is checked against eager; errors are counted.

    python benchmarks/concurrent_compiles.py [--device cuda] [--threads 3] [--rounds 4] [--cold] [--json F] [--save]

``--device cuda``: the graphs' tensors on the GPU (one GPU for all threads: the
graphs are still distinct, as one GPU per drafter makes them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import _harness

ENV = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
DEVICE_ENV = "FXGUARD_BENCH_DEVICE"  # children inherit --device through it


def device() -> str:
    return os.environ.get(DEVICE_ENV, "cpu")


# -- the graphs ------------------------------------------------------------------------

def flex_graph(r: int):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    size, scale = 64 + 16 * r, 1.0 + r / 100

    def causal(b, h, q, kv):
        return q >= kv

    q, k, v = (torch.randn(1, 2, size, 16, device=device()) for _ in range(3))

    def work():
        mask = create_block_mask(causal, 1, 2, size, size, device=device())
        return torch.compile(flex_attention)(q * scale, k, v, block_mask=mask)

    def ref():
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mask = create_block_mask(causal, 1, 2, size, size, device=device())
            return flex_attention(q * scale, k, v, block_mask=mask)
    return work, ref


def mlp_graph(r: int):
    import torch

    class MLP(torch.nn.Module):
        # Not an nn.Sequential: torch compiles a module whose forward is torch's
        # own through one wrapper code, shared with the norm graph's on torch
        # 2.11, where compile once's per-code wait would queue the two.
        def __init__(self, width: int):
            super().__init__()
            self.inner, self.outer = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

        def forward(self, x):
            return self.outer(torch.nn.functional.gelu(self.inner(x)))

    width = 32 + 8 * r
    net = MLP(width).to(device())
    x = torch.randn(16, width, device=device(), requires_grad=True)

    def work():
        out = torch.compile(net)(x)
        out.sum().backward()
        return out

    return work, lambda: net(x)


def norm_graph(r: int):
    # A closure, not exec'd code: torch 2.11 compiles a function without source
    # through that shared wrapper code too.
    import torch
    scale = 1 + r / 10

    def f(x):
        y = torch.nn.functional.layer_norm(x, x.shape[-1:]) * scale
        return torch.softmax(y @ y.transpose(-1, -2), dim=-1) + r

    x = torch.randn(4, 24 + 4 * r, 32, device=device())
    return (lambda: torch.compile(f)(x)), (lambda: f(x))


GRAPHS = (flex_graph, mlp_graph, norm_graph)


def graph(i: int, r: int):
    return GRAPHS[i % len(GRAPHS)](r)


def run_round(threads: int, r: int) -> dict:
    """Every thread compiles and runs its graph; wall until all have.  Dynamo's
    caches are reset first (outside the time): the threads' functions are the
    same code objects every round, and new shapes would reach recompile_limit."""
    import torch
    torch._dynamo.reset()
    made = [graph(i, r) for i in range(threads)]
    errors: list[str] = []
    wrong = [0]
    start = threading.Barrier(threads + 1)

    def thread(i: int) -> None:
        work, ref = made[i]
        start.wait()
        try:
            out = work()
            if not torch.allclose(out, ref(), atol=1e-4, rtol=1e-4):
                wrong[0] += 1
        except Exception as e:  # every failure counts
            errors.append(_harness.error_kind(e))

    workers = [threading.Thread(target=thread, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in workers:
        t.join()
    return {"wall_s": time.perf_counter() - began, "errors": errors, "wrong": wrong[0]}


def warm_up(kinds=range(len(GRAPHS))) -> None:
    """One-time set-up (patterns, codegen backends, the builtin map) and a first
    compile of each kind, one after another on this thread, outside what is timed."""
    for i in kinds:
        work, _ = graph(i, 99)
        work()


# -- warm, one process ---------------------------------------------------------------

def warm(threads: int, rounds: int) -> dict:
    import fxguard
    fxguard.install()
    warm_up()
    walls: dict[str, list[float]] = {"on": [], "off": []}
    errors, wrong = [], 0
    for r in range(rounds):
        for way in (("on", "off") if r % 2 == 0 else ("off", "on")):  # alternate: cancel drift
            fxguard.install(concurrent_compiles=(way == "on"))
            result = run_round(threads, 2 * r + (way == "on"))
            walls[way].append(result["wall_s"])
            errors += result["errors"]
            wrong += result["wrong"]
            print(f"round {r} {way}: {result['wall_s']:.2f} s", file=sys.stderr, flush=True)
    fxguard.uninstall()
    ratios = [a / b for a, b in zip(walls["on"], walls["off"])]
    return {"wall_s": {k: [round(w, 3) for w in v] for k, v in walls.items()},
            "ratio_on_vs_off": [round(x, 3) for x in ratios],
            "median_ratio_on_vs_off": round(statistics.median(ratios), 3),
            "errors": len(errors), "error_kinds": sorted(set(errors))[:5], "wrong_results": wrong}


# -- N processes ---------------------------------------------------------------------

def process_child(index: int, rounds: int) -> None:
    """One process of --processes: warm up, then per round compile graph
    ``index`` when told (a line on stdin), say "done WALL" after."""
    import torch
    warm_up([index % len(GRAPHS)])
    print("ready", flush=True)
    for r in range(rounds):
        torch._dynamo.reset()
        work, ref = graph(index, 2 * r)
        sys.stdin.readline()
        began = time.perf_counter()
        ok = True
        try:
            ok = bool(torch.allclose(work(), ref(), atol=1e-4, rtol=1e-4))
        except Exception as e:  # noqa: BLE001
            ok = _harness.error_kind(e)
        print(f"done {time.perf_counter() - began} {json.dumps(ok)}", flush=True)


def fresh_dir() -> str:
    """An empty inductor cache directory, removed when this process exits."""
    import atexit
    import shutil
    import tempfile
    path = tempfile.mkdtemp(prefix="fxguard-bench-inductor-")
    atexit.register(shutil.rmtree, path, True)
    return path


def processes(threads: int, rounds: int) -> dict:
    children = [subprocess.Popen([sys.executable, __file__, "--process-child", str(i),
                                  "--rounds", str(rounds)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, **ENV, PYTHONUNBUFFERED="1",
                                          TORCHINDUCTOR_CACHE_DIR=fresh_dir()))
                for i in range(threads)]
    for c in children:
        assert c.stdout.readline().strip() == "ready"
    walls, problems = [], []
    for _ in range(rounds):
        began = time.perf_counter()
        for c in children:
            c.stdin.write("go\n")
            c.stdin.flush()
        for c in children:
            _, _, ok = c.stdout.readline().split(" ", 2)
            if json.loads(ok) is not True:
                problems.append(json.loads(ok))
        walls.append(time.perf_counter() - began)
    for c in children:
        c.wait(60)
    return {"wall_s": [round(w, 3) for w in walls], "problems": problems}


# -- cold, fresh processes ------------------------------------------------------------

def cold_child(way: str, threads: int, out: str) -> None:
    import fxguard
    if way != "stock":
        fxguard.install(concurrent_compiles=(way == "on"))
    result = run_round(threads, 0)
    with open(out, "w") as f:
        json.dump({"wall_s": round(result["wall_s"], 3), "errors": result["errors"],
                   "wrong": result["wrong"]}, f)


def cold(threads: int) -> dict:
    found = {}
    for way in ("off", "on"):
        found[way] = _harness.in_fresh_process(__file__, ["--cold-child", way, "--threads",
                                                          str(threads)], caches=("inductor",),
                                               env=ENV, timeout=1800)
        print(f"cold {way}: {found[way]}", file=sys.stderr, flush=True)
    if all("wall_s" in found[w] for w in ("on", "off")):
        found["ratio_on_vs_off"] = round(found["on"]["wall_s"] / found["off"]["wall_s"], 3)
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4, help="warm rounds per way")
    p.add_argument("--cold", action="store_true", help="also each way once in a fresh process")
    _harness.add_output_options(p)
    p.add_argument("--process-child", type=int)
    p.add_argument("--cold-child")
    p.add_argument("--out")
    args = p.parse_args()
    os.environ.update(ENV)
    if args.process_child is None and not args.cold_child:
        os.environ[DEVICE_ENV] = args.device
        # Empty kernel caches for this run (children get their own): every
        # round's new shapes then compile C++ as a drafter's new length does,
        # instead of finding last run's kernels on disk.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir()
    if args.process_child is not None:
        process_child(args.process_child, args.rounds)
        return 0
    if args.cold_child:
        cold_child(args.cold_child, args.threads, args.out)
        return 0
    report = {**_harness.envelope("concurrent_compiles", import_torch=True),
              "args": {"device": args.device, "threads": args.threads, "rounds": args.rounds, "cold": args.cold,
                       "graphs": [g.__name__ for g in GRAPHS]}}
    report["warm"] = warm(args.threads, args.rounds)
    report["processes"] = processes(args.threads, args.rounds)
    off = report["warm"]["wall_s"]["off"]
    report["processes"]["median_ratio_vs_off"] = round(
        statistics.median(p / o for p, o in zip(report["processes"]["wall_s"], off)), 3)
    if args.cold:
        report["cold"] = cold(args.threads)
    print(json.dumps({k: report[k] for k in ("warm", "processes") + (("cold",) if args.cold else ())},
                     indent=1))
    _harness.Output(args).write(report)
    ok = report["warm"]["errors"] == 0 and report["warm"]["wrong_results"] == 0
    return 0 if ok and not report["processes"]["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
