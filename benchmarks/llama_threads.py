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
  on torch >= 2.13 without fxguard).

No download: the model is built from a config.  Needs ``transformers``.

    python benchmarks/llama_threads.py [--device cuda] [--threads 3] [--seconds 40] [--json out.json] [--save]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import _harness

MODES = ("stock", "serialized", "fxguard", "fxguard-no-share")
SEQ_LENS = {"cpu": (64, 96, 128, 160), "cuda": (256, 512, 768, 1024, 1536, 2048)}


def child(mode: str, device: str, threads: int, seconds: float, out: str) -> None:
    import torch
    import transformers
    from transformers.integrations import flex_attention as tf_flex

    if mode.startswith("fxguard"):
        import fxguard
        fxguard.install(compile_once=mode == "fxguard")
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
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=4096)
    start = time.perf_counter()
    first, all_shapes, steps, errors = {}, {}, [0] * threads, []
    stop = threading.Event()

    def drafter(i: int) -> None:
        torch.manual_seed(i)
        model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="flex_attention")
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
    with open(out, "w") as f:
        json.dump(result, f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--modes", default=",".join(MODES))
    _harness.add_output_options(p)
    p.add_argument("--child")
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        child(args.child, args.device, args.threads, args.seconds, args.out)
        return 0
    report = {**_harness.envelope("llama_threads", import_torch=True),
              "args": {k: v for k, v in vars(args).items() if k not in ("child", "out", "json", "save")},
              "modes": {}}
    output = _harness.Output(args)
    for mode in args.modes.split(","):
        argv = ["--child", mode, "--device", args.device, "--threads", str(args.threads),
                "--seconds", str(args.seconds)]
        r = _harness.in_fresh_process(__file__, argv, timeout=args.seconds + 400,
                                      env={"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"})
        report["modes"][mode] = r if "status" not in r else {"mode": mode, **r}
        print(json.dumps(report["modes"][mode]), flush=True)
        output.write(report)  # after each mode: a cut-off run keeps what it measured
    ours, lock = report["modes"].get("fxguard", {}), report["modes"].get("serialized", {})
    if ours.get("time_until_all_stepped_s") and lock.get("time_until_all_stepped_s"):
        report["fxguard_vs_serialized_time_until_all_stepped"] = round(
            ours["time_until_all_stepped_s"] / lock["time_until_all_stepped_s"], 3)
        print("time until all stepped, fxguard / serialized:",
              report["fxguard_vs_serialized_time_until_all_stepped"])
    output.write(report)
    return 0 if all("status" not in m for m in report["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
