"""Three drafter threads, each training its own small model with flex attention.

What a speculative-decoding trainer does: every drafter thread builds a
block mask with ``create_block_mask`` each step, calls one shared
``torch.compile(flex_attention)``, and sees sequence lengths change.  A CPU
shows the forward passes, the races and the compile counts; training needs a
GPU (on the CPU, torch's flex attention backward raises NotImplementedError).

    python examples/drafters.py              # stock torch
    python examples/drafters.py --fxguard    # with fxguard.install()

It reports what such a trainer suffers on the installed torch and exits 1
if it saw any of it, 0 if none:

- errors raised in a drafter thread;
- ``torch.compiler.is_compiling()`` read True in a drafter's eager code while
  another thread compiled (transformers then picks the dense attention path);
- duplicate compiles: more graphs than distinct shapes (each copy also eats
  ``recompile_limit``);
- random draws repeated: numbers a drafter drew while another thread compiled,
  drawn again after that compile (dropout masks, sampled positions).

Real runs hit these by chance.  To show the same result every run, drafter 0's
first compile waits (in a compile-start callback) until the other two drafters
have prepared their batch and called the compiled attention themselves.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

DRAFTERS, HEADS, DIM, VOCAB = 3, 2, 16, 128
LENGTHS = (128, 256)  # every drafter goes through each, in its own order
STUCK_AFTER = 240  # seconds: drafters not done by then are deadlocked (the run takes ~30 s)

attention = torch.compile(flex_attention)  # one compiled function, shared by every drafter


def causal(b, h, q, kv):
    return q >= kv


class Drafter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HEADS * DIM)
        self.qkv = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.head = torch.nn.Linear(HEADS * DIM, VOCAB)

    def forward(self, tokens: torch.Tensor, mask) -> torch.Tensor:
        b, n = tokens.shape
        x = F.dropout(self.embed(tokens), 0.1, self.training)
        q, k, v = self.qkv(x).view(b, n, 3, HEADS, DIM).permute(2, 0, 3, 1, 4)
        y = attention(q, k, v, block_mask=mask).transpose(1, 2).reshape(b, n, HEADS * DIM)
        return self.head(y)


class Report:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.compiling_seen = 0   # is_compiling() True in eager code
        self.drawn: list[tuple] = []  # every batch of random positions drawn
        self.stuck: list[str] = []    # drafters still running when the run gave up on them

    def add(self, **what) -> None:
        with self.lock:
            for name, value in what.items():
                getattr(self, name).append(value) if isinstance(getattr(self, name), list) \
                    else setattr(self, name, getattr(self, name) + value)


def step(model, optimizer, length: int, device: str, report: Report, ready=None) -> None:
    # The batch: sampled positions (random draws), and the eager check transformers makes.
    tokens = torch.randint(0, VOCAB, (2, length), device=device)
    report.add(drawn=tuple(tokens[0, :8].tolist()),
               compiling_seen=int(torch.compiler.is_compiling()))
    if ready is not None:
        ready.set()
    mask = create_block_mask(causal, None, None, length, length, device=device)
    logits = model(tokens, mask)
    if optimizer is not None:  # flex attention has a backward on CUDA
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def run(device: str, steps: int) -> Report:
    report, train = Report(), device == "cuda"
    others_ready = [threading.Event() for _ in range(DRAFTERS - 1)]
    others = []
    first_compile = threading.Event()

    @torch._dynamo.callback.on_compile_start
    def hold_first_compile(*args, **kwargs):  # the forced interleaving (see the docstring)
        if threading.current_thread().name != "drafter-0" or first_compile.is_set():
            return
        first_compile.set()
        for ready in others_ready:
            ready.wait(60)
        deadline = time.monotonic() + 60
        while not all(_waits_for_a_compile(t) for t in others) and time.monotonic() < deadline:
            time.sleep(0.005)

    def drafter(index: int) -> None:
        model = Drafter().to(device).train(train)
        optimizer = torch.optim.AdamW(model.parameters()) if train else None
        lengths = LENGTHS[index % 2:] + LENGTHS[:index % 2] if index else LENGTHS
        try:
            with torch.set_grad_enabled(train):
                if index:  # drafters 1, 2: their first step starts while drafter 0 compiles
                    first_compile.wait(60)
                    step(model, optimizer, LENGTHS[0], device, report, others_ready[index - 1])
                for i in range(steps):
                    step(model, optimizer, lengths[i % len(lengths)], device, report)
        except Exception as e:  # what a trainer would see
            report.add(errors=f"drafter {index}: {type(e).__name__}: {e}"[:300])

    threads = [threading.Thread(target=drafter, args=(i,), name=f"drafter-{i}", daemon=True)
               for i in range(DRAFTERS)]
    others += threads[1:]
    for t in threads:
        t.start()
    deadline = time.monotonic() + STUCK_AFTER
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    report.stuck = [t.name for t in threads if t.is_alive()]
    torch._dynamo.callback.callback_handler.remove_start_callback(hold_first_compile)
    return report


def _frames() -> dict:
    """sys._current_frames() with the collector paused: on CPython 3.11 a
    collection it triggers can hang the process (it frees a threading.local
    under the lock the walk holds)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if paused:
            gc.enable()


def _waits_for_a_compile(thread: threading.Thread) -> bool:
    """The thread is inside dynamo's callback for a cache miss (waiting for the
    compile in flight, or for its own turn)."""
    frame = _frames().get(thread.ident)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.endswith(("convert_frame.py", "compile_once.py", "compile_gate.py")):
            return True
        frame = frame.f_back
    return not thread.is_alive()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fxguard", action="store_true", help="fxguard.install() first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=4, help="steps per drafter after the first")
    args = parser.parse_args()
    if args.fxguard:
        import fxguard
        fxguard.install()
    from torch._dynamo.utils import counters
    torch.manual_seed(0)  # one generator for the process: seeding it per thread would repeat draws
    report = run(args.device, args.steps)
    graphs = counters["stats"]["unique_graphs"]
    repeated = len(report.drawn) - len(set(report.drawn))
    print(f"torch {torch.__version__} on {args.device}, "
          f"{'with fxguard' if args.fxguard else 'stock'}: {DRAFTERS} drafters, lengths {LENGTHS}")
    print(f"  errors: {len(report.errors)}" + "".join(f"\n    {e}" for e in report.errors[:5]))
    print(f"  is_compiling() True in eager code: {report.compiling_seen}")
    print(f"  graphs compiled: {graphs} for {len(LENGTHS)} lengths")
    print(f"  random draws repeated: {repeated} of {len(report.drawn)}")
    if report.stuck:
        print(f"  stuck: {', '.join(report.stuck)} made no end in {STUCK_AFTER} s "
              "(deadlocked; stacks on stderr)")
    suffered = report.errors or report.compiling_seen or graphs > len(LENGTHS) or repeated \
        or report.stuck
    print("  result: " + ("the drafters suffered from shared trace state" if suffered else "clean"))
    if report.stuck:  # their threads would hold up the interpreter's exit
        import faulthandler
        faulthandler.dump_traceback(all_threads=True)
        sys.stdout.flush()
        os._exit(1)
    return 1 if suffered else 0


if __name__ == "__main__":
    sys.exit(main())
