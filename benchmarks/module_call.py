"""A small module's call and a submodule attribute read, stock vs fxguard, in one process.

fxguard puts a C Dispatch on nn.Module.__call__ and a trampoline into one on
nn.Module.__getattr__ (per-thread patching for concurrent direct traces);
every module call of every thread passes them.  Reported as ratios to stock
measured alongside: rounds alternate stock and installed, best of each,
in this thread's CPU time.  Also
the same while another thread sits inside a symbolic_trace (then every call
looks up its thread's override).  Goal: call <= 1.03x stock.

    python benchmarks/module_call.py [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import threading
import time
import timeit

import torch

import _harness
import fxguard

N = 20_000
ROUNDS = 10


class Tiny(torch.nn.Module):
    def forward(self, x):
        return x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)


def per_call_ns(fn, number=N) -> float:
    # CPU time of this thread: on a shared machine, wall time mostly measures
    # the other processes.
    return min(timeit.repeat(fn, number=number, repeat=3, timer=time.thread_time)) / number * 1e9


def figures(net, x) -> dict:
    lin, tiny = net.lin, Tiny()
    return {"Tiny call (forward returns x)": per_call_ns(lambda: tiny(x)),
            "Linear call": per_call_ns(lambda: lin(x)),
            "Net call (two module calls)": per_call_ns(lambda: net(x)),
            "submodule read (net.lin via __getattr__)": per_call_ns(lambda: net.lin)}


def measure() -> dict:
    torch.set_grad_enabled(False)
    net, x = Net(), torch.ones(1, 8)
    best: dict = {}
    for _ in range(ROUNDS):
        for mode in ("stock", "fxguard"):
            if mode == "fxguard":
                fxguard.install()
            for name, ns in figures(net, x).items():
                key = f"{mode}: {name}"
                best[key] = min(best.get(key, float("inf")), ns)
            fxguard.uninstall()
    fxguard.install()
    inside, release = threading.Event(), threading.Event()

    class Hold(torch.nn.Module):
        def forward(self, y):
            inside.set()
            release.wait(300)
            return y

    t = threading.Thread(target=lambda: torch.fx.symbolic_trace(Hold()))
    t.start()
    inside.wait(30)
    for name, ns in figures(net, x).items():
        best[f"fxguard, another thread tracing: {name}"] = ns
    release.set()
    t.join()
    fxguard.uninstall()
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    _harness.add_output_options(p)
    args = p.parse_args()
    ns = measure()
    ratios = {k: v / ns["stock: " + k.split(": ", 1)[1]] for k, v in ns.items()
              if not k.startswith("stock")}
    report = {**_harness.envelope("module_call"), "ns_per_call": ns, "ratios": ratios}
    _harness.print_figures(report, width=70)
    _harness.Output(args).write(report)


if __name__ == "__main__":
    main()
