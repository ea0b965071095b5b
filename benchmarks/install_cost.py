"""What install() costs a process, as a ratio to that process's own ``import torch``.

Every run is a fresh interpreter that imports torch (timed), then the torch
modules install() reads (not timed: a program that compiles has them), then
calls install() (timed), then uninstall() + install() again (timed):

  cold   an empty code cache (FXGUARD_CACHE_DIR, a new folder)
  warm   the folder a cold run filled (what every later process on the machine pays)
  off    FXGUARD_CACHE_DIR= : no cache (what a read-only or missing folder costs)
  user   the warm folder, and install() right after ``import torch`` with nothing
         else imported: what a user times (rows whose module comes later wait for it)

and, in the same rotation, two costs of install on import (warm folder):

  env    ``import torch`` with FXGUARD=1 (the start-up hook installs as torch
         finishes importing) against plain ``import torch``: what a process that
         never compiles pays (a spawned DataLoader worker)
  later  importing the compiler (torch._dynamo, export, flex_attention,
         functorch's config) after install(), against the same imports stock:
         where the waiting rows are applied

Every child reads and writes bytecode in a private folder (PYTHONPYCACHEPREFIX, bytecode
writing on whatever PYTHONDONTWRITEBYTECODE says), filled by the first child: fxguard's
modules then load as an installed wheel's do (pip byte-compiles them), as torch's already
do.  A checkout run with PYTHONDONTWRITEBYTECODE=1 would otherwise compile fxguard's
modules from source in every child (~30 ms of "user", none of it install()'s).

Runs rotate between the setups so drift hits all alike.  Goals (issue "A drafter
user's first hour"): warm <= 0.1x of import torch, cold <= 0.7x, user <= 0.1x,
env <= 1.1x.  JSON line.

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

# FXGUARD=1 in the environment: what the .pth line does at start-up, then torch.
ENV = r"""
import json, sys, time
if sys.argv[1] == "on":
    import _fxguard_startup; _fxguard_startup.activate()
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
import fxguard
assert fxguard.is_installed() == (sys.argv[1] == "on")
print(json.dumps({"import_torch": t1 - t0}))
"""

# The compiler's modules imported after install() (or stock), timed.
LATER = r"""
import json, sys, time, importlib
import torch, fxguard
if sys.argv[1] == "on":
    fxguard.install()
t0 = time.perf_counter()
for name in ("torch._dynamo", "torch.export._trace", "torch.nn.attention.flex_attention",
             "torch._functorch.config"):
    importlib.import_module(name)
t1 = time.perf_counter()
waiting = [p for p in fxguard.status()["patch_points"] if p["reason"].startswith("waiting")]
print(json.dumps({"imports": t1 - t0, "waiting_after": len(waiting)}))
"""

# What a program that compiles has imported when it calls install(): the
# compiler, and what install() then plans its rows from.
MODULES = r"""
import sys, json
import torch
before = set(sys.modules)
import torch._dynamo, torch.export._trace, torch.nn.attention.flex_attention, torch._functorch.config
import fxguard
fxguard.install()
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith("torch"))))
"""


PYCACHE: str | None = None  # the children's bytecode folder (main() sets it)


def child(code: str, cache: str, *args: str, **extra: str) -> dict | list:
    env = {**os.environ, "FXGUARD_CACHE_DIR": cache, **extra}
    if PYCACHE is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE
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
    pairs: dict[str, dict[str, list[dict]]] = {"env": {"on": [], "off": []},
                                               "later": {"on": [], "off": []}}
    global PYCACHE
    load_start = os.getloadavg()  # other work on the machine slows every child alike, not evenly
    with tempfile.TemporaryDirectory() as tmp:
        PYCACHE = os.path.join(tmp, "pycache")
        modules = child(MODULES, "")  # what a compiling program has beyond torch; fills PYCACHE
        setups = list(runs)
        for i in range(args.n):
            cold_dir = os.path.join(tmp, f"cold-{i}")
            for name in setups[i % 4:] + setups[:i % 4]:
                folder = {"cold": cold_dir, "warm": os.path.join(tmp, "warm"), "off": "",
                          "user": os.path.join(tmp, "warm")}[name]
                if name in ("warm", "user") and not os.path.exists(folder):
                    child(CHILD, folder, *modules)  # fill it once
                runs[name].append(child(CHILD, folder, *(() if name == "user" else modules)))
            warm = os.path.join(tmp, "warm")
            for way in ("on", "off")[::1 if i % 2 else -1]:
                pairs["env"][way].append(child(ENV, warm, way, FXGUARD="1" if way == "on" else "0"))
                pairs["later"][way].append(child(LATER, warm, way))

    def ratios(name: str, key: str) -> list[float]:
        return [r[key] / r["import_torch"] for r in runs[name]]

    def paired(name: str, key: str) -> float:
        on, off = pairs[name]["on"], pairs[name]["off"]
        return round(statistics.median(a[key] / b[key] for a, b in zip(on, off)), 3)

    result = {
        **_harness.envelope("install_cost", torch_version=runs["cold"][0]["torch"]),
        "runs_per_setup": args.n,
        "bytecode": "every child's in a private PYTHONPYCACHEPREFIX folder, written by the first",
        # the 1-minute load average when the runs began and ended (2 cores: 2.0 is busy)
        "load_average": [round(load_start[0], 1), round(os.getloadavg()[0], 1)],
        "goal_ratio": {"warm": 0.1, "cold": 0.7, "user": 0.1, "env_import_torch": 1.1},
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
        # FXGUARD=1 import torch / plain import torch (median of paired runs)
        "env_import_torch_ratio": paired("env", "import_torch"),
        "env_import_torch_seconds": {way: round(statistics.median(r["import_torch"] for r in
                                                                   pairs["env"][way]), 3)
                                     for way in ("on", "off")},
        # importing the compiler after install() / the same imports stock
        "later_imports_ratio": paired("later", "imports"),
        "later_imports_seconds": {way: round(statistics.median(r["imports"] for r in
                                                                pairs["later"][way]), 3)
                                  for way in ("on", "off")},
        "waiting_after_later_imports": max(r["waiting_after"] for r in pairs["later"]["on"]),
    }
    _harness.Output(args).write(result, echo=True)


if __name__ == "__main__":
    main()
