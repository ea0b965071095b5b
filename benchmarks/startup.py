"""Interpreter start-up with and without fxguard's start-up hook, from one process.

Two fresh venvs (no pip, no system site-packages, so no other .pth runs), one
with a copy of src/fxguard-startup.pth and src/_fxguard_startup.py in
site-packages as a wheel puts them, one without.  ``python -c pass`` is
started in three setups, one start of each in turn (rotating order), so drift
and the machine's other work hit all alike:

  without   the venv without the .pth (what Python costs alone)
  unset     the .pth there, FXGUARD unset (every process on a machine with fxguard)
  on        the .pth there, FXGUARD=1, torch never imported (what a subprocess that
            never imports torch pays: the hook module and its finder)

Reported: the median start of each, in ms; the added ms (median of the paired
per-start differences; goal: unset <= 2 ms over without); and, in this
process, what site spends on the .pth file with FXGUARD unset
(site.addpackage: open, read, run the line) and on the line alone.  JSON line.

    python benchmarks/startup.py [--n 300] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

import _harness

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
PTH = "fxguard-startup.pth"


def make_venv(root: str, with_hook: bool) -> tuple[str, str]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    python = os.path.join(root, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    if with_hook:
        for name in ("_fxguard_startup.py", PTH):
            shutil.copy(os.path.join(SRC, name), site)
    return python, site


def start_ms(python: str, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - start) * 1e3


def in_process_us(site_dir: str) -> tuple[float, float]:
    """(site.addpackage on the .pth, exec of its line) with FXGUARD unset, in µs."""
    import site
    with open(os.path.join(SRC, PTH)) as f:
        code = compile(f.read(), PTH, "exec")
    saved = os.environ.pop("FXGUARD", None)
    try:
        runs = 20_000
        add = min(timeit.repeat(lambda: site.addpackage(site_dir, PTH, set()),
                                number=runs, repeat=5)) / runs * 1e6
        line = min(timeit.repeat(lambda: exec(code, {}), number=runs, repeat=5)) / runs * 1e6
        return add, line
    finally:
        if saved is not None:
            os.environ["FXGUARD"] = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300, help="starts per setup")
    _harness.add_output_options(parser)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FXGUARD", "PYTHON"))}
    times: dict[str, list[float]] = {"without": [], "unset": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        plain, _ = make_venv(os.path.join(tmp, "plain"), with_hook=False)
        hooked, site_dir = make_venv(os.path.join(tmp, "hooked"), with_hook=True)
        setups = {"without": (plain, base), "unset": (hooked, base),
                  "on": (hooked, {**base, "FXGUARD": "1"})}
        for python, env in setups.values():  # warm the page cache
            start_ms(python, env)
        names = list(setups)
        for i in range(args.n):
            for name in names[i % 3:] + names[:i % 3]:
                times[name].append(start_ms(*setups[name]))
        addpackage_us, line_us = in_process_us(site_dir)

    def added(name: str) -> float:
        return statistics.median(a - b for a, b in zip(times[name], times["without"]))

    result = {
        **_harness.envelope("startup"), "starts_per_setup": args.n,
        "goal_added_ms_unset": 2.0,
        "median_ms": {name: round(statistics.median(v), 2) for name, v in times.items()},
        "added_ms": {"unset": round(added("unset"), 3), "on": round(added("on"), 3)},
        "site_addpackage_unset_us": round(addpackage_us, 2),
        "pth_line_unset_us": round(line_us, 3),
        "quartiles_ms": {name: [round(q, 2) for q in statistics.quantiles(v, n=4)]
                         for name, v in times.items()},
    }
    _harness.Output(args).write(result, echo=True)


if __name__ == "__main__":
    main()
