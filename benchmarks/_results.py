"""RESULTS.md's tables and README.md's figures, made from results/: run this after adding a result.

    python3 benchmarks/_results.py           # rewrite the tables in RESULTS.md, the figures in README.md
    python3 benchmarks/_results.py --check   # exit 1 if they are not what results/ gives

Each folder results/<benchmark>/ with JSON reports gets one table, between
``<!-- results:<benchmark>:begin -->`` and ``<!-- results:<benchmark>:end -->``:
a row per report (machine, torch, Python, date, the benchmark's headline figures,
a link to the file).  Everything outside the markers is written by hand.  Reports
written before _harness.py (the same figures, their versions under "versions")
are read alike.  README.md's figures of a benchmark (``FIGURES``) lie between
``<!-- figures:<benchmark>:begin -->`` and ``<!-- figures:<benchmark>:end -->``: the
newest report's, with its machine, versions, date and a link to it.  Needs no torch.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from pathlib import Path

from _harness import NAME, RESULTS

RESULTS_MD = RESULTS.parent / "RESULTS.md"
README_MD = RESULTS.parent.parent / "README.md"
MARKERS = re.compile(r"<!-- results:(?P<bench>[a-z0-9_]+):begin -->\n.*?<!-- results:(?P=bench):end -->",
                     re.DOTALL)


# -- formatting ----------------------------------------------------------------------

def num(x, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def ratio(x) -> str:
    if not isinstance(x, (int, float)):
        return "–"
    return num(x, "{:.2f}" if x >= 0.1 else "{:.3f}") + "×"


def spread(values, fmt: str = "{:.2f}") -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "–"
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}–{high}"


def modes(r: dict, names: tuple[str, ...], key, fmt=num) -> str:
    """One figure of each mode, 'a / b / c' in the order of names ('–' where a mode did not run)."""
    get = key if callable(key) else (lambda m: m.get(key))
    return " / ".join(fmt(get(r["modes"][n])) if n in r.get("modes", {}) else "–" for n in names)


def _gil_ms(mode: dict) -> str:
    """The GIL meter's held milliseconds a step: the drafters' phases + other threads'."""
    gil = mode.get("gil")
    if not gil or "ms_per_step" not in gil:
        return "–"  # not metered
    # fsum: sum() of floats rounds differently from 3.12 on (compensated), and the table
    # must read the same whichever Python regenerates or checks it.
    return f"{math.fsum(gil['ms_per_step'].values()):.2f} + {gil['other_threads_ms_per_step']:.2f}"


def text(x) -> str:
    return "–" if x is None else str(x)


# -- each benchmark's headline figures: (column, figure of a report) -----------------

def _ratios(*columns: tuple[str, str]):
    """(column, key in the report's "ratios")."""
    return [(column, lambda r, k=key: ratio(r["ratios"].get(k))) for column, key in columns]


CC_MODES = ("stock", "always-false", "serialized", "fxguard")
STALL_MODES = ("stock", "serialized", "fxguard")
LLAMA_MODES = ("stock", "serialized", "fxguard", "fxguard-no-share", "fxguard-turns", "fxguard-paced",
               "fxguard-concurrent", "processes")
LLAMA_STEADY = ("fxguard", "fxguard-turns", "fxguard-paced", "fxguard-concurrent")
ONCE_MODES = ("processes", "threads", "fxguard-no-share", "fxguard", "one-lock")
GRAPH_MODES = ("threads-fast", "threads-plain", "one-fast", "one-plain", "processes-fast")
# cuda_graph_drafters.py's VARIANTS: the fast step as users write it, 3 threads
USER_MODES = ("api", "default-generator", "dropout", "default-stream", "no-turns", "paced")


def _once_ratio(base: str, key: str):
    def figure(r: dict) -> str:
        got = r["ratios"].get(f"vs {base}", {}).get("fxguard", {}).get(key)
        return ratio(got and got["median"])
    return figure


def _steps_vs_serialized(r: dict) -> str:
    ours, lock = r["modes"].get("fxguard", {}), r["modes"].get("serialized", {})
    if isinstance(ours.get("steps_per_s"), (int, float)) and lock.get("steps_per_s"):
        return ratio(ours["steps_per_s"] / lock["steps_per_s"])
    return "–"


def _device(r: dict) -> str:
    args = r.get("args") or r.get("settings") or next(iter(r.get("runs", {}).values()), {})
    return args.get("device") or (r.get("versions") or r).get("device") or "–"


def _median_step_ms(mode: dict):
    return mode.get("median_step_s") and mode["median_step_s"] * 1e3


def _flatness(mode: dict):
    """The first device's (one device in every run so far)."""
    return next(iter((mode.get("memory_flatness") or {}).values()), None)


def _stall_setup(r: dict) -> str:
    return f"{r['args']['device']}, {r['args']['threads'] - 1} warm, {r['args']['compiles']} compiles"


STALL = [
    ("setup", _stall_setup),
    ("GIL", lambda r: "/".join(sorted({"off" if m.get("gil_enabled") is False else "on"
                                       for m in r["modes"].values()}))),
    ("ratio: stock / serialized / fxguard", lambda r: modes(r, STALL_MODES, "ratio")),
    ("fxguard ÷ stock", lambda r: ratio(r.get("fxguard_ratio_vs_stock"))),
    ("warm steps during compiles", lambda r: modes(r, STALL_MODES, "warm_steps_during_compiles", text)),
    ("longest wait s", lambda r: modes(r, STALL_MODES, "longest_wait_s")),
    ("median step ms", lambda r: modes(r, STALL_MODES, _median_step_ms, lambda x: num(x, "{:.1f}"))),
    ("errors", lambda r: modes(r, STALL_MODES, "errors", text)),
    ("`is_compiling()` leaks", lambda r: modes(r, STALL_MODES, "is_compiling_leaks", text)),
]

HEADLINES = {
    "call_overhead": _ratios(
        ("`is_fx_symbolic_tracing`", "patched is_fx_symbolic_tracing"),
        ("`is_fx_tracing`", "patched is_fx_tracing"),
        ("`is_compiling`", "patched is_compiling"),
        ("`get_current_meta`", "patched get_current_meta"),
        ("C `is_fx_tracing`", "fxguard.is_fx_tracing (C)"),
        ("C `is_fx_symbolic_tracing`", "fxguard.is_fx_symbolic_tracing (C)"),
        ("`is_fx_symbolic_tracing`, another thread tracing",
         "patched is_fx_symbolic_tracing, other thread tracing, caller never traced"),
        ("lock `with` ÷ `threading.Lock`", "fxguard.block_mask_lock with-cycle"),
    ) + [("after uninstall", lambda r: spread(
        [v for k, v in r["ratios"].items() if k.endswith("after uninstall")]) + "×")],
    "call_overhead_mechanism": [
        ("route", lambda r: "vectorcall" if (r.get("versions", r)).get("vectorcall_readers")
         else "code calls `Reader.read`")] + _ratios(
        ("fast reader", "fast reader (C Reader)"),
        ("fast reader, called from C", "fast reader, called from C"),
        ("rewritten reader (SlotView)", "rewritten reader (SlotView, no Reader)"),
        ("C `is_fx_symbolic_tracing`", "fxguard.is_fx_symbolic_tracing (C)"),
        ("after unpatch", "stock reader after unpatch"),
        ("lock `with` ÷ `threading.Lock`", "fxguard.block_mask_lock with-cycle"),
    ),
    "compile_stall": STALL,
    "compile_stall_eager_flex": STALL,
    "workarounds": [
        ("device", lambda r: _device(r) + ("" if any(m.get("train") for m in r["modes"].values())
                                           else ", forward only")),
        ("status: " + " / ".join(CC_MODES), lambda r: modes(r, CC_MODES, "status", text)),
        ("first step s", lambda r: modes(r, CC_MODES, "time_to_first_step_s", lambda x: num(x, "{:.1f}"))),
        ("steps/s", lambda r: modes(r, CC_MODES, "steps_per_s", lambda x: num(x, "{:.1f}"))),
        ("fxguard ÷ serialized steps/s", _steps_vs_serialized),
        ("errors", lambda r: modes(r, CC_MODES, "errors", text)),
        ("memory flatness", lambda r: modes(r, CC_MODES, _flatness, lambda x: num(x, "{:.3f}"))),
    ],
    "concurrent_compiles": [
        ("device, threads × rounds", lambda r: f"{r['args'].get('device', 'cpu')}, "
                                               f"{r['args']['threads']} × {r['args']['rounds']}"),
        ("warm on ÷ off: median (range)", lambda r: f"{ratio(r['warm']['median_ratio_on_vs_off'])} "
                                                    f"({spread(r['warm']['ratio_on_vs_off'])})"),
        ("warm s: on / off", lambda r: f"{spread(r['warm']['wall_s']['on'], '{:.1f}')} / "
                                       f"{spread(r['warm']['wall_s']['off'], '{:.1f}')}"),
        ("N processes ÷ off", lambda r: ratio(r["processes"]["median_ratio_vs_off"])),
        ("cold on ÷ off", lambda r: ratio((r.get("cold") or {}).get("ratio_on_vs_off"))),
        ("errors, wrong results", lambda r: f"{r['warm']['errors']}, {r['warm']['wrong_results']}"),
    ],
    "compile_once": [
        ("device, rounds", lambda r: f"{_device(r)}, {r['settings']['repeat']}"),
        ("every thread stepped: fxguard ÷ processes", _once_ratio("processes", "all_stepped_s")),
        ("÷ one lock", _once_ratio("one-lock", "all_stepped_s")),
        ("through every length ÷ processes", _once_ratio("processes", "all_through_s")),
        ("graphs: " + " / ".join(ONCE_MODES),
         lambda r: modes(r, ONCE_MODES, lambda m: m["graphs"][0], text)),
    ],
    "block_mask_call": [
        (f"{who}, length {n}: `_compile=True` / compiled once, ms (ratio)",
         lambda r, k=key, n=n: "{} / {} ({})".format(*(num(r[k][str(n)]["ms_per_call"][w], "{:.3f}")
                                                      for w in ("_compile=True", "compiled once")),
                                                    ratio(r[k][str(n)]["ratio"])))
        for who, key in (("stock", "stock_torch"), ("fxguard", "with_fxguard")) for n in (128, 512)] + [
        ("device", lambda r: r["args"]["device"])],
    "cuda_graph_drafters": [
        # Reports before the stream per drafter ran every drafter on the default stream.
        ("CUDA streams", lambda r: r.get("drafter_streams", "default")),
        # Reports before the field made the mask with _compile=True each step.
        ("fast step's mask", lambda r: r.get("fast_mask", "_compile=True each step")),
        ("switch interval", lambda r: (f"{1e3 * float(r['args']['DRAFTER_SWITCH_INTERVAL']):g} ms"
                                       if "DRAFTER_SWITCH_INTERVAL" in r.get("args", {})
                                       else "5 ms (default)")),
        ("backwards", lambda r: ("in turn" if r.get("args", {}).get("DRAFTER_FAIR_BACKWARD") == "1"
                                 else "on the caller" if r.get("args", {}).get("DRAFTER_BACKWARD_HERE") == "1"
                                 else "as torch queues them")),
        ("steps/s: " + " / ".join(GRAPH_MODES), lambda r: modes(r, GRAPH_MODES, "steps_per_s",
                                                               lambda x: num(x, "{:.1f}"))),
        ("fast ÷ plain threads", lambda r: ratio(r.get("ratios", {}).get("fast_vs_plain_threads"))),
        ("fast threads ÷ one plain", lambda r: ratio(r.get("ratios", {}).get("fast_threads_vs_one_plain"))),
        ("fast threads ÷ one fast", lambda r: ratio(r.get("ratios", {}).get("fast_threads_vs_one_fast"))),
        ("fast threads ÷ processes", lambda r: ratio(r.get("ratios", {}).get("fast_threads_vs_processes"))),
        ("fairness", lambda r: modes(r, GRAPH_MODES, "fairness")),
        ("every length s", lambda r: modes(r, GRAPH_MODES, "time_until_all_lengths_s",
                                           lambda x: num(x, "{:.0f}"))),
        ("GPU peak: threads ÷ processes",
         lambda r: ratio(r.get("ratios", {}).get("gpu_memory_threads_vs_processes"))),
        ("errors", lambda r: modes(r, GRAPH_MODES, "errors", text)),
        ("the user's step, threads ÷ processes: " + " / ".join(USER_MODES),
         lambda r: " / ".join(ratio(r.get("ratios", {}).get(f"{m.replace('-', '_')}_threads_vs_processes"))
                              for m in USER_MODES)),
        ("the user's step: fairness", lambda r: modes(r, tuple(f"threads-fast-{m}" for m in USER_MODES),
                                                      "fairness")),
        ("the user's step: errors", lambda r: modes(r, tuple(f"threads-fast-{m}" for m in USER_MODES),
                                                    "errors", text)),
        ("GPU peak: api threads ÷ processes",
         lambda r: ratio(r.get("ratios", {}).get("gpu_memory_api_threads_vs_processes"))),
        ("GIL held ms/step, drafters + other threads: one-fast / api / processes (each)",
         lambda r: modes(r, ("one-fast", "threads-fast-api", "processes-fast"), _gil_ms, str)),
        ("GIL held share: one-fast / api", lambda r: modes(r, ("one-fast", "threads-fast-api"),
                                                          lambda m: (m.get("gil") or {}).get("held_share"))),
    ],
    "eager_backward_cost": [("device", _device)] + [
        (column, lambda r, c=case, k=key: ratio(r["seconds"][f"{c} eager"][k] / r["seconds"][f"{c} lazy"][k]))
        for column, case, key in (("first forward (compile)", "train", "forward_s"),
                                  ("first backward", "train", "backward_s"),
                                  ("forward + backward", "train", "total_s"),
                                  ("forward only, backward never run", "fwd-only", "total_s"))],
    "install_cost": [
        (f"{label}: median (max)", lambda r, s=setup: f"{ratio(r['median_ratio_to_import_torch'][s])} "
                                                     f"({ratio(r['max_ratio_to_import_torch'][s])})")
        for setup, label in (("warm", "warm cache"), ("cold", "cold cache"), ("off", "no cache"))] + [
        ("as a user times it (nothing preloaded, warm cache)",
         lambda r: f"{ratio(r['median_ratio_to_import_torch']['user'])} "
                   f"({ratio(r['max_ratio_to_import_torch']['user'])})"
         if "user" in r["median_ratio_to_import_torch"] else "—"),
        ("uninstall + install: warm / no cache", lambda r: f"{ratio(r['median_reinstall_ratio']['warm'])} / "
                                                             f"{ratio(r['median_reinstall_ratio']['off'])}"),
        ("FXGUARD=1 import torch ÷ import torch", lambda r: ratio(r.get("env_import_torch_ratio"))),
        ("compiler imports after install() ÷ stock", lambda r: ratio(r.get("later_imports_ratio"))),
        ("runs", lambda r: text(r.get("runs_per_setup")))],
    "llama_threads": [
        ("device, s", lambda r: f"{r['args']['device']}, {r['args']['seconds']:.0f}"
                                + (f" (window {r['args']['window']:.0f})" if r["args"].get("window") else "")),
        ("models", lambda r: "a width each" if r["args"].get("distinct") else "one width"),
        ("all stepped s: " + " / ".join(LLAMA_MODES),
         lambda r: modes(r, LLAMA_MODES, "time_until_all_stepped_s")),
        ("fxguard ÷ serialized", lambda r: ratio(r.get("fxguard_vs_serialized_time_until_all_stepped"))),
        ("all shapes s", lambda r: modes(r, LLAMA_MODES, "time_until_all_shapes_s")),
        ("steady steps/s", lambda r: modes(r, LLAMA_MODES, "steady_steps_per_s")),
        ("steady fairness", lambda r: modes(r, LLAMA_MODES, "steady_fairness")),
        ("steady steps: " + " / ".join(LLAMA_STEADY) + " ÷ serialized", lambda r: " / ".join(
            ratio(r.get("ratios", {}).get(f"{m}_vs_serialized_steady_steps")) for m in LLAMA_STEADY)),
        ("the same ÷ processes", lambda r: " / ".join(
            ratio(r.get("ratios", {}).get(f"{m}_vs_processes_steady_steps")) for m in LLAMA_STEADY)),
        ("all shapes ÷ processes", lambda r: " / ".join(
            ratio(r.get("ratios", {}).get(f"{m}_vs_processes_time_until_all_shapes")) for m in LLAMA_STEADY)),
        ("graphs", lambda r: modes(r, LLAMA_MODES, "graphs", text)),
        ("uncompiled flex calls", lambda r: modes(r, LLAMA_MODES, "uncompiled_flex_calls", text)),
        ("errors", lambda r: modes(r, LLAMA_MODES, "errors", text)),
    ],
    "module_call": [
        (f"{column}{where}", lambda r, k=f"fxguard{where}: {name}": ratio(r["ratios"].get(k)))
        for where in ("", ", another thread tracing")
        for column, name in (("tiny module call", "Tiny call (forward returns x)"),
                             ("`Linear`", "Linear call"), ("`Net`", "Net call (two module calls)"),
                             ("`net.lin`", "submodule read (net.lin via __getattr__)"))],
    "startup": [
        ("median start, ms", lambda r: num(r["median_ms"]["without"])),
        ("added ms: `FXGUARD` unset", lambda r: "+" + num(r["added_ms"]["unset"])),
        ("added ms: `FXGUARD=1`", lambda r: "+" + num(r["added_ms"]["on"])),
        ("`site.addpackage` µs", lambda r: num(r.get("site_addpackage_unset_us"))),
        ("starts", lambda r: text(r.get("starts_per_setup")))],
    "thread_record_memory": [
        ("torch layout", lambda r: f"{r['results'].get('mode')}" +
         (", stash steals" if r["results"].get("stash_steals") else "")),
        ("`fx_tracing` threads: B/thread stock / fxguard", lambda r: " / ".join(
            num(r["results"][m]["fx_tracing"]["traced_bytes_per_thread"]) for m in ("stock", "fxguard"))),
        ("`symbolic_trace` threads: B/thread", lambda r: " / ".join(
            num(r["results"][m]["symbolic_trace"]["traced_bytes_per_thread"], "{:.0f}")
            for m in ("stock", "fxguard"))),
        ("10^6 cycles: blocks, RSS", lambda r: "+{blocks_grown}, +{rss_grown_bytes} B".format(
            **r["results"]["fxguard"]["cycles"]))],
    "thread_start": [
        (f"{case}: stock µs, ratio", lambda r, c=case: f"{num(r['results'][c]['stock_us'], '{:.1f}')}, "
                                                        f"{ratio(r['results'][c]['ratio'])}")
        for case in ("no overrides", "12 overrides")] + [
        ("rounds × threads", lambda r: f"{r['rounds']} × {r['n_per_round']}")],
}


# -- the tables ----------------------------------------------------------------------

def reports(bench: str) -> list[tuple[Path, dict]]:
    found = []
    for path in (RESULTS / bench).glob("*.json"):
        if not NAME.match(path.stem):
            raise SystemExit(f"{path}: not a name _harness.py gives (<machine>-torch<v>-<date>[-N].json)")
        found.append((path, json.loads(path.read_text())))
    return sorted(found, key=lambda pr: _order(pr[0]))


def _order(path: Path) -> tuple:
    m = NAME.match(path.stem)
    return m["date"], m["machine"], m["versions"], int(m["run"] or 1)


def table(bench: str) -> str:
    headline = HEADLINES.get(bench)
    if headline is None:
        raise SystemExit(f"results/{bench}/: no headline figures for it in {Path(__file__).name}")
    found = reports(bench)
    labels = any("label" in r for _, r in found)
    head = ["machine", "torch", "Python", "date"] + (["run"] if labels else [])
    head += [column for column, _ in headline] + ["report"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for path, r in found:
        v = r.get("versions") or r
        cells = [NAME.match(path.stem)["machine"], text(v.get("torch")), text(v.get("python")),
                 text(v.get("date"))] + ([r.get("label", "")] if labels else [])
        cells += [figure(r) for _, figure in headline]
        cells.append(f"[json]({path.relative_to(RESULTS.parent).as_posix()})")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render(markdown: str) -> str:
    """markdown with every results table rewritten from results/."""
    benches = {p.parent.name for p in RESULTS.glob("*/*.json")}
    marked = {m["bench"] for m in MARKERS.finditer(markdown)}
    if benches - marked:
        raise SystemExit(f"{RESULTS_MD.name} has no <!-- results:NAME:begin/end --> markers for "
                         f"{', '.join(sorted(benches - marked))}")
    if marked - benches:
        raise SystemExit(f"{RESULTS_MD.name} has markers for {', '.join(sorted(marked - benches))}, "
                         "which results/ has no JSON for")
    return MARKERS.sub(lambda m: f"<!-- results:{m['bench']}:begin -->\n{table(m['bench'])}\n"
                                 f"<!-- results:{m['bench']}:end -->", markdown)


# -- README.md's figures -------------------------------------------------------------

def machine(r: dict) -> str:
    """'2-core x86-64 CPU', or the GPU's name."""
    m = (r.get("versions") or r).get("machine") or {}
    if m.get("gpu"):
        return m["gpu"]
    return f"{m.get('cpus', '?')}-core {str(m.get('arch', '?')).replace('_', '-')} CPU"


def _install_cost_figures(path: Path, r: dict) -> str:
    med, top, sec = r["median_ratio_to_import_torch"], r["max_ratio_to_import_torch"], r["median_seconds"]
    link = path.relative_to(README_MD.parent).as_posix()
    load = r.get("load_average")
    busy = f" with a load average of {load[0]:g} to {load[1]:g} (other work)" if load else ""
    return (f"Measured as a user times it ({machine(r)}{busy}, torch {r['torch']}, Python {r['python']}, "
            f"{r['date']}, {r['runs_per_setup']} runs a setup, medians: [report]({link})): "
            f"`install()` right after `import torch` takes {ratio(med['user'])} of `import torch` "
            f"({sec['user']['install'] * 1e3:.0f} ms against {sec['user']['import_torch']:.2f} s; "
            f"at most {ratio(top['user'])}), and {ratio(med['warm'])} with the compiler imported "
            f"first ({sec['warm']['install'] * 1e3:.0f} ms). It imports no torch module: a row whose "
            f"torch module is not imported yet (dynamo, flex attention, export) is applied when that "
            f"module is imported, before the import returns (`status()[\"waiting\"]`), and those "
            f"imports then take {ratio(r['later_imports_ratio'])} of their stock time. `FXGUARD=1` "
            f"costs a process that never compiles {ratio(r['env_import_torch_ratio'])} of its "
            f"`import torch`.")


# benchmark -> (which of its reports qualify, the README text of one)
FIGURES = {
    "install_cost": (lambda r: "user" in r.get("median_ratio_to_import_torch", {})
                     and "later_imports_ratio" in r, _install_cost_figures),
}
FIGURE_MARKERS = re.compile(r"<!-- figures:(?P<bench>[a-z0-9_]+):begin -->\n.*?"
                            r"<!-- figures:(?P=bench):end -->", re.DOTALL)


def figures(bench: str) -> str:
    """The README text of the newest report of ``bench`` that has its figures."""
    if bench not in FIGURES:
        raise SystemExit(f"README.md has figures of {bench}, which {Path(__file__).name} cannot make")
    qualifies, text = FIGURES[bench]
    found = [(path, r) for path, r in reports(bench) if qualifies(r)]
    if not found:
        raise SystemExit(f"results/{bench}/ has no report with README.md's figures")
    return textwrap.fill(text(*found[-1]), width=95, break_long_words=False, break_on_hyphens=False)


def render_readme(markdown: str) -> str:
    """README.md with every figures block rewritten from results/."""
    return FIGURE_MARKERS.sub(lambda m: f"<!-- figures:{m['bench']}:begin -->\n{figures(m['bench'])}\n"
                                        f"<!-- figures:{m['bench']}:end -->", markdown)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether RESULTS.md is current")
    args = parser.parse_args(argv)
    stale = []
    for path, make in ((RESULTS_MD, render), (README_MD, render_readme)):
        current = path.read_text()
        wanted = make(current)
        if wanted == current:
            continue
        if args.check:
            stale.append(path)
        else:
            path.write_text(wanted)
    for path in stale:
        print(f"{path} is not what results/ gives: run python3 benchmarks/_results.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
