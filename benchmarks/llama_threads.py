"""The real client: N threads, each a small random LlamaForCausalLM with
``attn_implementation="flex_attention"`` (transformers), cycling sequence
lengths from a cold cache.  Per mode (stock, one lock around every step,
fxguard, fxguard without compile once), each in a fresh process with its own
inductor cache:

- time until every thread has stepped once, and until every thread has run
  every sequence length once (all shapes compiled);
- steps per thread, errors, graphs dynamo compiled (``unique_graphs``);
- uncompiled flex_attention calls: transformers picks the unfused
  flex_attention whenever ``torch.compiler.is_compiling()`` reads True
  (counted at transformers' own check, which another thread's compile flips
  on torch >= 2.13 without fxguard);
- steady steps: once every thread has run every length, steps per second of
  all threads in a ``--window`` and fairness (the slowest thread's steps over
  the fastest's).

More modes: fxguard with each thread inside ``cuda_graph_thread()`` (a stream
of its own, backwards in turn: "fxguard-turns"; paced: "fxguard-paced"),
fxguard with ``concurrent_compiles``, and "processes" (one drafter in each of
N processes, windows started together).  ``--distinct`` gives each thread a
model of another width, so no two threads share a graph.

No download: the model is built from a config.  Needs ``transformers``.

    python benchmarks/llama_threads.py [--device cuda] [--threads 3] [--seconds 40] [--window 10]
        [--distinct] [--modes ...] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import _harness

MODES = ("stock", "serialized", "fxguard", "fxguard-no-share")
MORE_MODES = ("fxguard-turns", "fxguard-paced", "fxguard-concurrent", "processes")
INSTALL = {"fxguard": {}, "fxguard-no-share": {"compile_once": False}, "fxguard-turns": {},
           "fxguard-paced": {}, "fxguard-concurrent": {"concurrent_compiles": True}}
TURNS = {"fxguard-turns": True, "fxguard-paced": "paced"}
SEQ_LENS = {"cpu": (64, 96, 128, 160), "cuda": (256, 512, 768, 1024, 1536, 2048)}


def child(mode: str, device: str, threads: int, seconds: float, out: str, window: float = 0.0,
          distinct: bool = False, ready_dir: str | None = None, offset: int = 0) -> None:
    """``seconds``: the run's length, or with ``window`` the longest wait for every
    thread to have run every length before the steady window starts."""
    import torch
    import transformers
    from transformers.integrations import flex_attention as tf_flex

    if mode in INSTALL:
        import fxguard
        fxguard.install(**INSTALL[mode])
    fallbacks = [0]
    check = tf_flex.is_torchdynamo_compiling

    def counting_check() -> bool:  # transformers' choice between compiled and unfused flex
        answer = check()
        fallbacks[0] += bool(answer)
        return answer

    tf_flex.is_torchdynamo_compiling = counting_check
    lock = threading.Lock() if mode == "serialized" else None
    train = device != "cpu"  # CPU flex_attention has no backward
    seq_lens = SEQ_LENS["cuda" if train else "cpu"]

    def config(i: int):  # --distinct: another width per drafter, so no graph is shared
        width = 256 + 64 * (i + offset) if distinct else 256
        return transformers.LlamaConfig(vocab_size=1000, hidden_size=width, intermediate_size=2 * width,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=4, max_position_embeddings=4096)
    start = time.perf_counter()
    first, all_shapes, steps, errors = {}, {}, [0] * threads, []
    stop = threading.Event()

    def drafter(i: int) -> None:
        if mode in TURNS and train:
            from fxguard import cuda_graph_thread
            with cuda_graph_thread(0, turns=TURNS[mode]):
                steps_of(i)
        else:
            steps_of(i)

    def steps_of(i: int) -> None:
        torch.manual_seed(i + offset)
        model = transformers.LlamaForCausalLM._from_config(config(i), attn_implementation="flex_attention")
        model.to(device).train(train)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        seen = set()
        n = 0
        while not stop.is_set():
            seq = seq_lens[n % len(seq_lens)]
            ids = torch.randint(0, 1000, (1, seq), device=device)
            try:
                if lock:
                    with lock:
                        step(model, opt, ids)
                else:
                    step(model, opt, ids)
            except Exception as e:
                errors.append(_harness.error_kind(e))
                if len(errors) > 200:
                    stop.set()
            n += 1
            steps[i] += 1
            first.setdefault(i, time.perf_counter() - start)
            seen.add(seq)
            if len(seen) == len(seq_lens):
                all_shapes.setdefault(i, time.perf_counter() - start)

    def step(model, opt, ids) -> None:
        if train:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize(ids.device)
        else:
            with torch.no_grad():
                model(input_ids=ids)

    workers = [threading.Thread(target=drafter, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    steady = None
    if window:
        deadline = time.perf_counter() + seconds
        while len(all_shapes) < threads and time.perf_counter() < deadline and not stop.is_set():
            time.sleep(0.05)
        if ready_dir:  # processes: every one starts its window together
            _harness.start_together(ready_dir, deadline)
        before, t0 = list(steps), time.perf_counter()
        time.sleep(window)
        steady = {"steps": [b - a for a, b in zip(before, steps)], "window_s": round(time.perf_counter() - t0, 2)}
        if ready_dir:
            time.sleep(2)  # keep stepping while the others end their windows
    else:
        time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join(120)
    result = {
        "mode": mode, "train": train, "steps_per_thread": steps,
        "time_until_all_stepped_s": round(max(first.values()), 2) if len(first) == threads else None,
        "time_until_all_shapes_s": round(max(all_shapes.values()), 2) if len(all_shapes) == threads else None,
        "errors": len(errors), "error_kinds": sorted(set(errors))[:5],
        "uncompiled_flex_calls": fallbacks[0],
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if train else None,
    }
    if steady:
        result["steady_steps"] = steady["steps"]
        result["steady_window_s"] = steady["window_s"]
    with open(out, "w") as f:
        json.dump(result, f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--window", type=float, default=0.0,
                   help="steady steps: seconds of a window once every thread ran every length")
    p.add_argument("--distinct", action="store_true", help="another model width per drafter")
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES + MORE_MODES)}")
    _harness.add_output_options(p)
    p.add_argument("--child")
    p.add_argument("--out")
    p.add_argument("--ready-dir")
    p.add_argument("--offset", type=int, default=0)
    args = p.parse_args()
    if args.child:
        child(args.child, args.device, args.threads, args.seconds, args.out, args.window, args.distinct,
              args.ready_dir, args.offset)
        return 0
    report = {**_harness.envelope("llama_threads", import_torch=True),
              "args": {k: v for k, v in vars(args).items() if k not in ("child", "out", "json", "save")},
              "modes": {}}
    output = _harness.Output(args)
    for mode in args.modes.split(","):
        argv = ["--device", args.device, "--seconds", str(args.seconds), "--window", str(args.window),
                *(["--distinct"] if args.distinct else [])]
        if mode == "processes":
            r = _processes(argv, args)
        else:
            r = _harness.in_fresh_process(__file__, ["--child", mode, "--threads", str(args.threads), *argv],
                                          timeout=args.seconds + args.window + 400,
                                          env={"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"})
        r = r if "status" not in r else {"mode": mode, **r}
        if r.get("steady_steps"):
            r["steady_steps_per_s"] = round(sum(r["steady_steps"]) / r["steady_window_s"], 2)
            r["steady_fairness"] = round(min(r["steady_steps"]) / max(max(r["steady_steps"]), 1), 3)
        report["modes"][mode] = r
        print(json.dumps(report["modes"][mode]), flush=True)
        output.write(report)  # after each mode: a cut-off run keeps what it measured
    ours, lock = report["modes"].get("fxguard", {}), report["modes"].get("serialized", {})
    if ours.get("time_until_all_stepped_s") and lock.get("time_until_all_stepped_s"):
        report["fxguard_vs_serialized_time_until_all_stepped"] = round(
            ours["time_until_all_stepped_s"] / lock["time_until_all_stepped_s"], 3)
        print("time until all stepped, fxguard / serialized:",
              report["fxguard_vs_serialized_time_until_all_stepped"])
    report["ratios"] = ratios(report["modes"])
    output.write(report)
    return 0 if all("status" not in m for m in report["modes"].values()) else 1


def _processes(argv: list[str], args) -> dict:
    """One drafter in each of ``args.threads`` processes (caches of their own), windows
    started together; their figures as one mode's."""
    parts = _harness.in_processes(
        __file__, [["--child", "processes", "--threads", "1", *argv, "--offset", str(i)] for i in range(args.threads)],
        env={"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, timeout=args.seconds + args.window + 400)
    if isinstance(parts, str):
        return {"mode": "processes", "status": "failed", "detail": parts}

    def worst(key: str):
        values = [p[key] for p in parts]
        return None if None in values else max(values)
    out = {"mode": "processes", "train": parts[0]["train"],
           "steps_per_thread": [p["steps_per_thread"][0] for p in parts],
           "time_until_all_stepped_s": worst("time_until_all_stepped_s"),
           "time_until_all_shapes_s": worst("time_until_all_shapes_s"),
           "errors": sum(p["errors"] for p in parts),
           "error_kinds": sorted({k for p in parts for k in p["error_kinds"]})[:5],
           "uncompiled_flex_calls": sum(p["uncompiled_flex_calls"] for p in parts),
           "graphs": sum(p["graphs"] for p in parts),
           "gpu_peak_gib": None if parts[0]["gpu_peak_gib"] is None else round(sum(p["gpu_peak_gib"] for p in parts), 2)}
    if all("steady_steps" in p for p in parts):
        out["steady_steps"] = [p["steady_steps"][0] for p in parts]
        out["steady_window_s"] = max(p["steady_window_s"] for p in parts)
    return out


def ratios(modes: dict) -> dict:
    """Steady steps of each fxguard mode against one lock and against processes;
    time until every thread ran every length against processes'."""
    out = {}
    for mode in ("fxguard", *MORE_MODES[:-1]):
        for base in ("serialized", "processes"):
            a, b = modes.get(mode, {}).get("steady_steps_per_s"), modes.get(base, {}).get("steady_steps_per_s")
            if a and b:
                out[f"{mode}_vs_{base}_steady_steps"] = round(a / b, 3)
        a, b = modes.get(mode, {}).get("time_until_all_shapes_s"), modes.get("processes", {}).get("time_until_all_shapes_s")
        if a and b:
            out[f"{mode}_vs_processes_time_until_all_shapes"] = round(a / b, 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
