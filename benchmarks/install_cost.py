"""What install() costs a process, as a ratio to that process's own ``import torch``.

Every run is a fresh interpreter that imports torch (timed), then the torch
modules install() reads (not timed: a program that compiles has them), then
calls install() (timed), then uninstall() + install() again (timed):

  cold   an empty code cache (FXGUARD_CACHE_DIR, a new folder)
  warm   the folder a cold run filled (what every later process on the machine pays)
  off    FXGUARD_CACHE_DIR= : no cache (what a read-only or missing folder costs)
  user   the warm folder, and install() right after ``import torch`` with nothing
         else imported: what a user times (install() imports the modules it changes)

Runs rotate between the setups so drift hits all alike.  Goals (issue "A new
user's first hour"): warm <= 0.1x of import torch, cold <= 0.7x.  JSON line.

    python benchmarks/install_cost.py [--n 5] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import _harness

CHILD = r"""
import json, sys, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
import fxguard
t2 = time.perf_counter(); status = fxguard.install(); t3 = time.perf_counter()
fxguard.uninstall()
t4 = time.perf_counter(); fxguard.install(); t5 = time.perf_counter()
print(json.dumps({"import_torch": t1 - t0, "install": t3 - t2, "reinstall": t5 - t4,
                  "torch": torch.__version__, "cache": status["code_cache"]}))
"""

MODULES = r"""
import sys, json
import torch
before = set(sys.modules)
import fxguard
fxguard.install()
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith("torch"))))
"""


def child(code: str, cache: str, *args: str) -> dict | list:
    env = {**os.environ, "FXGUARD_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5, help="runs per setup")
    _harness.add_output_options(parser)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"cold": [], "warm": [], "off": [], "user": []}
    with tempfile.TemporaryDirectory() as tmp:
        modules = child(MODULES, "")  # what install() imports beyond torch
        setups = list(runs)
        for i in range(args.n):
            cold_dir = os.path.join(tmp, f"cold-{i}")
            for name in setups[i % 4:] + setups[:i % 4]:
                folder = {"cold": cold_dir, "warm": os.path.join(tmp, "warm"), "off": "",
                          "user": os.path.join(tmp, "warm")}[name]
                if name in ("warm", "user") and not os.path.exists(folder):
                    child(CHILD, folder, *modules)  # fill it once
                runs[name].append(child(CHILD, folder, *(() if name == "user" else modules)))

    def ratios(name: str, key: str) -> list[float]:
        return [r[key] / r["import_torch"] for r in runs[name]]

    result = {
        **_harness.envelope("install_cost", torch_version=runs["cold"][0]["torch"]),
        "runs_per_setup": args.n, "goal_ratio": {"warm": 0.1, "cold": 0.7},
        "median_ratio_to_import_torch": {
            name: round(statistics.median(ratios(name, "install")), 3) for name in runs},
        "max_ratio_to_import_torch": {
            name: round(max(ratios(name, "install")), 3) for name in runs},
        "median_reinstall_ratio": {
            name: round(statistics.median(ratios(name, "reinstall")), 3) for name in runs},
        "median_seconds": {
            name: {key: round(statistics.median(r[key] for r in runs[name]), 3)
                   for key in ("import_torch", "install", "reinstall")} for name in runs},
        "cache_misses": {name: [r["cache"]["misses"] for r in runs[name]] for name in runs},
    }
    _harness.Output(args).write(result, echo=True)


if __name__ == "__main__":
    main()
