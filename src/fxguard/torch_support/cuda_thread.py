"""``cuda_graph_thread()``: what a thread that trains under CUDA graphs beside
others on one GPU needs, as one context manager (docs/cuda-graphs.md).

- **A CUDA stream of its own** for the whole block: threads on one stream share
  the caching allocator's free blocks, so a step's fresh tensors move between
  steps and every backward re-records; the stream starts after the work the
  thread queued before, and the thread's stream after the block waits for it.
- **Backwards in turn per device, first come first served** (``turns=True``):
  a GPU's backwards run on its one autograd worker, whose queue takes the
  node with the highest sequence number first (sequence numbers count per
  thread), so the thread that made the most nodes goes first and stays ahead.
  A ticket per device around the engine's run keeps the worker's queue to one
  backward, taken in the order the threads asked.

Threads outside the block, and programs that never use it, run as stock.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
import types
from typing import Any, Iterator

from ..machinery.changes import Outcome
from ..machinery.held_by_frame import on_my_stack, runs_on
from ..machinery.settle import current_frames
from ..machinery.wrapped import Swap, Wrapped, plain_function
from .options import Option

CHECK_EVERY = 0.25  # seconds between a waiter's looks at whether the tickets before it still run


class Turns:
    """First come, first served (threading.Lock promises no order among waiters).

    A ticket is held by the frame that asked for it (the backward's): it counts
    only while that frame runs on its thread's stack, so a ticket an interrupt
    left behind, waiting or served, wherever it landed, is skipped by the next
    look (a waiter looks every ``CHECK_EVERY`` seconds), and the ones after it
    are still served."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = self._serving = 0
        self._tickets: dict[int, tuple[int, types.FrameType]] = {}  # ticket: (thread, frame)
        self._depth = 0   # a backward inside the holder's own (torch.autograd.grad in a hook)

    def __enter__(self) -> None:
        me, frame = threading.get_ident(), sys._getframe(1)
        with self._cond:
            held = self._tickets.get(self._serving)
            if held is not None and held[0] == me:
                if on_my_stack(held[1]):
                    self._depth += 1   # a backward inside its own
                    return
                self._tickets.pop(self._serving)   # its frame ended: an interrupt left it
                self._skip_gone(check_frames=False)
            ticket, self._next = self._next, self._next + 1
            self._tickets[ticket] = (me, frame)
            try:
                while self._serving != ticket:
                    if not self._cond.wait(CHECK_EVERY):
                        self._skip_gone(check_frames=True)
            except BaseException:   # interrupted while waiting: the ticket is given up
                self._tickets.pop(ticket, None)
                self._skip_gone(check_frames=False)
                raise
            self._depth = 1

    def __exit__(self, *exc: Any) -> None:
        me = threading.get_ident()
        with self._cond:
            held = self._tickets.get(self._serving)
            if held is None or held[0] != me:
                return   # skipped as gone (cannot be while its frame runs)
            self._depth -= 1
            if self._depth <= 0:
                self._tickets.pop(self._serving, None)
                self._skip_gone(check_frames=False)

    def _skip_gone(self, check_frames: bool) -> None:
        """Serve past the served ticket where it was given up or released (and,
        with ``check_frames``, where its frame no longer runs: a waiter's
        periodic look, since walking other threads' stacks costs); wake the
        waiters (lock held)."""
        moved = False
        while self._serving < self._next:
            held = self._tickets.get(self._serving)
            if held is not None and (not check_frames or runs_on(*held)):
                break
            self._tickets.pop(self._serving, None)
            self._serving += 1
            self._depth = 0
            moved = True
        if moved:
            self._cond.notify_all()

    def waiting(self) -> int:
        """Threads holding a ticket, the one served included."""
        with self._cond:
            return self._next - self._serving


class Pace:
    """No thread starts a backward more than ``lead`` ahead of the slowest
    thread that keeps starting them: the worker's queue stays full (threads
    ahead wait, never the one behind), and steps stay within ``lead`` of each
    other.  Nothing is held while a backward runs, so an interrupt leaves
    nothing behind.  A thread that started none for ``idle`` seconds (ended,
    evaluating, interrupted) is not waited for, and starts level with the
    others when it comes back."""

    def __init__(self, lead: int = 2, idle: float = 0.5) -> None:
        self.lead, self.idle = lead, idle
        self._cond = threading.Condition()
        self._started: dict[int, tuple[int, float]] = {}  # thread: (backwards started, when last)

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while True:
                now = time.monotonic()
                others = [(c, last) for t, (c, last) in self._started.items()
                          if t != me and now - last < self.idle]
                slowest = min(others, default=None)   # fewest started; of those, the longest ago
                mine = self._started.get(me)
                if mine is None or now - mine[1] >= self.idle:   # new or back: level with the others
                    count = slowest[0] if slowest else 0
                else:
                    count = mine[0]
                if slowest is None or count <= slowest[0] + self.lead:
                    break
                # until the slowest starts a backward, or goes idle and is not waited for
                self._cond.wait(min(max(slowest[1] + self.idle - now, 0.001), CHECK_EVERY))
            self._started[me] = (count + 1, time.monotonic())
            self._cond.notify_all()

    def __exit__(self, *exc: Any) -> None:
        pass

    def leave(self) -> None:
        """The calling thread's block ends: not waited for from now on."""
        with self._cond:
            self._started.pop(threading.get_ident(), None)
            self._cond.notify_all()

    def waiting(self) -> int:
        return 0   # holds nothing: a fault harness finds no turn held


class DeviceTurns:
    """One Turns (or Pace) per device, made on first use; which device a
    thread's backwards take turns on, and how (None: not in a
    cuda_graph_thread block)."""

    def __init__(self) -> None:
        self._turns: dict[int, Turns] = {}
        self._paces: dict[int, Pace] = {}
        self._made = threading.Lock()
        self._thread = threading.local()

    def __call__(self, device: int) -> Turns:
        return self._for(self._turns, device, Turns)

    def pace(self, device: int) -> Pace:
        return self._for(self._paces, device, Pace)

    def _for(self, table: dict, device: int, make: Any) -> Any:
        found = table.get(device)
        if found is None:
            with self._made:
                found = table.setdefault(device, make())
        return found

    @contextlib.contextmanager
    def taking(self, device: int | None, paced: bool = False) -> Iterator[None]:
        stack = getattr(self._thread, "devices", None)
        if stack is None:
            stack = self._thread.devices = []
        stack.append((device, paced))
        try:
            yield
        finally:
            stack.pop()
            if paced and device is not None:
                self.pace(device).leave()

    def held(self) -> Any:
        """What a backward holds in this thread: its device's turn, its pace, or nothing."""
        stack = getattr(self._thread, "devices", None)
        device, paced = stack[-1] if stack else (None, False)
        if device is None:
            return contextlib.nullcontext()
        return self.pace(device) if paced else self(device)


device_turns = DeviceTurns()


class Blocks:
    """Which threads are inside a cuda_graph_thread() block, per device (a
    thread may draw there before its first CUDA graph exists)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[int, dict[int, int]] = {}   # device: {thread: depth}

    @contextlib.contextmanager
    def inside(self, device: int) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            threads = self._threads.setdefault(device, {})
            threads[me] = threads.get(me, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                threads[me] -= 1
                if not threads[me]:
                    del threads[me]

    def others(self, device: int) -> bool:
        """Whether another live thread is inside a block on ``device``."""
        me = threading.get_ident()
        with self._lock:
            threads = set(self._threads.get(device, ())) - {me}
        return bool(threads & set(current_frames())) if threads else False


blocks = Blocks()


@contextlib.contextmanager
def cuda_graph_thread(device: Any = None, *, turns: bool | str = True) -> Iterator[Any]:
    """Run the block on ``device`` (the current one where None) with a CUDA stream
    of its own, its backwards started in turn with the device's other such
    threads (``turns=True``: one at a time, first come first served;
    ``turns="paced"``: together, none more than two ahead of the slowest;
    ``False``: as torch queues them).  Yields the stream.  Wrap a drafter
    thread's whole loop, model and optimizer set-up included::

        def drafter(device):
            with cuda_graph_thread(device):
                train(device)

    Backwards in turn need fxguard installed (option cuda_graphs_per_thread);
    without it the block gives the stream only."""
    if turns not in (True, False, "paced"):
        raise ValueError(f"cuda_graph_thread(turns=...): True, False or 'paced', not {turns!r}")
    import torch
    index = torch.cuda._utils._get_device_index(device, optional=True)
    with torch.cuda.device(index):
        before = torch.cuda.current_stream(index)
        stream = torch.cuda.Stream(index)
        stream.wait_stream(before)
        try:
            with torch.cuda.stream(stream), blocks.inside(index), \
                    device_turns.taking(index if turns else None, paced=turns == "paced"):
                yield stream
        finally:
            before.wait_stream(stream)


# torch.autograd.backward (Tensor.backward's): the engine's run is row "record before
# backward"'s, and one function takes one swap.
BACKWARD = "torch.autograd.backward"
IN_TURN = """\
    with {ns}.turns.held():
        return {ns}.inner({call})
"""


def turns_needed(_facts: Any) -> tuple[Outcome, str] | None:
    if plain_function(BACKWARD) is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    return None


ROWS = (
    Wrapped("backwards in turn in cuda_graph_thread()",
            (Swap(BACKWARD, IN_TURN,
                  (("turns", lambda: device_turns),)),),
            turns_needed, option=Option.CUDA_GRAPHS_PER_THREAD),
)
