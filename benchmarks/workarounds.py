"""Concurrent compile vs. the ways people cope with the FX-flag race, drafter-style.

N threads in one process, each a small attention model (Q/K/V projections,
torch.compile(flex_attention), MLP) that trains (forward + backward + optimizer
step) with a fresh document-packed causal BlockMask from create_block_mask
every step, from varying document lengths and sequence lengths, so that new
shapes (recompiles) in one thread overlap steady-state steps in the others.

Modes, each in a fresh process with its own inductor/triton cache:
  stock         no guard (errors are counted and classified; threads keep going)
  always-false  is_fx_symbolic_tracing forced to return False (a common workaround)
  serialized    one process-wide lock around each whole training step
  fxguard       fxguard.install()

    python benchmarks/workarounds.py                       # CPU, tiny, all modes
    python benchmarks/workarounds.py --device cuda         # all threads on one GPU
    python benchmarks/workarounds.py --devices 0,1,2       # one thread per GPU
    ... --json out.json --plot memory.png   (or --save: results/workarounds/)

On CPU, flex_attention has no backward (torch raises NotImplementedError), so
the CPU variant runs forward-only steps and says so.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import random
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass

import _harness

MODES = ("stock", "always-false", "serialized", "fxguard")
SIZES = {  # tiny on CPU so that all four modes finish in minutes on 2 cores
    "cpu": dict(dim=64, heads=4, layers=2, seq_lens=(128, 192, 256, 320, 384, 448)),
    "cuda": dict(dim=512, heads=8, layers=4, seq_lens=(1024, 1536, 2048, 2560, 3072, 4096)),
}


# -- the workload (runs inside one mode's process) -------------------------------

def build_model(torch, dim, heads, layers, device):
    from torch.nn.attention.flex_attention import flex_attention
    nn = torch.nn
    # Each drafter compiles its own, as users do; static shapes: one compile per shape.
    flex = torch.compile(flex_attention, dynamic=False)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x, block_mask):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            attn = flex(q, k, v, block_mask=block_mask).transpose(1, 2).reshape(b, s, dim)
            x = x + self.out(attn)
            return x + self.mlp(self.norm2(x))

    class Drafter(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(dim, dim)

        def forward(self, x, block_mask):
            for block in self.blocks:
                x = block(x, block_mask)
            return self.head(x)

    return Drafter().to(device)


def document_mask(torch, create_block_mask, seq_len, rng, device):
    cuts = sorted(rng.sample(range(1, seq_len), rng.randint(1, 6)))
    lengths = [b - a for a, b in zip([0] + cuts, cuts + [seq_len])]
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.tensor(lengths, device=device))

    def doc_causal(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    return create_block_mask(doc_causal, None, None, seq_len, seq_len, device=device)


def prepare_mode(mode: str):
    """torch, with the mode's guard or workaround in place before any torch.compile."""
    import torch

    if mode == "fxguard":
        import fxguard
        fxguard.install()
    elif mode == "always-false":
        torch.fx._symbolic_trace.is_fx_symbolic_tracing = lambda: False
    return torch


def mode_devices(args) -> list[str]:
    if args.devices:
        return [f"cuda:{d}" for d in args.devices.split(",")]
    return [args.device] * args.threads


@dataclass
class Watch:
    """What the watching thread has seen: last progress, last success, the measured window."""
    last_progress: float
    last_success: float
    last_total: int = -1
    last_steps: int = 0
    last_print: float = 0.0
    window_start: float | None = None
    steady_at: float | None = None  # rates count from here: the second half of the window
    steady_steps0: int = 0
    steady_tokens0: int = 0
    stacks: str = ""


class DrafterRun:
    """One mode's drafter threads, and what they share with the thread that watches them."""

    def __init__(self, torch, args, devices: list[str]):
        from torch.nn.attention.flex_attention import create_block_mask
        self.torch, self.args, self.devices = torch, args, devices
        self.create_block_mask = create_block_mask
        self.kind = "cuda" if devices[0].startswith("cuda") else "cpu"
        self.size = SIZES[self.kind]
        self.train = self.kind == "cuda"  # CPU flex_attention has no backward
        self.step_lock = threading.Lock() if args.mode == "serialized" else contextlib.nullcontext()
        n = len(devices)
        self.steps, self.tokens, self.first_step_at = [0] * n, [0] * n, [None] * n
        self.errors: Counter = Counter()
        self.first_tracebacks: dict[str, str] = {}
        self.samples: list[dict] = []
        self.stop = threading.Event()
        self.start = time.monotonic()

    # -- the drafter threads

    def start_threads(self) -> None:
        if self.kind == "cuda":  # the allocator's stats are only valid once a device was used
            for d in sorted(set(self.devices)):
                self.torch.zeros(1, device=d)
        for i in range(len(self.devices)):
            threading.Thread(target=self.drafter, args=(i,), daemon=True, name=f"drafter-{i}").start()

    def drafter(self, i: int) -> None:
        torch, device, size = self.torch, self.devices[i], self.size
        rng = random.Random(self.args.seed + i)
        torch.manual_seed(self.args.seed + i)
        model = build_model(torch, size["dim"], size["heads"], size["layers"], device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if self.train else None
        while not self.stop.is_set():
            seq_len = rng.choice(size["seq_lens"])
            try:
                with self.step_lock:
                    self.step(model, opt, seq_len, rng, device)
                self.steps[i] += 1
                self.tokens[i] += seq_len
            except Exception as e:  # keep going: count and classify
                self.count_error(e)
                time.sleep(0.01)
            if self.first_step_at[i] is None:
                self.first_step_at[i] = time.monotonic() - self.start

    def step(self, model, opt, seq_len: int, rng, device: str) -> None:
        torch = self.torch
        block_mask = document_mask(torch, self.create_block_mask, seq_len, rng, device)
        x = torch.randn(1, seq_len, self.size["dim"], device=device)
        if self.train:
            loss = model(x, block_mask).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(x, block_mask)
        if self.kind == "cuda":
            torch.cuda.synchronize(device)

    def count_error(self, e: Exception) -> None:
        what = _harness.error_kind(e, width=90)
        if what not in self.errors:
            self.first_tracebacks[what] = traceback.format_exc()[-6000:]
        self.errors[what] += 1

    # -- the watching thread

    def watch(self) -> tuple[str, Watch]:
        """Samples until the window is over or nothing moves; the status, and what it saw."""
        w = Watch(last_progress=time.monotonic(), last_success=time.monotonic())
        while True:
            time.sleep(self.args.sample)
            now = time.monotonic()
            self.observe(now, w)
            status = self.verdict(now, w)
            if status:
                return status, w

    def observe(self, now: float, w: Watch) -> None:
        total = sum(self.steps) + sum(self.errors.values())
        if total != w.last_total:
            w.last_total, w.last_progress = total, now
        if sum(self.steps) != w.last_steps:
            w.last_steps, w.last_success = sum(self.steps), now
        self.samples.append({"t": round(now - self.start, 2), "steps": sum(self.steps),
                             "memory": self.memory()})
        if now - w.last_print >= self.args.progress:
            w.last_print = now
            print(f"  [{self.args.mode}] t={now - self.start:5.0f}s steps/thread={self.steps} "
                  f"errors={sum(self.errors.values())}", flush=True)
        if w.window_start is None and all(f is not None for f in self.first_step_at):
            w.window_start = now
        # Rates count the second half of the window: the first half still
        # compiles the shapes that no thread has met yet.
        half = self.args.seconds / 2
        if w.window_start is not None and w.steady_at is None and now - w.window_start >= half:
            w.steady_at, w.steady_steps0, w.steady_tokens0 = now, sum(self.steps), sum(self.tokens)

    def memory(self) -> dict:
        """Peak memory since the last sample per GPU, or the process's RSS on CPU."""
        if self.kind != "cuda":
            return {"cpu": _harness.rss_bytes()}
        mem = {d: self.torch.cuda.max_memory_allocated(d) for d in sorted(set(self.devices))}
        for d in mem:
            self.torch.cuda.reset_peak_memory_stats(d)
        return mem

    def verdict(self, now: float, w: Watch) -> str | None:
        """How the mode ended, or None while it goes on."""
        if w.window_start is not None and now - w.window_start >= self.args.seconds:
            return "ok"
        if self.errors and now - w.last_success > self.args.stall:
            return "failing"  # errors only: every step fails
        if now - w.last_progress > self.args.stall:
            w.stacks = all_stacks()
            return "deadlocked"
        if now - self.start > self.args.max_seconds:
            return "timeout"
        return None

    def result(self, status: str, w: Watch) -> dict:
        window = (time.monotonic() - w.steady_at) if w.steady_at else None
        first = self.first_step_at
        result = {
            "status": status,
            "train": self.train,
            "threads": len(self.devices),
            "devices": self.devices,
            "time_to_first_step_s": max(first) if all(f is not None for f in first) else None,
            "first_step_s_per_thread": first,
            "steady_window_s": window,  # the second half of --seconds after every thread's first step
            "steps_per_s": (sum(self.steps) - w.steady_steps0) / window if window else None,
            "tokens_per_s": (sum(self.tokens) - w.steady_tokens0) / window if window else None,
            "steps_per_thread": self.steps,
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            "first_tracebacks": self.first_tracebacks,
            "graphs_compiled": _counter(self.torch, "stats", "unique_graphs"),
            "recompiles": _counter(self.torch, "recompiles", None),
            "memory_samples": self.samples,
            "memory_flatness": flatness(self.samples, w.steady_at and (w.steady_at - self.start)),
        }
        if status == "deadlocked":
            result["stacks"] = w.stacks[-20000:]
        return result


def run_mode(args) -> dict:
    """One mode, in this process: its figures."""
    torch = prepare_mode(args.mode)
    run = DrafterRun(torch, args, mode_devices(args))
    run.start_threads()
    status, seen = run.watch()
    run.stop.set()
    return run.result(status, seen)


def all_stacks() -> str:
    with tempfile.TemporaryFile("w+", suffix=".txt") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


def _counter(torch, group, key):
    counters = torch._dynamo.utils.counters.get(group, {})
    return counters.get(key, 0) if key else sum(counters.values())


def flatness(samples, steady_from):
    """(max - min) / mean of the per-window peak, after warm-up (per device)."""
    if steady_from is None:
        return None
    out = {}
    for dev in samples[-1]["memory"] if samples else []:
        values = [s["memory"][dev] for s in samples if s["t"] >= steady_from]
        if len(values) >= 2 and sum(values):
            mean = sum(values) / len(values)
            out[dev] = round((max(values) - min(values)) / mean, 4)
    return out


# -- the orchestrator: one fresh process per mode --------------------------------

def run_all(args) -> dict:
    settings = {k: v for k, v in vars(args).items() if k not in ("worker", "mode", "out", "json", "save")}
    report = {**_harness.envelope("workarounds", import_torch=True), "settings": settings, "modes": {}}
    for mode in args.modes.split(","):
        print(f"== mode {mode}", flush=True)
        report["modes"][mode] = _harness.in_fresh_process(
            __file__, ["--worker", "--mode", mode] + _passthrough(args), capture=False,
            env={"PYTHONUNBUFFERED": "1"}, timeout=args.max_seconds + args.stall + 120)
    print_table(report)
    return report


def _passthrough(args) -> list[str]:
    out = ["--threads", str(args.threads), "--seconds", str(args.seconds), "--stall", str(args.stall),
           "--max-seconds", str(args.max_seconds), "--seed", str(args.seed), "--sample", str(args.sample),
           "--progress", str(args.progress), "--device", args.device]
    return out + (["--devices", args.devices] if args.devices else [])


def print_table(report: dict) -> None:
    print(f"\ntorch {report['torch']}  Python {report['python']}  "
          f"{report['machine'].get('gpu', report['machine']['arch'])}  {report['date']}")
    cols = ["mode", "status", "train", "first step s", "steps/s", "tokens/s", "errors", "graphs", "mem flat"]
    print("  ".join(f"{c:>12}" for c in cols))
    for mode, r in report["modes"].items():
        def f(x, fmt="{:.1f}"):
            return fmt.format(x) if isinstance(x, (int, float)) else str(x if x is not None else "-")
        flat = r.get("memory_flatness") or {}
        row = [mode, r.get("status"), r.get("train"), f(r.get("time_to_first_step_s")),
               f(r.get("steps_per_s"), "{:.2f}"), f(r.get("tokens_per_s"), "{:.0f}"), f(r.get("errors"), "{}"),
               f(r.get("graphs_compiled"), "{}"), ",".join(f"{x:.3f}" for x in flat.values()) or "-"]
        print("  ".join(f"{str(c)[:12]:>12}" for c in row))
    for mode, r in report["modes"].items():
        for kind, count in (r.get("error_kinds") or {}).items():
            print(f"  {mode}: {count} x {kind}")


def plot(report: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for mode, r in report["modes"].items():
        samples = r.get("memory_samples") or []
        for dev in (samples[-1]["memory"] if samples else []):
            ax.plot([s["steps"] for s in samples], [s["memory"][dev] / 2**20 for s in samples],
                    label=f"{mode} ({dev})")
    ax.set(xlabel="steps completed (all threads)", ylabel="peak memory per window, MiB",
           title=f"memory over steps: torch {report['torch']}, {report['machine'].get('gpu', 'CPU RSS')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--devices", help="comma-separated GPU indices, one thread per GPU")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seconds", type=float, default=20, help="steady-state window per mode")
    p.add_argument("--stall", type=float, default=120, help="no progress for this long = deadlocked")
    p.add_argument("--max-seconds", type=float, default=420, help="cap per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=float, default=0.5, help="memory sampling period, s")
    p.add_argument("--progress", type=float, default=5, help="progress line period, s")
    _harness.add_output_options(p)
    p.add_argument("--plot", metavar="PATH", help="memory over steps (needs matplotlib)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        result = run_mode(args)
        with open(args.out, "w") as f:
            json.dump(result, f)
        sys.stdout.flush()
        os._exit(0)  # drafter threads may be stuck (deadlocked mode): do not join them
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}")
    report = run_all(args)
    _harness.Output(args).write(report)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
