"""What every benchmark shares: the report's envelope, where it is written, a few helpers.

A report is one JSON object: the envelope (benchmark, date, machine, python, torch,
fxguard, commit), then the benchmark's own fields.  Every benchmark takes

  --json PATH   write the report there
  --save        write it to results/<benchmark>/<machine>-torch<version>-<date>.json
                (py<version> in place of torch<version> for a run without torch;
                -2, -3 ... when that name is taken), named here, never by hand

and ``python3 benchmarks/_results.py`` rewrites RESULTS.md's tables from results/.
The envelope reads torch's version and the GPU from the torch this process imported
(nvidia-smi names the GPU where it has none).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# A result file's name: machine (lower-case letters and digits), versions, date, run number.
NAME = re.compile(r"^(?P<machine>[a-z0-9]+)-(?P<versions>(?:torch|py)[^-]+)-(?P<date>\d{4}-\d\d-\d\d)"
                  r"(?:-(?P<run>\d+))?$")
VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct", "intel"}


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the report here")
    parser.add_argument("--save", action="store_true",
                        help="write the report to benchmarks/results/<benchmark>/"
                             "<machine>-torch<version>-<date>.json")


# -- the envelope --------------------------------------------------------------------

def machine_name(gpu: str | None) -> str:
    """'cpu', or the GPU's model: 'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' ->
    'rtx4090', 'NVIDIA A100-SXM4-80GB' -> 'a100'."""
    if not gpu:
        return "cpu"
    name = ""
    for word in re.split(r"[\s\-_]+", gpu.lower()):
        if word and word not in VENDOR_WORDS:
            name += re.sub(r"[^a-z0-9]", "", word)
            if re.search(r"\d", word):
                break
    return name or "gpu"


def _gpus() -> list[str]:
    """The GPUs' names: torch's view where this process imported torch, else nvidia-smi's."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _fxguard_version() -> str | None:
    try:
        import fxguard
    except ImportError:
        return None
    return fxguard.__version__


def _commit() -> str | None:
    """The checkout's commit (with -dirty for uncommitted changes), if this is one."""
    try:
        proc = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def envelope(benchmark: str, *, import_torch: bool = False, torch_version: str | None = None) -> dict:
    """The fields every report starts with.  The torch this process imported (None without);
    import_torch: a parent whose children use torch imports it here; torch_version: or
    takes the version its children said."""
    if import_torch:
        import torch  # noqa: F401  (read below, from sys.modules)
    torch = sys.modules.get("torch")
    gpus = _gpus()
    machine = {"name": machine_name(gpus[0] if gpus else None), "arch": platform.machine(),
               "cpus": os.cpu_count(), "system": platform.system()}
    if gpus:
        machine.update(gpu=gpus[0], gpus=len(gpus))
    return {"benchmark": benchmark, "date": datetime.date.today().isoformat(), "machine": machine,
            "python": platform.python_version() + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""),
            "torch": str(torch.__version__) if torch is not None else torch_version,
            "fxguard": _fxguard_version(), "commit": _commit()}


# -- where a report goes -------------------------------------------------------------

def result_path(report: dict) -> Path:
    """results/<benchmark>/<machine>-torch<v>-<date>[-N].json: the first name not taken."""
    version = f"torch{report['torch'].split('+')[0]}" if report.get("torch") else f"py{report['python']}"
    stem = f"{report['machine']['name']}-{version}-{report['date']}"
    folder, n = RESULTS / report["benchmark"], 1
    path = folder / f"{stem}.json"
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    return path


class Output:
    """--json and --save: writing again (a long run after each part) rewrites the same files."""

    def __init__(self, args: argparse.Namespace):
        self.json, self.save, self.saved = args.json, args.save, None

    def write(self, report: dict, *, echo: bool = False) -> None:
        if echo:
            print(json.dumps(report), flush=True)
        if self.save and self.saved is None:
            self.saved = result_path(report)
            print(f"saving to {self.saved.relative_to(HERE.parent)}", file=sys.stderr)
        for path in filter(None, (self.json, self.saved)):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(report, indent=1) + "\n")


# -- helpers several benchmarks use --------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def start_and_join(target, n: int) -> None:
    """n threads running target, one after another."""
    for _ in range(n):
        t = threading.Thread(target=target)
        t.start()
        t.join()


def error_kind(exc: BaseException, width: int = 120) -> str:
    """An exception as 'Type: first line of its message', for counting kinds."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:width] if text else ''}"


CACHES = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}


def in_fresh_process(script: str, argv: list[str], *, caches=("inductor", "triton"), env=None,
                     timeout: float | None = None, capture: bool = True) -> dict:
    """Runs ``python script *argv --out FILE`` with empty compile caches of its own (the
    ones named in caches) and returns the JSON it wrote to FILE, or {"status": why not,
    "detail": the end of its output}."""
    with tempfile.TemporaryDirectory(prefix="fxguard-bench-", ignore_cleanup_errors=True) as tmp:
        full_env = dict(os.environ, **{CACHES[c]: os.path.join(tmp, c) for c in caches}, **(env or {}))
        out = os.path.join(tmp, "result.json")
        try:
            proc = subprocess.run([sys.executable, script, *argv, "--out", out], env=full_env,
                                  capture_output=capture, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            return {"status": f"no answer within {timeout:.0f} s", "detail": _tail(e.stdout, e.stderr)}
        if proc.returncode != 0 or not os.path.exists(out):
            return {"status": f"failed (exit {proc.returncode})", "detail": _tail(proc.stdout, proc.stderr)}
        with open(out) as f:
            return json.load(f)


PEERS = "FXGUARD_BENCH_PROCESSES"  # how many processes of a run start their windows together


def in_processes(script: str, argvs: list[list[str]], *, env=None, timeout: float) -> list[dict] | str:
    """Runs ``python script *argv --ready-dir DIR --out FILE`` for each argv at once, each
    process with empty compile caches of its own; returns the JSON each wrote, or the
    end of their output where one wrote none.  Children call ``start_together``."""
    with tempfile.TemporaryDirectory(prefix="fxguard-bench-", ignore_cleanup_errors=True) as tmp:
        ready = os.path.join(tmp, "ready")
        os.mkdir(ready)
        procs, outs = [], []
        for i, argv in enumerate(argvs):
            caches = {var: os.path.join(tmp, f"{i}-{name}") for name, var in CACHES.items()}
            outs.append(os.path.join(tmp, f"{i}.json"))
            procs.append(subprocess.Popen(
                [sys.executable, script, *argv, "--ready-dir", ready, "--out", outs[-1]],
                env=dict(os.environ, **{PEERS: str(len(argvs))}, **caches, **(env or {})),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        tails = [p.communicate(timeout=timeout)[0][-1500:] for p in procs]
        if not all(os.path.exists(o) for o in outs):
            return "\n".join(tails)
        parts = []
        for o in outs:
            with open(o) as f:
                parts.append(json.load(f))
        return parts


def start_together(ready_dir: str, deadline: float) -> None:
    """In a child of ``in_processes``: says it is ready, then waits (until ``deadline``,
    time.perf_counter()) for every process of the run to say so."""
    import time
    open(os.path.join(ready_dir, str(os.getpid())), "w").close()
    while len(os.listdir(ready_dir)) < int(os.environ[PEERS]) and time.perf_counter() < deadline:
        time.sleep(0.05)


def _tail(*outputs) -> str:
    text = "".join(o.decode(errors="replace") if isinstance(o, bytes) else (o or "") for o in outputs)
    return text[-2000:]


def print_figures(report: dict, *, width: int = 76, baselines: dict | None = None) -> None:
    """A report's ns_per_call, each with its ratio to its baseline (and the baseline's name)."""
    where = report["machine"].get("gpu") or report["machine"]["arch"]
    print(f"{report['benchmark']}  torch {report['torch'] or '-'}  Python {report['python']}  "
          f"{where}  {report['date']}")
    for name, value in report["ns_per_call"].items():
        ratio = f"{report['ratios'][name]:.3f}x" if name in report["ratios"] else ""
        print(f"{name:<{width}} {value:8.1f} ns {ratio:>7}  {(baselines or {}).get(name, '')}".rstrip())
