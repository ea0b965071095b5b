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

    python benchmarks/concurrent_compile.py                       # CPU, tiny, all modes
    python benchmarks/concurrent_compile.py --device cuda         # all threads on one GPU
    python benchmarks/concurrent_compile.py --devices 0,1,2       # one thread per GPU
    ... --json out.json --plot memory.png

On CPU, flex_attention has no backward (torch raises NotImplementedError), so
the CPU variant runs forward-only steps and says so.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter

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


def classify(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:90]}"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_mode(args) -> dict:
    """One mode, in this process.  Returns the figures as a dict."""
    import torch

    if args.mode == "fxguard":
        import fxguard
        fxguard.install()
    elif args.mode == "always-false":
        torch.fx._symbolic_trace.is_fx_symbolic_tracing = lambda: False  # before any torch.compile
    from torch.nn.attention.flex_attention import create_block_mask

    devices = [d for d in args.devices.split(",")] if args.devices else [args.device] * args.threads
    if args.devices:
        devices = [f"cuda:{d}" for d in devices]
    kind = "cuda" if devices[0].startswith("cuda") else "cpu"
    size = SIZES[kind]
    train = kind == "cuda"  # CPU flex_attention has no backward
    step_lock = threading.Lock()
    n = len(devices)
    steps = [0] * n
    first_step_at = [None] * n
    errors: Counter = Counter()
    first_tracebacks: dict[str, str] = {}
    samples: list[dict] = []
    stop = threading.Event()
    tokens = [0] * n
    start = time.monotonic()

    def drafter(i: int) -> None:
        device = devices[i]
        rng = random.Random(args.seed + i)
        torch.manual_seed(args.seed + i)
        model = build_model(torch, size["dim"], size["heads"], size["layers"], device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if train else None
        while not stop.is_set():
            seq_len = rng.choice(size["seq_lens"])
            try:
                ctx = step_lock if args.mode == "serialized" else _null()
                with ctx:
                    block_mask = document_mask(torch, create_block_mask, seq_len, rng, device)
                    x = torch.randn(1, seq_len, size["dim"], device=device)
                    if train:
                        loss = model(x, block_mask).float().pow(2).mean()
                        loss.backward()
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    else:
                        with torch.no_grad():
                            model(x, block_mask)
                    if kind == "cuda":
                        torch.cuda.synchronize(device)
                steps[i] += 1
                tokens[i] += seq_len
            except Exception as e:  # keep going: count and classify
                what = classify(e)
                if what not in errors:
                    first_tracebacks[what] = traceback.format_exc()[-6000:]
                errors[what] += 1
                time.sleep(0.01)
            if first_step_at[i] is None:
                first_step_at[i] = time.monotonic() - start

    if kind == "cuda":  # the allocator's stats are only valid once a device was used
        for d in sorted(set(devices)):
            torch.zeros(1, device=d)
    threads = [threading.Thread(target=drafter, args=(i,), daemon=True, name=f"drafter-{i}")
               for i in range(n)]
    for t in threads:
        t.start()

    # Sample memory, print progress, watch for a stall.
    window_start = steady_at = steady_steps0 = steady_tokens0 = None
    last_progress, last_total, last_print = time.monotonic(), -1, 0.0
    last_success, last_steps = time.monotonic(), 0
    status = "ok"
    while True:
        time.sleep(args.sample)
        now = time.monotonic()
        total = sum(steps) + sum(errors.values())
        if total != last_total:
            last_total, last_progress = total, now
        if sum(steps) != last_steps:
            last_steps, last_success = sum(steps), now
        if kind == "cuda":
            mem = {d: torch.cuda.max_memory_allocated(d) for d in sorted(set(devices))}
            for d in mem:
                torch.cuda.reset_peak_memory_stats(d)
        else:
            mem = {"cpu": rss_bytes()}
        samples.append({"t": round(now - start, 2), "steps": sum(steps), "memory": mem})
        if now - last_print >= args.progress:
            last_print = now
            print(f"  [{args.mode}] t={now - start:5.0f}s steps/thread={steps} errors={sum(errors.values())}",
                  flush=True)
        if window_start is None and all(f is not None for f in first_step_at):
            window_start = now
        # Rates count the second half of the window: the first half still
        # compiles the shapes that no thread has met yet.
        if window_start is not None and steady_at is None and now - window_start >= args.seconds / 2:
            steady_at, steady_steps0, steady_tokens0 = now, sum(steps), sum(tokens)
        if window_start is not None and now - window_start >= args.seconds:
            break
        if errors and now - last_success > args.stall:
            status = "failing"  # errors only: every step fails
            break
        if now - last_progress > args.stall:
            status = "deadlocked"
            with tempfile.NamedTemporaryFile("w+", suffix=".txt", delete=False) as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
                f.seek(0)
                stacks = f.read()
            break
        if now - start > args.max_seconds:
            status = "timeout"
            break
    stop.set()
    window = (time.monotonic() - steady_at) if steady_at else None
    result = {
        "status": status,
        "train": train,
        "threads": n,
        "devices": devices,
        "time_to_first_step_s": max(first_step_at) if all(f is not None for f in first_step_at) else None,
        "first_step_s_per_thread": first_step_at,
        "steady_window_s": window,  # the second half of --seconds after every thread's first step
        "steps_per_s": (sum(steps) - steady_steps0) / window if window else None,
        "tokens_per_s": (sum(tokens) - steady_tokens0) / window if window else None,
        "steps_per_thread": steps,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "first_tracebacks": first_tracebacks,
        "graphs_compiled": _counter(torch, "stats", "unique_graphs"),
        "recompiles": _counter(torch, "recompiles", None),
        "memory_samples": samples,
        "memory_flatness": flatness(samples, steady_at and (steady_at - start)),
    }
    if status == "deadlocked":
        result["stacks"] = stacks[-20000:]
    return result


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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

def versions() -> dict:
    import torch
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
            "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpus"] = torch.cuda.device_count()
    try:
        import fxguard
        info["fxguard"] = fxguard.__version__
    except ImportError:
        pass
    return info


def run_all(args) -> dict:
    report = {"versions": versions(), "settings": {k: v for k, v in vars(args).items() if k != "worker"},
              "modes": {}}
    for mode in args.modes.split(","):
        print(f"== mode {mode}", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"fxguard-bench-{mode}-", ignore_cleanup_errors=True) as tmp:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                       TRITON_CACHE_DIR=os.path.join(tmp, "triton"), PYTHONUNBUFFERED="1")
            out = os.path.join(tmp, "mode.json")
            cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--out", out] + _passthrough(args)
            try:
                proc = subprocess.run(cmd, env=env, timeout=args.max_seconds + args.stall + 120)
                ok = proc.returncode == 0 and os.path.exists(out)
                report["modes"][mode] = json.load(open(out)) if ok else \
                    {"status": f"crashed (exit {proc.returncode})", "errors": None}
            except subprocess.TimeoutExpired:
                report["modes"][mode] = {"status": "deadlocked (no answer)", "errors": None}
    print_table(report)
    return report


def _passthrough(args) -> list[str]:
    out = ["--threads", str(args.threads), "--seconds", str(args.seconds), "--stall", str(args.stall),
           "--max-seconds", str(args.max_seconds), "--seed", str(args.seed), "--sample", str(args.sample),
           "--progress", str(args.progress), "--device", args.device]
    return out + (["--devices", args.devices] if args.devices else [])


def print_table(report: dict) -> None:
    v = report["versions"]
    print(f"\ntorch {v['torch']}  Python {v['python']}  {v.get('gpu', v['machine'])}  {v['date']}")
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
    v = report["versions"]
    ax.set(xlabel="steps completed (all threads)", ylabel="peak memory per window, MiB",
           title=f"memory over steps: torch {v['torch']}, {v.get('gpu', 'CPU RSS')}")
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
    p.add_argument("--json")
    p.add_argument("--plot")
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
