"""What one call of a compiled ``create_block_mask`` costs, made two ways, in one process.

- ``_compile=True`` on each call: torch builds a new ``torch.compile`` wrapper
  every call (deprecated by torch, which advises the next);
- ``torch.compile(create_block_mask)`` made once, then called.

Both make the same causal mask (B=2, H=None) at each length, compiled first,
turn by turn; best of REPEATS short runs per way.  Reported as the ratio
``_compile=True`` ÷ compiled once, stock and after ``fxguard.install()`` (which
changes ``create_block_mask``: the eager path holds ``block_mask_lock``).

    python benchmarks/block_mask_call.py [--device cpu|cuda] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import _harness

LENGTHS = (128, 512)
CALLS, REPEATS = 50, 15


def causal(b, h, q, kv):
    return q >= kv


def per_call_s(fns: dict, device: str) -> dict:
    """Best seconds per call of each fn, the fns taking turns."""
    import torch
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(REPEATS):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - start) / CALLS)
    return best


def measure(device: str) -> dict:
    import torch
    from torch.nn.attention import flex_attention as flex
    torch._dynamo.reset()  # each measure starts cold: no sizes another one marked dynamic
    compiled = torch.compile(flex.create_block_mask)
    out = {}
    for length in LENGTHS:
        fns = {"_compile=True": lambda: flex.create_block_mask(causal, 2, None, length, length,
                                                               device=device, _compile=True),
               "compiled once": lambda: compiled(causal, 2, None, length, length, device=device)}
        for fn in fns.values():  # compile, then warm
            fn()
            fn()
        s = per_call_s(fns, device)
        out[str(length)] = {"ms_per_call": {k: round(v * 1e3, 4) for k, v in s.items()},
                            "ratio": round(s["_compile=True"] / s["compiled once"], 2)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    _harness.add_output_options(p)
    args = p.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)  # _compile=True's, every call
    report = {**_harness.envelope("block_mask_call", import_torch=True),
              "args": {"device": args.device, "lengths": list(LENGTHS), "calls": CALLS, "repeats": REPEATS}}
    report["stock_torch"] = measure(args.device)
    import fxguard
    fxguard.install()
    report["with_fxguard"] = measure(args.device)
    fxguard.uninstall()
    _harness.Output(args).write(report, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
