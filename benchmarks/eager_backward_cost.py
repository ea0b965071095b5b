"""What install(eager_backward=True) costs: compile time with and without.

With torch._functorch.config.force_non_lazy_backward_lowering the backward
graph is compiled during the forward compile, also for graphs whose backward
never runs.  Each case runs in a fresh process with a fresh inductor cache:

  train      first forward (compile) + first backward
  fwd-only   first forward with inputs that require grad, backward never run

    python benchmarks/eager_backward_cost.py [--device cuda] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


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
    p.add_argument("--json")
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.device, args.one[0] == "eager", args.one[1])))
        return
    import torch
    rows = {}
    for case in ("train", "fwd-only"):
        for eager in (False, True):
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/i", TRITON_CACHE_DIR=f"{tmp}/t")
                out = subprocess.run([sys.executable, __file__, "--device", args.device, "--one",
                                      "eager" if eager else "lazy", case],
                                     env=env, capture_output=True, text=True, check=True)
                rows[f"{case} {'eager' if eager else 'lazy'}"] = json.loads(out.stdout.strip().splitlines()[-1])
    info = {"torch": torch.__version__, "device": args.device, "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}
    print(f"torch {info['torch']} on {info['gpu'] or 'CPU'}  {info['date']}")
    for case in ("train", "fwd-only"):
        lazy, eager = rows[f"{case} lazy"], rows[f"{case} eager"]
        for key in lazy:
            print(f"{case:<9} {key:<11} lazy {lazy[key]:7.2f} s   eager {eager[key]:7.2f} s   "
                  f"ratio {eager[key] / lazy[key]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": info, "seconds": rows}, f, indent=1)


if __name__ == "__main__":
    main()
