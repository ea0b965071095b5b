"""Small drafters in threads, with the step a user who wants speed writes.

A drafter-like model of our own (embedding, 2 layers with ``flex_attention``,
LM head, loss in the graph; B=2, lengths 256 and 512 in turn), training on one
GPU.  Two steps:

- *fast*: ``torch.compile(create_block_mask)`` made once per drafter (torch's
  advice; ``_compile=True`` builds a new compile wrapper each call:
  block_mask_call.py), the model under
  ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), ``AdamW.step``
  compiled;
- *plain*: the model under ``torch.compile`` (default mode), mask creation and
  optimizer eager.

Modes, each in fresh processes with empty compile caches:
``threads-fast`` (3 threads, fxguard), ``threads-plain`` (3 threads, fxguard),
``one-plain`` and ``one-fast`` (1 thread, fxguard), ``processes-fast`` (3
processes, one drafter each, stock torch: what threads replace),
``threads-fast-stock`` (3 threads, no fxguard), ``one-fast-stock`` (1 thread,
no fxguard: what fxguard costs a step; on torch <= 2.12 not under --probe,
whose import of the trees in the main thread leaves the drafter's without).
Figures: time until every drafter ran every length, then a window in which all
run: steps per second (all drafters together), CPU seconds per step (the
drafters' threads, and the process's) and per phase of a step, fairness
(slowest drafter's steps ÷ fastest's), errors, and the GPU memory in use at
peak (the parent polls the device; CUDA contexts included).

    python benchmarks/cuda_graph_drafters.py [--modes ...] [--seconds 20] [--json out.json] [--save]
        [--resume part.json]

The user's variants (``threads-fast-api``, ``-default-generator``, ``-dropout``,
``-default-stream``, ``-no-turns``, ``-paced``: ``VARIANTS``) run the fast step as users write
it, with fxguard's ``cuda_graph_thread()`` in place of the hand-written stream and
turns, each with its errors counted.

``--resume`` starts from a report an earlier run wrote (same torch, same
settings) and runs only the modes it lacks: the modes can be split over
several calls of a machine lent for minutes at a time.

Each drafter runs on a CUDA stream of its own (``Drafters.run`` says why).
``--probe`` counts what each CUDA-graph call became, per thread (diagnosis: not saved).

``--device cpu`` runs the same steps on the CPU (inductor skips CUDA graphs
there): a check that the script and the fast step's pieces work in threads,
not a figure to record (``--save`` refuses it).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import traceback

import _harness

# The option the fast step needs, named so the report says so; the plain modes take it
# too, so both sides run under the same rows.
FXGUARD_OPTIONS = {"cuda_graphs_per_thread": True}
# The step as users write it, three fast threads under fxguard (errors counted):
# "api", the loop inside fxguard's cuda_graph_thread() (a stream of its own,
# backwards in turn) instead of the hand-written stream and Turns; the others
# change one thing each: the batch from the default CUDA generator, dropout in the
# graphed model, the default stream with no turns and a device sync each step
# (what a user who knows none of it writes), no turns, backwards paced (none more
# than two ahead of the slowest thread: cuda_graph_thread(turns="paced")).
VARIANTS = {
    "threads-fast-api": {},
    "threads-fast-default-generator": {"default_generator": True},
    "threads-fast-dropout": {"dropout": 0.1},
    "threads-fast-default-stream": {"api": False, "sync": True},
    "threads-fast-no-turns": {"turns": False},
    "threads-fast-paced": {"turns": "paced"},
}
MODES = ("threads-fast", "threads-plain", "one-plain", "one-fast", "processes-fast", "threads-fast-stock",
         "one-fast-stock", *VARIANTS)
ONE_THREAD = ("one-plain", "one-fast", "one-fast-stock")
WITH_FXGUARD = ("threads-fast", "threads-plain", "one-plain", "one-fast", *VARIANTS)
# Where a step's time goes, per drafter: wall and thread CPU of each phase.  CPU counts
# CUDA's spin in the step's sync (.item), and not time spent waiting for the GIL.
PHASES = ("mask", "forward", "backward", "optimizer", "zero_grad", "item")
# Diagnosis: DRAFTER_LENGTHS=256, one length, so no step starts another graph;
# DRAFTER_FAST=model, only some pieces of the fast step (mask, model, optimizer), or
# others: mask-flag (create_block_mask(_compile=True) each step), mask-in-graph (the
# block mask built inside the model's graph), optimizer-graphed (the optimizer step
# under reduce-overhead); DRAFTER_NO_GC=1, no cyclic GC;
# DRAFTER_STREAMS=0, every drafter on the default stream; DRAFTER_SWITCH_INTERVAL=0.0005,
# sys.setswitchinterval (how long a thread that wants the GIL waits before it asks the
# holder to drop it: the autograd worker that runs every thread's backward waits so).
# DRAFTER_BACKWARD_HERE=1, each drafter's backward on its own thread
# (torch.autograd.set_multithreading_enabled(False), thread-local), not on the one
# autograd worker per device that otherwise runs every thread's; DRAFTER_FAIR_BACKWARD=1,
# drafters start their backwards in turn (a first-come ticket), so the worker's queue,
# which serves the highest per-thread sequence number first, holds one at a time.
# DRAFTER_FXGUARD_OPTIONS=compile_once=0, install() options over FXGUARD_OPTIONS (as in
# FXGUARD_OPTIONS), in the fxguard modes; DRAFTER_WATCH_CONFIG=1, the report's
# config_events: who set inductor's triton.cudagraphs, to what, from where (on torch
# <= 2.11 that config is process-wide). DRAFTER_DUMP_AFTER=120, every thread's stack
# that many seconds after a child starts, into DRAFTER_DUMP_DIR (a hang's diagnosis);
# DRAFTER_STALL_DUMP=20, the same (and fxguard's capture marks and turns) once, when a
# drafter has made no step for that long while another made some (a stall, caught as
# it happens). DRAFTER_WATCH_RECORDINGS=1, the report's recordings: how fxguard
# planned each CUDA-graph recording, per thread. DRAFTER_GIL_METER=1, the report's gil:
# milliseconds per step that each phase's threads held the GIL, that other threads (the
# autograd worker) held it, and its share held in the window (_gil_meter.py: a native
# thread reads the GIL; its own CPU is taken out of process_cpu_s_per_step). A report
# names those set.
KNOBS = ("DRAFTER_LENGTHS", "DRAFTER_FAST", "DRAFTER_NO_GC", "DRAFTER_STREAMS", "DRAFTER_SWITCH_INTERVAL",
         "DRAFTER_BACKWARD_HERE", "DRAFTER_FAIR_BACKWARD", "DRAFTER_FXGUARD_OPTIONS", "DRAFTER_WATCH_CONFIG",
         "DRAFTER_GIL_METER",
         "DRAFTER_DUMP_AFTER", "DRAFTER_STALL_DUMP", "DRAFTER_WATCH_RECORDINGS")
LENGTHS = tuple(int(n) for n in os.environ.get("DRAFTER_LENGTHS", "256,512").split(","))
FAST_PIECES = tuple(os.environ.get("DRAFTER_FAST", "mask,model,optimizer").split(","))
OWN_STREAMS = os.environ.get("DRAFTER_STREAMS") != "0"
SWITCH_INTERVAL = os.environ.get("DRAFTER_SWITCH_INTERVAL")
NO_GC = bool(os.environ.get("DRAFTER_NO_GC"))
BACKWARD_HERE = os.environ.get("DRAFTER_BACKWARD_HERE") == "1"
FAIR_BACKWARD = os.environ.get("DRAFTER_FAIR_BACKWARD") == "1"
BATCH, VOCAB, HIDDEN, HEADS, LAYERS = 2, 4096, 256, 4, 2


def fast_mask() -> str:
    """How the fast step makes its block mask (reports before this field: _compile=True)."""
    return ("in the model's graph" if "mask-in-graph" in FAST_PIECES else
            "_compile=True each step" if "mask-flag" in FAST_PIECES else
            "compiled once" if "mask" in FAST_PIECES else "eager")


def build(torch, seed: int, device: str, dropout: float = 0.0):
    from torch import nn
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
            self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
            self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))
            self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

        def forward(self, x, block_mask):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4)
            if device == "cpu":  # flex_attention has no backward on the CPU
                q, k, v = q.detach(), k.detach(), v.detach()
            a = flex_attention(q, k, v, block_mask=block_mask)
            x = x + self.drop(self.out(a.transpose(1, 2).reshape(b, s, HIDDEN)))
            return x + self.mlp(self.norm2(x))

    class Drafter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm, self.head = nn.RMSNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)

        def forward(self, ids, labels, block_mask=None):
            if block_mask is None:  # piece "mask-in-graph": built inside the compiled graph
                b, s = ids.shape
                block_mask = create_block_mask(causal, b, None, s, s, device=ids.device)
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, block_mask)
            logits = self.head(self.norm(x))
            return nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))

    torch.manual_seed(seed)
    return Drafter().to(device)


def causal(b, h, q, kv):
    return q >= kv


class Turns:
    """First come, first served: ``with turns:`` waits for the holders of every
    earlier ticket (threading.Lock promises no order among its waiters)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next_ticket = self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class Drafters:
    """n drafters stepping in threads of this process; counts per drafter."""

    def __init__(self, n: int, fast: bool, device: str, variant: dict | None = None, meter=None) -> None:
        import torch
        self.torch, self.n, self.fast, self.device, self.meter = torch, n, fast, device, meter
        self.variant = variant
        self.steps, self.cpu = [0] * n, [0.0] * n
        self.phases = [[[0.0, 0.0] for _ in PHASES] for _ in range(n)]  # [wall, cpu] per phase
        self.all_lengths: dict[int, float] = {}
        self.errors: list[str] = []
        self.first_error = ""  # its traceback: an error kind alone rarely says where
        self.ended: set[int] = set()  # drafters whose thread ended on an error
        self.stop = threading.Event()
        self.start = time.perf_counter()
        self.backward_turns = Turns() if FAIR_BACKWARD and variant is None else contextlib.nullcontext()

    def run(self, i: int) -> None:
        """Drafter i's steps, on a CUDA stream of its own (DRAFTER_STREAMS=0: the
        default stream): threads on one stream share the caching allocator's free
        blocks, so a step's fresh tensors (its block mask) land at other addresses
        each step, and a backward's CUDA graph, which takes every saved forward
        input as static, records anew each step (docs/cuda-graphs.md)."""
        try:
            self._run(i)
        except BaseException as e:  # counted: a drafter that ends is a failure, never a quiet 0
            self._count(e, f"drafter {i} ended: ")
            self.ended.add(i)

    def _count(self, e: BaseException, prefix: str = "") -> None:
        self.errors.append(prefix + _harness.error_kind(e))
        if not self.first_error:
            self.first_error = traceback.format_exc()[-4000:] + _graphed_here(self.torch, self.device)

    def _run(self, i: int) -> None:
        torch = self.torch
        if self.device == "cuda":
            torch.cuda.set_device(0)
        own = self.device == "cuda" and OWN_STREAMS
        if self.variant is not None:  # as users write it: fxguard's block, or nothing
            with self._user_block():
                self._steps(i)
            return
        with torch.cuda.stream(torch.cuda.Stream()) if own else contextlib.nullcontext(), \
                torch.autograd.set_multithreading_enabled(False) if BACKWARD_HERE else contextlib.nullcontext():
            self._steps(i)

    def _user_block(self):
        if not self.variant.get("api", True) or self.device != "cuda":
            return contextlib.nullcontext()
        from fxguard.torch_support.cuda_thread import cuda_graph_thread
        return cuda_graph_thread(0, turns=self.variant.get("turns", True))

    def _steps(self, i: int) -> None:
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask
        variant = self.variant or {}
        model = build(torch, seed=i, device=self.device, dropout=variant.get("dropout", 0.0))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fast = FAST_PIECES if self.fast else ()
        forward = torch.compile(model, dynamic=False,
                                **({"mode": "reduce-overhead"} if "model" in fast else {}))
        make_mask = torch.compile(create_block_mask) if "mask" in fast else create_block_mask
        mask_flag = {"_compile": True} if "mask-flag" in fast else {}
        opt_step = (torch.compile(opt.step, mode="reduce-overhead") if "optimizer-graphed" in fast
                    else torch.compile(opt.step) if "optimizer" in fast else opt.step)
        # Each drafter's data from a generator of its own (as a drafter's own stream),
        # clear of torch <= 2.11's default CUDA generator, which a recording in another
        # thread marks as capturing (docs/cuda-graphs.md: not measured yet).
        data = None if variant.get("default_generator") else \
            torch.Generator(device=self.device).manual_seed(1000 + i)
        seen, n = set(), 0
        slot = self.meter.register() if self.meter else None
        mark = (lambda k: self.meter.phase(slot, k)) if self.meter else None
        while not self.stop.is_set():
            length = LENGTHS[n % len(LENGTHS)]
            n += 1
            try:
                ids = torch.randint(0, VOCAB, (BATCH, length), device=self.device, generator=data)
                if "optimizer-graphed" in fast:  # two graphed calls a step: say where one begins
                    torch.compiler.cudagraph_mark_step_begin()
                clock = _PhaseClock(self.phases[i], mark)
                mask = None if "mask-in-graph" in fast else make_mask(
                    causal, BATCH, None, length, length, device=self.device, **mask_flag)
                clock.tick(0)
                loss = forward(ids, ids, mask)
                clock.tick(1)
                with self.backward_turns:
                    loss.backward()
                clock.tick(2)
                opt_step()
                clock.tick(3)
                opt.zero_grad(set_to_none=True)
                clock.tick(4)
                loss.item()  # the step's end (a drafter reads its loss)
                if variant.get("sync"):
                    torch.cuda.synchronize()
                clock.tick(5)
            except Exception as e:  # counted, the drafter goes on
                self._count(e)
                if len(self.errors) > 100:
                    self.stop.set()
            self.steps[i] += 1
            self.cpu[i] = time.thread_time()
            seen.add(length)
            if len(seen) == len(LENGTHS) and i not in self.all_lengths and n > 2 * len(LENGTHS):
                self.all_lengths[i] = time.perf_counter() - self.start


def _watch_for_a_stall(drafters, mode: str, after: float) -> None:
    """Once a drafter has made no step for ``after`` seconds while another made
    some: every thread's stack and fxguard's view (who is marked capturing, who
    holds the backward turn), into DRAFTER_DUMP_DIR.  Armed once every drafter
    has stepped (before, the first steps wait for compiles)."""
    import faulthandler
    while not all(drafters.steps) and not drafters.ended and not drafters.stop.wait(1.0):
        pass
    last, moved = list(drafters.steps), [time.perf_counter()] * len(drafters.steps)
    while not drafters.stop.wait(1.0):
        now, steps = time.perf_counter(), list(drafters.steps)
        for i, n in enumerate(steps):
            if n != last[i]:
                last[i], moved[i] = n, now
        stalled = [i for i, t in enumerate(moved) if now - t > after]
        if stalled and len(stalled) < len(steps):
            name = f"stall-{mode}-{os.getpid()}.txt"
            with open(os.path.join(os.environ.get("DRAFTER_DUMP_DIR", "."), name), "w") as f:
                f.write(f"drafters {stalled} made no step for {after:.0f} s; steps {steps}\n"
                        f"{_fxguard_view()}\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            return


def _fxguard_view() -> str:
    """Who fxguard sees capturing per device, and the backward turns' state (diagnosis)."""
    try:
        from fxguard.torch_support import cudagraph_rng, cuda_thread
        names = {t.ident: t.name for t in threading.enumerate()}
        captures = {d: [names.get(t, t) for t in ts] for d, ts in cudagraph_rng.thread_streams._captures.items()}
        turns = {d: {"serving": t._serving, "next": t._next,
                     "tickets": {n: names.get(who, who) for n, (who, _) in t._tickets.items()}}
                 for d, t in cuda_thread.device_turns._turns.items()}
        return f"capturing: {captures}; turns: {turns}"
    except Exception as e:  # a diagnosis only
        return f"fxguard not read: {e!r}"


def _watch_recordings() -> dict:
    """How fxguard planned each CUDA-graph recording, counted per thread: whether
    it read the graph as drawing (and the word it matched), whose generator state."""
    from fxguard.torch_support import cudagraph_rng as rng
    seen: dict[str, int] = {}
    plan_for = rng.ThreadStreams.recording

    def recording(self, device, model):
        plan = plan_for(self, device, model)
        text = None if model is None else rng._output_code(model)
        match = rng.DRAWS.search(text) if text else None
        key = (f"{threading.current_thread().name}: "
               + ("manager's first" if model is None else "code not found" if text is None else
                  f"draws ({match.group(0)})" if match else "draws nothing")
               + f"; own state: {plan.device is not None}, whole capture: {plan.whole}")
        seen[key] = seen.get(key, 0) + 1
        return plan
    rng.ThreadStreams.recording = recording
    return seen


def _fxguard_warnings() -> list[str]:
    """fxguard's WARNINGs in this process, as they come (a report names what a user saw)."""
    import logging
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if len(said) < 5:
                said.append(f"[{threading.current_thread().name}] {record.getMessage()[:400]}")
    logging.getLogger("fxguard").addHandler(Keep(logging.WARNING))
    return said


def _graphed_here(torch, device: str) -> str:
    """What this thread's CUDA-graph tree holds (for a first error): each function's
    mode and where its first output was made, so a graph that should not be there
    (the mask's) shows; and the inductor config's triton.cudagraphs as read here."""
    try:
        from torch._inductor import config, cudagraph_trees
        lines = [f"\n[here: triton.cudagraphs={config.triton.cudagraphs}]"]
        if device == "cuda":
            manager = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
            for fid, traces in (manager.ids_to_stack_traces.items() if manager else ()):
                made = next((" | ".join(t.strip().splitlines()[-2:]) for t in traces or () if t), "?")
                lines.append(f"[tree fn {fid}: {manager.id_to_mode[fid].name}, first output: {made[:240]}]")
        return "\n".join(lines)
    except Exception as e:  # a diagnosis only
        return f"\n[tree not read: {e!r}]"


def _watch_cudagraphs_config(torch) -> list:
    """Events (seconds, thread, value, compile_lock held here, innermost frames) of
    each write to inductor's triton.cudagraphs override; the first 80 are kept."""
    from torch._dynamo import convert_frame
    from torch._inductor import config
    events, start = [], time.perf_counter()
    entry = config._config["triton.cudagraphs"]
    if not hasattr(entry, "__dict__") or "contextvars" in type(getattr(entry, "user_override", None)).__module__:
        return ["not watched: this torch keeps config overrides per thread (ContextVar)"]

    class Watched(type(entry)):
        def __setattr__(self, name, value):
            if name == "user_override" and len(events) < 80:
                owned = getattr(convert_frame.compile_lock, "_is_owned", lambda: None)()
                where = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                         for f in traceback.extract_stack(limit=7)[:-1]]
                events.append([round(time.perf_counter() - start, 4), threading.current_thread().name,
                               repr(value)[:20], owned, where])
            super().__setattr__(name, value)
    entry.__class__ = Watched
    return events


class _PhaseClock:
    """Adds each phase's wall and thread CPU time to a drafter's totals; ``mark``
    (the GIL meter's) is told the phase that begins (after the last: "between")."""

    def __init__(self, totals: list, mark=None) -> None:
        self.totals, self.mark, self.wall, self.cpu = totals, mark, time.perf_counter(), time.thread_time()
        if mark:
            mark(0)

    def tick(self, phase: int) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        if self.mark:
            self.mark(phase + 1)
        self.totals[phase][0] += wall - self.wall
        self.totals[phase][1] += cpu - self.cpu
        self.wall, self.cpu = wall, cpu


def _gil_per_step(sums: dict, steps: int) -> dict:
    """The GIL meter's seconds as milliseconds per step (all drafters) and the
    window's share of time the GIL was held."""
    held = {name: sum(slot[name] for slot in sums["held_s"]) for name in (*PHASES, "between", "unnamed")}
    total = sum(held.values()) + sums["other_threads_s"] + sums["free_s"]
    return {"ms_per_step": {k: round(1e3 * v / max(steps, 1), 3) for k, v in held.items()},
            "other_threads_ms_per_step": round(1e3 * sums["other_threads_s"] / max(steps, 1), 3),
            "held_share": round((total - sums["free_s"]) / total, 3) if total else None,
            "reads": sums["reads"], "meter_cpu_s": round(sums["meter_cpu_s"], 3)}


def _phase_ms(before: list, after: list, steps: int) -> dict:
    """Each phase's mean wall and CPU milliseconds per step over a window, all drafters."""
    out = {}
    for k, name in enumerate(PHASES):
        wall = sum(a[k][0] - b[k][0] for a, b in zip(after, before))
        cpu = sum(a[k][1] - b[k][1] for a, b in zip(after, before))
        out[name] = {"wall": round(1e3 * wall / max(steps, 1), 3), "cpu": round(1e3 * cpu / max(steps, 1), 3)}
    return out


def child(mode: str, threads: int, seconds: float, out: str, ready_dir: str | None,
          device: str, probe: bool = False) -> None:
    if os.environ.get("DRAFTER_DUMP_AFTER"):  # every thread's stack then (a hang's diagnosis)
        import faulthandler
        name = f"dump-{mode}-{os.getpid()}.txt"
        dump = open(os.path.join(os.environ.get("DRAFTER_DUMP_DIR", "."), name), "w")
        faulthandler.dump_traceback_later(float(os.environ["DRAFTER_DUMP_AFTER"]), file=dump)
    import torch
    if mode in WITH_FXGUARD:
        import fxguard
        from fxguard.startup import parse_options
        fxguard.install(**{**FXGUARD_OPTIONS, **parse_options(os.environ.get("DRAFTER_FXGUARD_OPTIONS", ""))})
    said = _fxguard_warnings()
    if SWITCH_INTERVAL:
        sys.setswitchinterval(float(SWITCH_INTERVAL))
    if NO_GC:
        import gc
        gc.disable()
    if probe:
        import _cuda_graph_probe
        prober = _cuda_graph_probe.Probe()
    config_events = _watch_cudagraphs_config(torch) if os.environ.get("DRAFTER_WATCH_CONFIG") == "1" else None
    recordings = _watch_recordings() if os.environ.get("DRAFTER_WATCH_RECORDINGS") == "1" else None
    meter, meter_error = None, None
    if os.environ.get("DRAFTER_GIL_METER") == "1":
        try:
            import _gil_meter
            meter = _gil_meter.GilMeter((*PHASES, "between"))
        except Exception as e:  # a diagnosis: the run goes on without it, and says why
            meter_error = f"no GIL meter: {_harness.error_kind(e, 300)}"
    drafters = Drafters(threads, fast="fast" in mode, device=device, variant=VARIANTS.get(mode), meter=meter)
    workers = [threading.Thread(target=drafters.run, args=(i,), daemon=True, name=f"drafter-{i}")
               for i in range(threads)]
    for t in workers:
        t.start()
    if os.environ.get("DRAFTER_STALL_DUMP"):
        threading.Thread(target=_watch_for_a_stall, args=(drafters, mode, float(os.environ["DRAFTER_STALL_DUMP"])),
                         daemon=True, name="stall-watch").start()
    deadline = time.perf_counter() + 400
    while len(drafters.all_lengths) < threads and not drafters.stop.is_set() and not drafters.ended \
            and time.perf_counter() < deadline:
        time.sleep(0.05)
    if ready_dir:  # processes: every one starts its window together
        _harness.start_together(ready_dir, deadline)
    if probe:
        prober.start_sampling()
        prober.start_gil_watch()
        before = prober.snapshot()

    def phases():
        return [[list(p) for p in d] for d in drafters.phases]
    steps0, cpu0, phases0, t0 = list(drafters.steps), list(drafters.cpu), phases(), time.perf_counter()
    if meter:
        meter.start(20000)
    process0 = time.process_time()
    time.sleep(seconds)
    steps1, cpu1, phases1, t1 = list(drafters.steps), list(drafters.cpu), phases(), time.perf_counter()
    process1 = time.process_time()
    gil = meter and meter.stop()
    if gil:
        process1 -= gil["meter_cpu_s"]
    if probe:
        probed = prober.report(before, prober.snapshot())
    if ready_dir:
        time.sleep(2)  # keep stepping while the others end their windows
    drafters.stop.set()
    for t in workers:
        t.join(60)
    window = [b - a for a, b in zip(steps0, steps1)]
    cpu = sum(b - a for a, b in zip(cpu0, cpu1))
    result = {
        "mode": mode, "drafters": threads, "steps_in_window": window, "window_s": round(t1 - t0, 2),
        "time_until_all_lengths_s": (round(max(drafters.all_lengths.values()), 2)
                                     if len(drafters.all_lengths) == threads else None),
        "cpu_s_per_step": round(cpu / max(sum(window), 1), 5),
        # every thread's: the autograd engine's device thread runs CUDA backwards
        "process_cpu_s_per_step": round((process1 - process0) / max(sum(window), 1), 5),
        "phase_ms_per_step": _phase_ms(phases0, phases1, sum(window)),
        "errors": len(drafters.errors), "error_kinds": sorted(set(drafters.errors))[:5],
        "first_error": drafters.first_error,
        "fxguard_warnings": said,
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
    }
    if probe:
        result["probe"] = probed
    if gil or meter_error:
        result["gil"] = _gil_per_step(gil, sum(window)) if gil else {"error": meter_error}
    if config_events is not None:
        result["config_events"] = config_events
    if recordings is not None:
        result["recordings"] = recordings
    with open(out, "w") as f:
        json.dump(result, f)


class DevicePeak:
    """GPU memory in use (every process, contexts included) at its peak while
    a mode runs, above what was in use before it started."""

    def __init__(self, device: str) -> None:
        import torch
        self.torch = torch
        if device != "cuda":
            self.peak, self.thread = None, None
            return
        self.base = self._used()
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _used(self) -> int:
        free, total = self.torch.cuda.mem_get_info(0)
        return total - free

    def _poll(self) -> None:
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, self._used() - self.base)

    def end(self) -> float | None:
        if self.thread is None:
            return None
        self.stop.set()
        self.thread.join()
        return round(self.peak / 2**30, 2)


def run_mode(mode: str, seconds: float, device: str, probe: bool = False) -> dict:
    argv = ["--seconds", str(seconds), "--device", device, *(["--probe"] if probe else [])]
    peak = DevicePeak(device)
    if mode != "processes-fast":
        n = 1 if mode in ONE_THREAD else 3
        result = _harness.in_fresh_process(__file__, ["--child", mode, "--threads", str(n), *argv],
                                           timeout=seconds + 600)
        result = result if "status" not in result else {"mode": mode, **result}
    else:
        result = _processes(mode, argv, seconds)
    result["gpu_used_peak_gib"] = peak.end()
    if "steps_in_window" in result:
        window = result["steps_in_window"]
        result["steps_per_s"] = round(sum(window) / result["window_s"], 2)
        result["fairness"] = round(min(window) / max(window), 3) if max(window) else None
    return result


def _processes(mode: str, argv: list[str], seconds: float, n: int = 3) -> dict:
    """n processes, one drafter each, windows started together; their figures summed."""
    parts = _harness.in_processes(
        __file__, [["--child", "processes-fast", "--threads", "1", *argv]] * n, timeout=seconds + 600)
    if isinstance(parts, str):
        return {"mode": mode, "status": "failed", "detail": parts}
    steps = [p["steps_in_window"][0] for p in parts]

    def per_step(figure) -> float:  # the processes' figure, weighted by their steps
        return sum(figure(p) * s for p, s in zip(parts, steps)) / max(sum(steps), 1)
    return {"mode": mode, "drafters": n, "steps_in_window": steps,
            "window_s": max(p["window_s"] for p in parts),
            "time_until_all_lengths_s": max(p["time_until_all_lengths_s"] or 1e9 for p in parts),
            **{key: round(per_step(lambda p, k=key: p[k]), 5)
               for key in ("cpu_s_per_step", "process_cpu_s_per_step")},
            "phase_ms_per_step": {
                name: {k: round(per_step(lambda p, phase=name, k=k: p["phase_ms_per_step"][phase][k]), 3)
                       for k in ("wall", "cpu")} for name in PHASES},
            **({"gil": {"ms_per_step": {k: round(per_step(lambda p, k=k: p["gil"]["ms_per_step"][k]), 3)
                                        for k in parts[0]["gil"]["ms_per_step"]},
                        **{k: round(per_step(lambda p, k=k: p["gil"][k]), 3)
                           for k in ("other_threads_ms_per_step", "held_share")}}}
               if all("ms_per_step" in p.get("gil", {}) for p in parts) else {}),
            "errors": sum(p["errors"] for p in parts),
            "error_kinds": sorted({k for p in parts for k in p["error_kinds"]})[:5],
            "first_error": next((p["first_error"] for p in parts if p.get("first_error")), ""),
            "graphs": sum(p["graphs"] for p in parts)}


def ratios(modes: dict) -> dict:
    def rate(name: str) -> float | None:
        return modes.get(name, {}).get("steps_per_s")

    def mem(name: str) -> float | None:
        return modes.get(name, {}).get("gpu_used_peak_gib")
    out = {}
    for key, a, b, f in (("fast_vs_plain_threads", "threads-fast", "threads-plain", rate),
                         ("fast_threads_vs_one_plain", "threads-fast", "one-plain", rate),
                         ("fast_threads_vs_processes", "threads-fast", "processes-fast", rate),
                         ("fast_threads_vs_one_fast", "threads-fast", "one-fast", rate),
                         ("one_fast_vs_stock", "one-fast", "one-fast-stock", rate),
                         ("gpu_memory_threads_vs_processes", "threads-fast", "processes-fast", mem),
                         ("api_threads_vs_recipe", "threads-fast-api", "threads-fast", rate),
                         *((f"{m[len('threads-fast-'):].replace('-', '_')}_threads_vs_processes", m,
                            "processes-fast", rate) for m in VARIANTS),
                         ("gpu_memory_api_threads_vs_processes", "threads-fast-api", "processes-fast", mem)):
        if f(a) and f(b):
            out[key] = round(f(a) / f(b), 3)
    return out


def _resumed(path: str | None, report: dict) -> dict:
    """The modes an earlier report measured under the same torch and settings
    (those that ran: a failed mode runs again).  Ratios compare one machine only."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        earlier = json.load(f)
    # drafter_streams and fast_mask follow from the commit and the knobs in args
    same = all(earlier.get(k) == report.get(k) for k in ("torch", "fxguard", "commit", "machine")) and \
        {k: v for k, v in earlier.get("args", {}).items() if k != "modes"} == \
        {k: v for k, v in report["args"].items() if k != "modes"}
    if not same:
        sys.exit(f"--resume {path}: another machine, torch, fxguard, commit or settings; start afresh")
    return {m: r for m, r in earlier.get("modes", {}).items() if "status" not in r}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--child")
    p.add_argument("--out")
    p.add_argument("--ready-dir")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--resume", metavar="PATH", help="a report of an earlier run to go on from")
    p.add_argument("--probe", action="store_true",
                   help="count what each CUDA-graph call became, syncs, lock waits, stack samples "
                        "(diagnosis: its figures are not recorded)")
    _harness.add_output_options(p)
    args = p.parse_args()
    if args.child:
        child(args.child, args.threads, args.seconds, args.out, args.ready_dir, args.device, args.probe)
        return 0
    if args.device != "cuda" and args.save:
        p.error("--save records GPU figures; --device cpu is a check only")
    if args.probe and args.save:
        p.error("--save records figures; a --probe run's own wrapping costs time")
    report = {**_harness.envelope("cuda_graph_drafters", import_torch=True),
              "args": {"seconds": args.seconds, "modes": args.modes, "device": args.device,
                       **({"probe": True} if args.probe else {}),
                       **{k: os.environ[k] for k in KNOBS if k in os.environ}},
              "fxguard_options": FXGUARD_OPTIONS,
              "drafter_streams": ("own" if OWN_STREAMS else "default") if args.device == "cuda" else None,
              "fast_mask": fast_mask(),
              "modes": {}}
    report["modes"] = _resumed(args.resume, report)
    output = _harness.Output(args)
    for mode in args.modes.split(","):
        if mode in report["modes"]:
            continue
        report["modes"][mode] = run_mode(mode, args.seconds, args.device, args.probe)
        print(json.dumps(report["modes"][mode]), flush=True)
        report["ratios"] = ratios(report["modes"])
        output.write(report)  # after each mode: a cut-off run keeps what it measured
    print(json.dumps(report["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
