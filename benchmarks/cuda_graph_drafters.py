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

Modes, each in fresh processes with empty compile caches of their own:
``threads-fast`` (3 threads, fxguard), ``threads-plain`` (3 threads, fxguard),
``one-plain`` and ``one-fast`` (1 thread, fxguard), ``processes-fast`` (3
processes, one drafter each, stock torch: what threads replace),
``threads-fast-stock`` (3 threads, no fxguard), ``one-fast-stock`` (1 thread,
no fxguard: what fxguard costs a step; on torch <= 2.12 not under --probe,
whose import of the trees in the main thread leaves the drafter's without).
Figures: time until every drafter ran every length, then windows in which all
run: steps per second (all drafters together), CPU seconds per step (the
drafters' threads, and the process's) and per phase of a step, fairness
(slowest drafter's steps ÷ fastest's), errors, and the GPU memory in use at
peak (the parent polls the device; CUDA contexts included).

One run, one ratio: every mode takes ``--repeats`` windows (default 3) of
``--seconds`` (default 3), interleaved (each mode's first, then each mode's
second, ...: drift hits all alike), and the report gives per mode the median
steps/s, their spread (min–max), the median fairness, the errors of every
window and each mode's median ÷ ``processes-fast``'s (a table at the end, and
the JSON).  The compile dominates a mode's time (40-65 s to every length on an
H100/H200 against a 3 s window), so a mode's processes start once, fresh with
empty caches, and stay warm between its windows, their drafters waiting at a
step's start (each window begins after ``--settle`` s of steps).  ``--start
together`` (default) starts every mode's processes at once (their compiles
share the machine: the time to every length is then ``_together``, and GPU
memory is not measured); ``--start in-turn`` starts each just before its first
window (time to every length and GPU memory measured alone; about 75 s a mode
on a GPU).  A time estimate is printed first; ``--budget S`` starts no window
that would end past S s and says so, and the JSON holds what ran.

Every failure counts in ``errors``: a step that raises, a drafter whose thread
ends, a drafter (or process) that makes no step in a window ("no step in the
window", in every mode), and a mode's processes that fail or stop answering
(each of its drafters, for each window left).

    python benchmarks/cuda_graph_drafters.py [--modes ...] [--seconds 3] [--repeats 3]
        [--start together|in-turn] [--budget 450] [--json out.json] [--save] [--resume part.json]

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
import statistics
import subprocess
import sys
import tempfile
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
# it happens). DRAFTER_IDLE=0, drafter 0 makes no step (in every process): a check that
# the benchmark counts a drafter with no step in a window as an error.
# DRAFTER_WATCH_RECORDINGS=1, the report's recordings: how fxguard planned each
# CUDA-graph recording, per thread. DRAFTER_GIL_METER=1, the report's gil:
# milliseconds per step that each phase's threads held the GIL, that other threads (the
# autograd worker) held it, and its share held in the window (_gil_meter.py: a native
# thread reads the GIL; its own CPU is taken out of process_cpu_s_per_step). A report
# names those set.
KNOBS = ("DRAFTER_LENGTHS", "DRAFTER_FAST", "DRAFTER_NO_GC", "DRAFTER_STREAMS", "DRAFTER_SWITCH_INTERVAL",
         "DRAFTER_BACKWARD_HERE", "DRAFTER_FAIR_BACKWARD", "DRAFTER_FXGUARD_OPTIONS", "DRAFTER_WATCH_CONFIG",
         "DRAFTER_GIL_METER",
         "DRAFTER_DUMP_AFTER", "DRAFTER_STALL_DUMP", "DRAFTER_WATCH_RECORDINGS", "DRAFTER_IDLE",
         # inductor's compile workers per process (modes started together share the cores)
         "TORCHINDUCTOR_COMPILE_THREADS")
LENGTHS = tuple(int(n) for n in os.environ.get("DRAFTER_LENGTHS", "256,512").split(","))
FAST_PIECES = tuple(os.environ.get("DRAFTER_FAST", "mask,model,optimizer").split(","))
OWN_STREAMS = os.environ.get("DRAFTER_STREAMS") != "0"
SWITCH_INTERVAL = os.environ.get("DRAFTER_SWITCH_INTERVAL")
NO_GC = bool(os.environ.get("DRAFTER_NO_GC"))
BACKWARD_HERE = os.environ.get("DRAFTER_BACKWARD_HERE") == "1"
IDLE = int(os.environ["DRAFTER_IDLE"]) if os.environ.get("DRAFTER_IDLE") else None
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
        self.finished: set[int] = set()  # drafters whose thread ended (an error or the stop)
        self.stop = threading.Event()
        # Between windows every drafter waits at its step's start (go cleared): the modes of
        # one run take their windows in turn, each mode's processes kept warm meanwhile.
        self.go = threading.Event()
        self.go.set()
        self.parked = [False] * n
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
        finally:
            self.finished.add(i)

    def pause(self, timeout: float = 30.0) -> bool:
        """Every drafter waits at its next step's start; True once all that still run do
        (a drafter inside a step that hangs does not: False after ``timeout``)."""
        self.go.clear()
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if all(self.parked[i] or i in self.finished for i in range(self.n)):
                return True
            time.sleep(0.005)
        return False

    def resume(self) -> None:
        self.go.set()

    def end(self) -> None:
        self.stop.set()
        self.go.set()

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
        if IDLE == i:  # DRAFTER_IDLE: this drafter makes no step (the benchmark's own check)
            self.parked[i] = True
            self.stop.wait()
        while not self.stop.is_set():
            if not self.go.is_set():  # between windows
                self.parked[i] = True
                self.go.wait()
                self.parked[i] = False
                continue
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
        if not drafters.go.is_set():  # paused between windows: no stall
            moved = [now] * len(steps)
            continue
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


def _setup(mode: str, probe: bool):
    """The child's process as a mode wants it; (said, prober, config_events, recordings,
    meter, meter_error)."""
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
    prober = None
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
    return torch, said, prober, config_events, recordings, meter, meter_error


def _write(path: str, value) -> None:
    """Whole or not at all: the parent polls for the file."""
    with open(path + ".part", "w") as f:
        json.dump(value, f)
    os.replace(path + ".part", path)


def _together(folder: str, rank: int, peers: int, timeout: float) -> None:
    """Waits (up to ``timeout`` s) until each of the mode's ``peers`` processes reached here."""
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(rank)), "w").close()
    deadline = time.perf_counter() + timeout
    while len(os.listdir(folder)) < peers and time.perf_counter() < deadline:
        time.sleep(0.01)


def serve(mode: str, threads: int, folder: str, rank: int, peers: int, device: str, probe: bool,
          warmup_limit: float, settle: float) -> None:
    """One process of a mode, kept warm for the run: its drafters step until each ran
    every length, then wait; each ``go-K`` file the parent writes into ``folder``
    (holding the window's seconds) gets one window, written to ``result-K-RANK.json``;
    ``end`` ends the process.  A mode's processes (``peers``) start each window together
    and step until all ended theirs."""
    torch, said, prober, config_events, recordings, meter, meter_error = _setup(mode, probe)
    drafters = Drafters(threads, fast="fast" in mode, device=device, variant=VARIANTS.get(mode), meter=meter)
    workers = [threading.Thread(target=drafters.run, args=(i,), daemon=True, name=f"drafter-{i}")
               for i in range(threads)]
    for t in workers:
        t.start()
    if os.environ.get("DRAFTER_STALL_DUMP"):
        threading.Thread(target=_watch_for_a_stall, args=(drafters, mode, float(os.environ["DRAFTER_STALL_DUMP"])),
                         daemon=True, name="stall-watch").start()
    deadline = time.perf_counter() + warmup_limit
    while len(drafters.all_lengths) < threads and not drafters.stop.is_set() \
            and len(drafters.finished) < threads and time.perf_counter() < deadline:
        time.sleep(0.05)
    if peers > 1:  # the mode's processes: each steps until all are warm
        _together(os.path.join(folder, "warm"), rank, peers, max(deadline - time.perf_counter(), 1.0))
    drafters.pause()
    _write(os.path.join(folder, f"ready-{rank}.json"), {
        "pid": os.getpid(),
        "time_until_all_lengths_s": (round(max(drafters.all_lengths.values()), 2)
                                     if len(drafters.all_lengths) == threads else None)})
    reported, first_error_said, k = 0, False, 0

    def phases():
        return [[list(p) for p in d] for d in drafters.phases]
    parent = os.getppid()
    while not os.path.exists(os.path.join(folder, "end")):
        go = os.path.join(folder, f"go-{k + 1}")
        if not os.path.exists(go):
            if os.getppid() != parent:  # the parent is gone
                break
            time.sleep(0.02)
            continue
        k += 1
        with open(go) as f:
            seconds = float(f.read())
        drafters.resume()
        if peers > 1:
            _together(os.path.join(folder, f"start-{k}"), rank, peers, 60)
        time.sleep(settle)  # steps resumed (clocks, caches) before the count starts
        if prober and k == 1:  # the probe's figures: the first window only
            prober.start_sampling()
            prober.start_gil_watch()
            before = prober.snapshot()
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
        probed = prober.report(before, prober.snapshot()) if prober and k == 1 else None
        if peers > 1:  # keep stepping while the others end their windows
            _together(os.path.join(folder, f"end-{k}"), rank, peers, 30)
        parked = drafters.pause()
        window = [b - a for a, b in zip(steps0, steps1)]
        # Every failure counts: the drafters' errors since the last window (the warm-up's in
        # the first), and each drafter that made no step in this one.
        errors = drafters.errors[reported:] + ["no step in the window"] * window.count(0)
        reported = len(drafters.errors)
        cpu = sum(b - a for a, b in zip(cpu0, cpu1))
        result = {
            "steps_in_window": window, "window_s": round(t1 - t0, 2),
            "cpu_s_per_step": round(cpu / max(sum(window), 1), 5),
            # every thread's: the autograd engine's device thread runs CUDA backwards
            "process_cpu_s_per_step": round((process1 - process0) / max(sum(window), 1), 5),
            "phase_ms_per_step": _phase_ms(phases0, phases1, sum(window)),
            "errors": len(errors), "error_kinds": sorted(set(errors))[:5],
            "first_error": "" if first_error_said else drafters.first_error,
            "fxguard_warnings": said,
            "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        }
        first_error_said = first_error_said or bool(drafters.first_error)
        if not parked:
            result["not_paused"] = "a drafter was still inside a step 30 s after the window"
        if probed:
            result["probe"] = probed
        if gil or meter_error:
            result["gil"] = _gil_per_step(gil, sum(window)) if gil else {"error": meter_error}
        if config_events is not None:
            result["config_events"] = config_events
        if recordings is not None:
            result["recordings"] = dict(recordings)
        _write(os.path.join(folder, f"result-{k}-{rank}.json"), result)
    drafters.end()
    for t in workers:
        t.join(10)


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


class Mode:
    """One mode's processes (fresh, each with empty compile caches of its own), kept
    warm for the whole run: they compile once, then take their windows when told."""

    def __init__(self, mode: str, root: str, device: str, probe: bool, warmup_limit: float,
                 settle: float, memory: bool) -> None:
        self.mode, self.failed, self.ready, self.gpu = mode, None, None, None
        self.peers = 3 if mode == "processes-fast" else 1
        self.drafters = 1 if mode in ONE_THREAD else 3  # all the mode's processes together
        threads = 1 if self.peers > 1 else self.drafters
        self.folder = os.path.join(root, mode)
        os.makedirs(self.folder)
        self.warmup_limit, self.settle, self.procs, self.logs = warmup_limit, settle, [], []
        # GPU memory in use at peak, the mode's own only while no other mode starts meanwhile
        self.peak = DevicePeak(device if memory else "cpu")
        self.started = time.perf_counter()
        for rank in range(self.peers):
            caches = {var: os.path.join(self.folder, f"{rank}-{name}") for name, var in _harness.CACHES.items()}
            self.logs.append(os.path.join(self.folder, f"log-{rank}.txt"))
            with open(self.logs[-1], "w") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--child", mode, "--serve", self.folder, "--rank", str(rank),
                     "--peers", str(self.peers), "--threads", str(threads), "--device", device,
                     "--warmup-limit", str(warmup_limit), "--settle", str(settle),
                     *(["--probe"] if probe else [])],
                    env=dict(os.environ, **caches), stdout=log, stderr=subprocess.STDOUT))

    def _wait(self, names: list[str], timeout: float) -> list[dict] | None:
        paths = [os.path.join(self.folder, n) for n in names]
        deadline = time.perf_counter() + timeout
        while not all(os.path.exists(p) for p in paths):
            dead = [p.returncode for p in self.procs if p.poll() is not None]
            if dead:
                self.failed = f"failed (exit {dead[0]})"
            elif time.perf_counter() > deadline:
                self.failed = f"no answer within {timeout:.0f} s"
            if self.failed:
                self.end()
                return None
            time.sleep(0.02)
        parts = []
        for p in paths:
            with open(p) as f:
                parts.append(json.load(f))
        return parts

    def tail(self) -> str:
        text = ""
        for path in self.logs:
            with open(path, errors="replace") as f:
                text += f.read()[-1500:]
        return text[-3000:]

    def warm(self) -> None:
        """Waits until every drafter ran every length (or the child's warm-up limit passed)."""
        parts = self._wait([f"ready-{r}.json" for r in range(self.peers)], self.warmup_limit + 120)
        self.warm_s = round(time.perf_counter() - self.started, 1)
        if parts is not None:
            times = [p["time_until_all_lengths_s"] for p in parts]
            self.ready = {"time_until_all_lengths_s": None if None in times else max(times)}

    def window(self, k: int, seconds: float) -> dict:
        """Window k of this mode: its figures, or why there are none (counted as errors:
        each of the mode's drafters made no step in it)."""
        if self.failed is None and self.ready is None:
            self.warm()
        if self.failed is None:
            _write(os.path.join(self.folder, f"go-{k}"), seconds)
            parts = self._wait([f"result-{k}-{r}.json" for r in range(self.peers)], self.settle + seconds + 90)
        if self.failed is not None:
            return {"status": self.failed, "detail": self.tail(), "errors": self.drafters,
                    "error_kinds": [f"no step in the window: the mode's processes {self.failed}"]}
        result = parts[0] if self.peers == 1 else _merge(parts)
        window = result["steps_in_window"]
        result["steps_per_s"] = round(sum(window) / result["window_s"], 2)
        result["fairness"] = round(min(window) / max(window), 3) if max(window) else None
        return result

    def memory(self) -> None:
        """Ends the GPU memory's watch (after the mode's compiles, recordings and a window)."""
        if self.peak.thread is not None and not self.peak.stop.is_set():
            self.gpu = self.peak.end()

    def end(self) -> None:
        self.memory()
        open(os.path.join(self.folder, "end"), "w").close()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _merge(parts: list[dict]) -> dict:
    """A window of n processes, one drafter each: their figures summed or weighted by steps."""
    steps = [p["steps_in_window"][0] for p in parts]

    def per_step(figure) -> float:  # the processes' figure, weighted by their steps
        return sum(figure(p) * s for p, s in zip(parts, steps)) / max(sum(steps), 1)
    return {"steps_in_window": steps,
            "window_s": max(p["window_s"] for p in parts),
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


def summary(live: Mode, windows: list[dict], planned: int, alone: bool) -> dict:
    """A mode's figures over its windows: the median window's details, the median steps/s
    and fairness, the steps/s spread, the errors of every window (and of the warm-up)."""
    measured = [w for w in windows if "steps_per_s" in w]
    out = {"mode": live.mode, "drafters": live.drafters, "windows_planned": planned,
           "windows_measured": len(measured)}
    errors = sum(w.get("errors", 0) for w in windows)
    kinds = sorted({k for w in windows for k in w.get("error_kinds", [])})[:5]
    if not measured:
        failed = next((w for w in windows if "status" in w), {})
        return {**out, "status": failed.get("status", live.failed or "not run"),
                "detail": failed.get("detail", ""), "errors": errors, "error_kinds": kinds, "windows": windows}
    by_rate = sorted(measured, key=lambda w: w["steps_per_s"])
    out.update({k: v for k, v in by_rate[(len(by_rate) - 1) // 2].items()
                if k not in ("errors", "error_kinds", "first_error", "steps_per_s", "fairness")})
    # the probe's figures are the first window's; the watchers' (recordings, config) add up
    out.update({k: next(w[k] for w in (measured if k == "probe" else measured[::-1]) if k in w)
                for k in ("probe", "config_events", "recordings") if any(k in w for w in measured)})
    fair = [w["fairness"] for w in measured if w["fairness"] is not None]
    warm = (live.ready or {}).get("time_until_all_lengths_s")
    out.update({
        "steps_per_s": round(statistics.median(w["steps_per_s"] for w in measured), 2),
        "steps_per_s_spread": [by_rate[0]["steps_per_s"], by_rate[-1]["steps_per_s"]],
        "fairness": round(statistics.median(fair), 3) if fair else None,
        "errors": errors, "error_kinds": kinds,
        "first_error": next((w["first_error"] for w in windows if w.get("first_error")), ""),
        # under compiles of the other modes at once, not the figure of a mode alone
        ("time_until_all_lengths_s" if alone else "time_until_all_lengths_s_together"): warm,
        "gpu_used_peak_gib": live.gpu,
        "windows": windows})
    return out


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
    # every mode's median steps/s ÷ processes-fast's (one run: the windows interleaved)
    if rate("processes-fast"):
        out["vs_processes_fast"] = {m: round(r["steps_per_s"] / rate("processes-fast"), 3)
                                    for m, r in modes.items() if r.get("steps_per_s") is not None}
    return out


def table(report: dict) -> str:
    """The run's figures per mode, one line each."""
    vs = report.get("ratios", {}).get("vs_processes_fast", {})
    lines = [f"{'mode':<32} {'steps/s':>8} {'min–max':>15} {'fairness':>8} {'errors':>6} "
             f"{'windows':>7} {'÷ processes-fast':>16}"]
    for name, m in report["modes"].items():
        spread = m.get("steps_per_s_spread")
        lines.append(
            f"{name:<32} {_num(m.get('steps_per_s'), '{:.1f}'):>8} "
            f"{(f'{spread[0]:.1f}–{spread[1]:.1f}' if spread else '–'):>15} {_num(m.get('fairness')):>8} "
            f"{m.get('errors', '–'):>6} "
            f"{m.get('windows_measured', '–')!s:>3}/{m.get('windows_planned', '–')!s:<3} "
            f"{(_num(vs.get(name)) + '×' if name in vs else '–'):>16}"
            + (f"  {m['status']}" if "status" in m else "")
            + (f"  {'; '.join(m['error_kinds'])[:160]}" if m.get("error_kinds") else ""))
    return "\n".join(lines)


def _num(x, fmt: str = "{:.2f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "–"


# Seconds a mode takes until its windows can start (process start, torch import, compiles,
# every length run): H100/H200, torch 2.11, 40-65 s to every length in the reports of
# 2026-12-05..07, plus the start.  Modes started together share the machine's cores.
START_S = {"cuda": 75.0, "cpu": 60.0}


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
    p.add_argument("--seconds", type=float, default=3, help="each window's length")
    p.add_argument("--repeats", type=int, default=3, help="windows per mode, interleaved over the modes")
    p.add_argument("--start", choices=("together", "in-turn"), default="together",
                   help="start (compile) every mode's processes at once (default: fits a lent call), "
                        "or each just before its first window (its time to every length and GPU "
                        "memory then measured alone)")
    p.add_argument("--settle", type=float, default=0.5,
                   help="seconds the drafters step after a pause before a window's count starts")
    p.add_argument("--warmup-limit", type=float, default=400,
                   help="seconds a process waits for every drafter to run every length before it "
                        "takes windows anyway")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no window (or mode) that would end past this many seconds of the run")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--child")
    p.add_argument("--serve", metavar="DIR")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--peers", type=int, default=1)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--resume", metavar="PATH", help="a report of an earlier run to go on from")
    p.add_argument("--probe", action="store_true",
                   help="count what each CUDA-graph call became, syncs, lock waits, stack samples "
                        "(diagnosis, the first window of each mode: its figures are not recorded)")
    _harness.add_output_options(p)
    args = p.parse_args()
    if args.child:
        serve(args.child, args.threads, args.serve, args.rank, args.peers, args.device, args.probe,
              args.warmup_limit, args.settle)
        return 0
    began = time.perf_counter()
    if args.device != "cuda" and args.save:
        p.error("--save records GPU figures; --device cpu is a check only")
    if args.probe and args.save:
        p.error("--save records figures; a --probe run's own wrapping costs time")
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        p.error(f"no such modes: {', '.join(unknown)}")
    report = {**_harness.envelope("cuda_graph_drafters", import_torch=True),
              "args": {"seconds": args.seconds, "modes": args.modes, "device": args.device,
                       "repeats": args.repeats, "start": args.start, "settle": args.settle,
                       **({"probe": True} if args.probe else {}),
                       **{k: os.environ[k] for k in KNOBS if k in os.environ}},
              "fxguard_options": FXGUARD_OPTIONS,
              "drafter_streams": ("own" if OWN_STREAMS else "default") if args.device == "cuda" else None,
              "fast_mask": fast_mask(),
              "budget_s": args.budget,
              "modes": {}}
    report["modes"] = _resumed(args.resume, report)
    output = _harness.Output(args)
    # The baseline first: a run the budget cuts still has its ratios' denominator.
    todo = sorted((m for m in dict.fromkeys(args.modes.split(",")) if m not in report["modes"]),
                  key=lambda m: m != "processes-fast")
    window_s = args.settle + args.seconds + 1.0  # the pause, the files, the processes' barriers
    if args.budget:  # a warm-up that never ends leaves time for the windows
        args.warmup_limit = min(args.warmup_limit,
                                max(args.budget - window_s * args.repeats * len(todo) - 60, 30))
    start_s = START_S[args.device] * (1.5 if args.start == "together" and len(todo) > 1 else 1)
    starts = start_s if args.start == "together" else start_s * len(todo)
    estimate = starts + window_s * args.repeats * len(todo)
    print(f"{len(todo)} modes × {args.repeats} windows of {args.seconds:g} s, interleaved; each mode in "
          f"fresh processes with empty compile caches, started {args.start}, warm between its windows; "
          f"estimate ~{estimate:.0f} s (~{starts:.0f} s to start, ~{window_s:.1f} s a window)"
          + (f"; budget {args.budget:g} s" if args.budget else "")
          + f"; a process takes windows after {args.warmup_limit:g} s even if not warm", flush=True)
    windows: dict[str, list] = {m: [] for m in todo}
    cut, observed = None, []
    alone = args.start == "in-turn" or len(todo) == 1  # each mode's start measured alone
    with tempfile.TemporaryDirectory(prefix="fxguard-drafters-", ignore_cleanup_errors=True) as root:
        live: dict[str, Mode] = {}

        def new(mode: str) -> Mode:
            return Mode(mode, root, args.device, args.probe, args.warmup_limit, args.settle,
                        memory=alone)
        try:
            if args.start == "together":
                for m in todo:
                    live[m] = new(m)
                for m in todo:
                    live[m].warm()
                    if live[m].failed:
                        print(f"{m}: {live[m].failed}\n{live[m].tail()[-1500:]}", flush=True)
                print(f"every mode warm after {time.perf_counter() - began:.0f} s", flush=True)
            for k in range(1, args.repeats + 1):
                for m in todo:
                    need = window_s + (start_s if m not in live else 0)
                    if args.budget and time.perf_counter() - began + need > args.budget:
                        cut = (f"budget: {m} window {k} not started: it would end at "
                               f"~{time.perf_counter() - began + need:.0f} s of {args.budget:g} s")
                        break
                    if m not in live:
                        live[m] = new(m)
                    w = live[m].window(k, args.seconds)
                    if "status" in w and not any("status" in earlier for earlier in windows[m]):
                        print(f"{m} window {k}: {w['status']}\n{w['detail'][-1500:]}", flush=True)
                    if k == 1:
                        live[m].memory()
                        if args.start == "in-turn" and not live[m].failed:  # the next start's estimate
                            observed.append(live[m].warm_s)
                            start_s = max(observed)
                    windows[m].append(w)
                    print(json.dumps({"mode": m, "window": k, **{key: w.get(key) for key in (
                        "steps_in_window", "steps_per_s", "fairness", "errors", "error_kinds", "status")}}),
                          flush=True)
                    report["modes"].update({n: summary(live[n], windows[n], args.repeats, alone)
                                            for n in todo if n in live})
                    report["ratios"] = ratios(report["modes"])
                    report["run_s"] = round(time.perf_counter() - began, 1)
                    output.write(report)  # after each window: a cut-off run keeps what it measured
                if cut:
                    print(cut, flush=True)
                    break
        finally:
            for m in live.values():
                m.end()
    report["modes"].update({m: summary(live[m], windows[m], args.repeats, alone)
                            for m in todo if m in live})
    report["modes"].update({m: {"mode": m, "status": "not run: " + (cut or ""), "windows_planned": args.repeats,
                                "windows_measured": 0, "errors": 0, "error_kinds": []}
                            for m in todo if m not in live})
    report["ratios"] = ratios(report["modes"])
    report["cut_by_budget"] = cut
    report["run_s"] = round(time.perf_counter() - began, 1)
    output.write(report)
    print(table(report))
    print(f"run {report['run_s']:.0f} s" + (f"; {cut}" if cut else ""))
    print(json.dumps({k: v for k, v in report["ratios"].items() if k != "vs_processes_fast"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
