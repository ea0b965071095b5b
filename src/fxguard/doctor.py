"""python -m fxguard doctor: show the races on the installed torch, then the fix.

Runs each deterministic race with fxguard off, then on, in this process, and
prints a table.  Exit status 0 when fxguard fixes every race it found.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import fxguard

from . import config_threads, races


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths))


def run_races() -> list[dict]:
    fxguard.uninstall()
    # Only where torch keeps config per thread (2.12+): elsewhere there is nothing to follow.
    per_thread = config_threads.config_is_per_thread()
    config_stock = config_threads.recompile_limit_in_thread() if per_thread else None  # resets dynamo
    compiled = races.make_compiled()  # created before install(), like users' code
    rows = []
    for race in races.RACES:
        kwargs = {"compiled": compiled} if race is races.trace_vs_compiled_call else {}
        off = race(**kwargs)
        races.reset_stock_leftovers()
        rows.append({"race": off.name, "doc": race.__doc__.strip().splitlines()[0],
                     "affected": off.raced, "stock": off.detail})
    fxguard.install()
    for row, race in zip(rows, races.RACES):
        kwargs = {"compiled": compiled} if race is races.trace_vs_compiled_call else {}
        on = race(**kwargs)
        row.update(fixed=not on.raced, with_fxguard=on.detail)
    if per_thread:
        rows.append(config_row(config_stock, config_threads.recompile_limit_in_thread()))
    return rows


def config_row(stock: dict, with_fxguard: dict) -> dict:
    """Main sets recompile_limit 20; a thread compiles 20 shapes (config_threads)."""
    return {"race": "config-follows-thread", "doc": config_row.__doc__.splitlines()[0],
            "affected": stock["lost"], "stock": stock["detail"],
            "fixed": not with_fxguard["lost"], "with_fxguard": with_fxguard["detail"]}


def probe_shared_gpu() -> dict | None:
    """The shared-GPU deadlock can only be probed on a GPU: None elsewhere."""
    import torch
    if not torch.cuda.is_available():
        return None
    from . import shared_gpu
    return {"stock": shared_gpu.probe(install=False), "fxguard": shared_gpu.probe(install=True)}


def report(rows: list[dict], status: dict, seconds: float, gpu: dict | None = None) -> str:
    lines = [
        f"fxguard {status['fxguard']}  torch {status['torch']}  Python {status['python']}  "
        f"{platform.machine()}  ({seconds:.1f} s)",
        f"mode after install(): {status['mode']}  (torch layout: {status['layout']})",
        "",
    ]
    widths = [26, 9, 44, 30]
    lines.append(_row(["race", "affected", "stock torch", "with fxguard"], widths))
    for r in rows:
        lines.append(_row([r["race"], "yes" if r["affected"] else "no", r["stock"][:44],
                           ("fixed: " if r["affected"] else "") + r["with_fxguard"]], widths))
    if gpu is None:
        lines.append(_row(["shared-gpu-deadlock", "n/a", "no CUDA here: not probed", ""], widths))
    else:
        stock, fixed = gpu["stock"]["result"], gpu["fxguard"]["result"]
        lines.append(_row(["shared-gpu-deadlock", "yes" if stock == "deadlocked" else "no",
                           f"{stock} ({gpu['stock']['seconds']} s)",
                           f"{fixed} ({gpu['fxguard']['seconds']} s)"], widths))
    lines += ["", "install() patched:"]
    for p in status["patch_points"]:
        mark = p.get("reason") or ("patched" if p["patched"] else "not needed on this torch")
        lines.append(f"  {p['what']:<27} {p['where']:<58} {mark}")
    lines.append(f"autograd workers: {status['autograd_workers']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fxguard")
    parser.add_argument("command", nargs="?", default="doctor", choices=["doctor", "status"])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.command == "status":
        print(json.dumps(fxguard.status(), indent=2))
        return 0
    start = time.perf_counter()
    rows = run_races()
    status = fxguard.status()
    gpu = probe_shared_gpu()
    print(report(rows, status, time.perf_counter() - start, gpu))
    ok = all(r["fixed"] for r in rows) and (gpu is None or gpu["fxguard"]["result"] == "completed")
    print("\nresult:", "fxguard fixes every race found" if ok else "RACE NOT FIXED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"status": status, "races": rows, "shared_gpu": gpu, "ok": ok}, f, indent=2)
    return 0 if ok else 1
