"""What install(eager_backward=True) costs: compile time with and without.

With torch._functorch.config.force_non_lazy_backward_lowering the backward
graph is compiled during the forward compile, also for graphs whose backward
never runs.  Each case runs in a fresh process with a fresh inductor cache:

  train      first forward (compile) + first backward
  fwd-only   first forward with inputs that require grad, backward never run

    python benchmarks/eager_backward_cost.py [--device cuda] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import _harness


def one(device: str, eager: bool, case: str) -> dict:
    import torch
    import torch._functorch.config as fconfig
    fconfig.force_non_lazy_backward_lowering = eager
    torch.manual_seed(0)
    dim = 256
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (
        torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
        torch.nn.Linear(4 * dim, dim))]).to(device)
    compiled = torch.compile(model)
    x = torch.randn(8, 128, dim, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    out = compiled(x)
    sync()
    t1 = time.perf_counter()
    result = {"forward_s": t1 - t0}
    if case == "train":
        out.float().pow(2).mean().backward()
        sync()
        result["backward_s"] = time.perf_counter() - t1
    result["total_s"] = time.perf_counter() - t0
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    _harness.add_output_options(p)
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        with open(args.out, "w") as f:
            json.dump(one(args.device, args.one[0] == "eager", args.one[1]), f)
        return
    rows = {}
    for case in ("train", "fwd-only"):
        for eager in (False, True):
            rows[f"{case} {'eager' if eager else 'lazy'}"] = r = _harness.in_fresh_process(
                __file__, ["--device", args.device, "--one", "eager" if eager else "lazy", case])
            if "status" in r:
                sys.exit(f"{case}, {'eager' if eager else 'lazy'}: {r['status']}\n{r['detail']}")
    report = {**_harness.envelope("eager_backward_cost", import_torch=True), "device": args.device,
              "seconds": rows}
    print(f"torch {report['torch']} on {report['machine'].get('gpu', 'CPU')}  {report['date']}")
    for case in ("train", "fwd-only"):
        lazy, eager = rows[f"{case} lazy"], rows[f"{case} eager"]
        for key in lazy:
            print(f"{case:<9} {key:<11} lazy {lazy[key]:7.2f} s   eager {eager[key]:7.2f} s   "
                  f"ratio {eager[key] / lazy[key]:.2f}x")
    _harness.Output(args).write(report)


if __name__ == "__main__":
    main()
