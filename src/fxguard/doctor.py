"""fxguard doctor: show the races on the installed torch, then the fix.

Runs each deterministic race with fxguard off, then on, in this process, and
prints a table.  Exit status 0 when fxguard fixes every race it found.  What
torch warns about during the probes is captured and summarised after the
table (``--verbose``: in full); warnings the probes cause on purpose are named
as such, any other is printed.
"""
from __future__ import annotations

import contextlib
import json
import logging
import platform
import re
import textwrap
import time
import warnings
from typing import Iterator

import fxguard

from . import interpreter
from .demos import DEMOS, races
from .demos.shared_gpu import COMPLETED, DEADLOCKED
from .torch_support import facts

# Warnings the probes cause on purpose, or that say nothing about fxguard:
# (pattern, why it is expected).
EXPECTED = (
    (r"hit config\.recompile_limit", "the stock config probe compiles past torch's "
                                     "recompile_limit on purpose"),
    (r"is_fx_tracing will return true", "torch's notice on is_fx_tracing(), which the race "
                                        "probes call"),
    (r"Failed to initialize NumPy|No module named 'numpy'", "torch without NumPy: harmless here"),
    (r"`torch\.jit\.\w+` is deprecated", "torch's own deprecation notice for TorchScript "
                                       "(seen on torch 2.11 with CUDA), unrelated to fxguard"),
    (interpreter.GIL_WARNING.pattern, "a module turned the GIL on (see the "
                                                          "interpreter line above)"),
)


def run_races() -> list[dict]:
    """Every demo that applies here, on stock torch, then with fxguard installed."""
    fxguard.uninstall()
    found = facts.detect()
    chosen = [demo for demo in DEMOS if demo.applies(found)]
    rows, states = [], []
    for demo in chosen:
        states.append(demo.setup() if demo.setup else None)
        stock = demo.run(states[-1])
        races.reset_stock_leftovers()
        rows.append({"race": stock.name, "doc": demo.doc, "affected": stock.raced,
                     "stock": stock.detail})
    fxguard.install()
    for row, demo, state in zip(rows, chosen, states):
        guarded = demo.run(state)
        row.update(fixed=not guarded.raced, with_fxguard=guarded.detail)
    return rows


def probe_shared_gpu() -> dict | None:
    """The shared-GPU deadlock can only be probed on a GPU: None elsewhere."""
    import torch
    if not torch.cuda.is_available():
        return None
    from .demos import shared_gpu
    return {"stock": shared_gpu.probe(install=False), "fxguard": shared_gpu.probe(install=True)}


# -- what torch says meanwhile ------------------------------------------------------

class _Captured(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[str]]:
    """Python warnings and WARNINGs on torch's loggers, collected instead of
    printed (torch's loggers get their handlers back afterwards)."""
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as python_warnings:
        warnings.simplefilter("default")
        import torch  # noqa: F401  (its import warns too, and sets up its loggers)
        # torch._logging gives torch and many of its subsystems a handler each.
        loggers = [lg for name, lg in list(logging.root.manager.loggerDict.items())
                   if isinstance(lg, logging.Logger) and lg.handlers
                   and (name == "torch" or name.startswith("torch."))]
        saved = [lg.handlers[:] for lg in loggers]
        capture = _Captured(caught)
        for lg in loggers:
            lg.handlers[:] = [capture]
        try:
            yield caught
        finally:
            for lg, handlers in zip(loggers, saved):
                lg.handlers[:] = handlers
            caught[:0] = [f"{w.category.__name__}: {w.message}" for w in python_warnings]
            for w in python_warnings:
                interpreter.note(w.message)


def sort_warnings(caught: list[str]) -> tuple[dict[str, int], list[str]]:
    """({why expected: count}, unexpected ones in full)."""
    expected: dict[str, int] = {}
    unexpected = []
    for text in caught:
        why = next((why for pattern, why in EXPECTED if re.search(pattern, text)), None)
        if why is None:
            unexpected.append(text)
        else:
            expected[why] = expected.get(why, 0) + 1
    return expected, unexpected


# -- the report ----------------------------------------------------------------------

COLUMNS = (("race", 25), ("affected", 8), ("stock torch", 40), ("with fxguard", 40))


def _table(rows: list[list[str]]) -> list[str]:
    """Rows of cells, each wrapped inside its column (nothing is cut)."""
    lines = []
    for cells in rows:
        wrapped = [textwrap.wrap(c, width) or [""] for c, (_, width) in zip(cells, COLUMNS)]
        for i in range(max(map(len, wrapped))):
            parts = [(w[i] if i < len(w) else "").ljust(width)
                     for w, (_, width) in zip(wrapped, COLUMNS)]
            lines.append("  ".join(parts).rstrip())
    return lines


def verdict(rows: list[dict], gpu: dict | None) -> tuple[bool, str]:
    ok = all(r["fixed"] for r in rows) and (gpu is None or gpu["fxguard"]["result"] == COMPLETED)
    return ok, "fxguard fixes every race found" if ok else "RACE NOT FIXED"


def report(rows: list[dict], status: dict, seconds: float, gpu: dict | None = None,
           caught: list[str] = (), verbose: bool = False) -> str:
    _, answer = verdict(rows, gpu)
    affected = sum(bool(r["affected"]) for r in rows)
    lines = [
        f"fxguard {status['fxguard']}  torch {status['torch']}  Python {status['python']}  "
        f"{platform.machine()}  ({seconds:.1f} s)",
        f"mode after install(): {status['mode']}  (torch layout: {status['layout']})",
        _interpreter_line(status["interpreter"]),
        f"stock torch had {affected} of the {len(rows)} races probed here",
        "",
    ]
    table = [[name for name, _ in COLUMNS]]
    for r in rows:
        table.append([r["race"], "yes" if r["affected"] else "no", r["stock"],
                      ("fixed: " if r["affected"] else "") + r["with_fxguard"]])
    if gpu is None:
        table.append(["shared-gpu-deadlock", "n/a", "no CUDA here: not probed", ""])
    else:
        stock, fixed = gpu["stock"]["result"], gpu["fxguard"]["result"]
        table.append(["shared-gpu-deadlock", "yes" if stock == DEADLOCKED else "no",
                      f"{stock} ({gpu['stock']['seconds']} s)",
                      f"{fixed} ({gpu['fxguard']['seconds']} s)"])
    lines += _table(table)
    lines += [""] + rows_summary(status["patch_points"], verbose, status.get("waiting"))
    lines.append(f"autograd workers: {status['autograd_workers']}")
    if status.get("compile_once") is not None:
        c = status["compile_once"]
        lines.append(f"compile once: {c['compiles_avoided']} compile(s) avoided in this process "
                     f"(threads that ran another thread's compile), {c['waits']} wait(s)")
    lines += _notes(caught, verbose)
    lines += ["", f"result: {answer}"]
    return "\n".join(lines)


OUTCOMES = ("patched", "waiting", "option off", "not needed", "not available", "not covered")


def rows_summary(points: list[dict], verbose: bool, waiting: dict | None = None) -> list[str]:
    """One line per kind of outcome, and which modules rows wait for; rows fxguard
    stood down on (not covered) always in full; with ``verbose``, every row
    (what, where, reason), each on its lines."""
    counts = {kind: sum(p["outcome"] == kind for p in points) for kind in OUTCOMES}
    lines = ["install(): " + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
             + ("" if verbose else "  (by option: fxguard status; every row: --verbose)")]
    if waiting:
        lines.append("  waiting rows are applied when their module is imported: " + ", ".join(
            f"{module} ({len(rows)})" for module, rows in waiting.items()))
    shown = points if verbose else [p for p in points if p["outcome"] == "not covered"]
    for p in shown:
        lines += row_lines(p)
    return lines


def row_lines(point: dict, indent: str = "  ") -> list[str]:
    """One row of status()["patch_points"]: what and where, then its reason."""
    return [f"{indent}{point['what']}: {point['where']}", *textwrap.wrap(
        point["reason"], 96, initial_indent=indent + "    ", subsequent_indent=indent + "    ")]


def _interpreter_line(info: dict) -> str:
    if not info["free_threaded"]:
        return "interpreter: with the GIL"
    line = "interpreter: free-threaded, the GIL " + ("on" if info["gil_enabled"] else "off")
    if info["gil_enabled"] and info["gil_enabled_by"]:
        line += f" (turned on by {', '.join(info['gil_enabled_by'])}; PYTHON_GIL=0 keeps it off)"
    return line


def _notes(caught: list[str], verbose: bool) -> list[str]:
    if not caught:
        return []
    expected, unexpected = sort_warnings(caught)
    lines = ["", f"torch warned {len(caught)} time(s) during the probes"
                 + ("" if verbose else " (--verbose prints them in full)") + ":"]
    lines += [f"  {n} expected: {why}" for why, n in expected.items()]
    if unexpected:
        lines.append(f"  {len(unexpected)} not expected by doctor:")
        lines += ["    " + u.replace("\n", "\n    ") for u in unexpected]
    if verbose:
        lines += ["  in full:"] + ["    " + c.replace("\n", "\n    ") for c in caught]
    return lines


def main(json_path: str | None = None, verbose: bool = False) -> int:
    start = time.perf_counter()
    with captured_warnings() as caught:
        rows = run_races()
        status = fxguard.status()
        gpu = probe_shared_gpu()
    print(report(rows, status, time.perf_counter() - start, gpu, caught, verbose))
    ok, _ = verdict(rows, gpu)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"status": status, "races": rows, "shared_gpu": gpu, "ok": ok,
                       "warnings": caught}, f, indent=2)
    return 0 if ok else 1
