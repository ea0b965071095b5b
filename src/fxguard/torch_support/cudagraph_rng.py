"""Random numbers and device syncs of CUDA-graph trees in threads.

What torch shares (``CUDAGeneratorImpl``, ``CUDAGraph``; docs/cuda-graphs.md):

- every capture registers the device's default CUDA generator's *state*, and
  torch <= 2.11 marks that state capturing for the process while the capture
  runs: another thread's draw from it (``torch.randint(..., device="cuda")``,
  eager dropout) or replay of a graph that draws fails with "Offset increment
  outside graph capture encountered unexpectedly";
- graphs replay with the seed and offset tensors of the state they registered:
  two threads' graphs that draw read one pair, and draw the same numbers
  (pytorch#176754, open up to 2.15);
- ``torch.cuda.synchronize()``, or loading a compiled kernel, while another
  thread captures on that device fails ("operation not permitted when stream
  is capturing").

What the row does, for the trees' own captures (a tree manager's first empty
graph, each recording): on torch <= 2.11, where other threads use CUDA graphs
on the device (their tree managers or cuda_graph_thread() blocks), a capture
that draws nothing (graph_draws: torch's own tag says so) registers a state of
the thread's own in place of the default one (the default state is swapped
back as soon as the capture has begun), so nothing of the process is marked
capturing; a capture that draws records with the thread's own state in place
for the whole capture (the first thread to record such a graph on a device
keeps the default state, as alone), so each thread's replays draw a stream
of their own and never meet another's capture.  A thread's own state is
seeded from the device's seed and an ordinal that only grows, and
torch.cuda.manual_seed(_all) reseeds every one.  ``torch.cuda.synchronize()`` and a Triton kernel's first load wait
while another thread's capture itself (capture_begin to capture_end) runs on
the device; not for its warm-up, which may wait for a compile they belong to.
A capture is marked before capture_begin runs (which releases the GIL after
the stream has begun capturing) and begins once other threads' device-wide
calls already running there have returned: either order fails the call.
A single thread's captures run as stock.  On torch <= 2.11 one moment stays
open: capture_begin marks the state it registers capturing and releases the
GIL before the default state is put back, and an eager draw from the default
generator in another thread in that moment fails (a WARNING names it once).

An interrupt anywhere in these bodies leaves no stream capturing and no
state swapped in: capture_begin's and capture_end's bodies end a capture left
open and put the default state back on any exception, and a recording's plan
is held by the recording's frame (one an interrupt left behind lapses with it).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import types
import weakref
from typing import Any, Callable

from . import cuda_thread
from .graph_draws import draws
from .cudagraphs import OPTION, TREES, lane_getter, live_managers, stood_down
from ..machinery.changes import Outcome
from ..machinery.held_by_frame import on_my_stack, runs_on
from ..machinery.settle import current_frames
from ..machinery.wrapped import Swap, Wrapped, plain_function

log = logging.getLogger("fxguard")

NODE_RECORD = f"{TREES}.CUDAGraphNode._record"
CAPTURE_BEGIN = "torch.cuda.graphs.CUDAGraph.capture_begin"
CAPTURE_END = "torch.cuda.graphs.CUDAGraph.capture_end"
SYNCHRONIZE = "torch.cuda.synchronize"

class ThreadStreams:
    """Each thread's (lane's) generator state per device, and who records now."""

    def __init__(self, lane_maker: Callable[[], Callable[[], Any]]) -> None:
        self._lane_maker, self._lane_fn = lane_maker, None
        # lane: {device: (its generator state, its ordinal)}
        self._own: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, int]]] = \
            weakref.WeakKeyDictionary()
        self._owner: dict[int, Any] = {}   # device: weakref to the lane that keeps the default
        self._ordinals: dict[int, int] = {}  # device: the last ordinal given there
        self._made = threading.Lock()
        self._plan = threading.local()     # .stack: (generator to swap in, for the whole capture)
        self._warned: set[str] = set()
        self.enabled = True   # False: captures and syncs as stock (tests see the races)
        self._captures: dict[int, set[int]] = {}  # device: threads inside a capture there
        # device: {thread: the frame of its device-wide call running there}
        self._device_calls: dict[int, dict[int, types.FrameType]] = {}
        self._capture_cond = threading.Condition(threading.Lock())

    def _lane(self) -> Any:
        if self._lane_fn is None:
            self._lane_fn = self._lane_maker()
        return self._lane_fn()

    # -- whose state ---------------------------------------------------------------
    def _own_state(self, device: int) -> Any:
        import torch
        lane = self._lane()
        with self._made:
            states = self._own.setdefault(lane, {})
            if device not in states:
                default = torch.cuda.default_generators[device]
                gen = default.clone_state()
                # A stream of its own: the device's seed, moved by an ordinal that only
                # grows, so no two threads of the process's life share one.
                ordinal = self._ordinals[device] = self._ordinals.get(device, 0) + 1
                gen.manual_seed(_seed(default.initial_seed(), ordinal))
                states[device] = (gen, ordinal)
            return states[device][0]

    def reseed(self, seed: int, device: int | None) -> None:
        """torch.cuda.manual_seed(_all) ran: every thread's own state on the
        device (on every device where None) follows the new seed, each with its
        ordinal, as every graph follows the default generator's seed under stock."""
        with self._made:
            owned = [(d, gen, ordinal) for states in self._own.values()
                     for d, (gen, ordinal) in states.items()]
        if not owned:
            return
        if device is None:
            targets = None
        else:
            import torch
            targets = {torch.cuda.current_device() if device < 0 else device}
        for d, gen, ordinal in owned:
            if targets is None or d in targets:
                gen.manual_seed(_seed(int(seed), ordinal))

    def _keeps_default(self, device: int) -> bool:
        lane = self._lane()
        with self._made:
            owner = self._owner.get(device)
            if owner is None or owner() is None:
                self._owner[device] = weakref.ref(lane)
                return True
            return owner() is lane

    # -- the plan of a capture ------------------------------------------------------
    def _stack(self) -> list:
        stack = getattr(self._plan, "stack", None)
        if stack is None:
            stack = self._plan.stack = []
        return stack

    def _current(self) -> "_Plan | None":
        """This thread's innermost recording's plan.  A plan is held by the
        recording's frame: one an interrupt left on the stack (its frame gone)
        is put back and dropped here."""
        stack = self._stack()
        while stack and not on_my_stack(stack[-1].frame):
            stack.pop().swap_out()
        return stack[-1] if stack else None

    def recording(self, device: int, model: Any) -> "_Plan":
        """A node's recording of ``model`` on ``device`` (trees' _record)."""
        if not self.enabled:
            return _Plan(self, None, False)
        if model is None:      # a tree manager's first, empty graph
            if live_managers.on_device(device) >= 1:
                self._warn_default_stream(device)
            return _Plan(self, device if _marks_process(device, 1) else None, whole=False)
        if not draws(model):
            # Alone, or where torch marks each capture's own state: as stock.  Beside
            # others' graphs on torch <= 2.11: nothing of the process marked capturing.
            return _Plan(self, device if _marks_process(device, 2) else None, whole=False)
        if live_managers.on_device(device) >= 2:   # other threads' graphs on the device
            self._warn_drawing(device)
        if self._keeps_default(device):
            return _Plan(self, None, False)
        return _Plan(self, device, whole=True)

    def manager_recording(self, device: int) -> "_Plan":
        """A new tree manager's first, empty capture (its __init__, whose swap is
        the capture-lock rows': cudagraphs.MANAGER_CAPTURE)."""
        return self.recording(device, None)

    def _warn_default_stream(self, device: int) -> None:
        import torch
        if "stream" in self._warned or \
                torch.cuda.current_stream(device) != torch.cuda.default_stream(device):
            return
        self._warned.add("stream")
        log.warning(
            "fxguard: thread %r runs CUDA graphs on cuda:%d's default stream beside other "
            "threads' CUDA graphs: threads on one stream share the caching allocator's free "
            "blocks, so their backwards re-record every step. Give each such thread a stream "
            "of its own around its whole loop: `with fxguard.cuda_graph_thread(device):` "
            "(a stream, backwards in turn) or `with "
            "torch.cuda.stream(torch.cuda.Stream()):` (docs/cuda-graphs.md)",
            threading.current_thread().name, device)

    def _warn_drawing(self, device: int) -> None:
        import torch
        if torch.__version__ >= (2, 12) or "drawing" in self._warned:
            return  # 2.12+ keeps the capturing mark per capture
        self._warned.add("drawing")
        log.warning(
            "fxguard: thread %r records a CUDA graph that draws random numbers on cuda:%d "
            "while other threads run CUDA graphs there; until it ends, torch %s marks the "
            "generator it records with as capturing for the process, and a draw from the "
            "default CUDA generator in another thread (torch.randint/randn(..., device='cuda') "
            "without generator=, eager dropout) fails with 'Offset increment outside graph "
            "capture encountered unexpectedly'. Draw eager random numbers from a generator of "
            "the thread's own (torch.Generator(device='cuda')); graphs that draw are safe "
            "(docs/cuda-graphs.md)", threading.current_thread().name, device,
            torch.__version__)

    def _warn_beginning(self, device: int) -> None:
        """torch <= 2.11: capture_begin marks the state it registers (the
        thread's own, swapped in) capturing for the process and releases the
        GIL; fxguard swaps the default back once it returns, but cannot order
        another thread's eager draw against that moment."""
        import torch
        if torch.__version__ >= (2, 12) or "beginning" in self._warned:
            return
        self._warned.add("beginning")
        log.warning(
            "fxguard: thread %r begins a CUDA-graph capture on cuda:%d while other threads run "
            "CUDA graphs or cuda_graph_thread() blocks there; torch %s marks the generator "
            "state a capture registers as capturing for the process from capture_begin on, "
            "so a draw from the default CUDA "
            "generator in another thread at that moment (torch.randint/randn(..., "
            "device='cuda') without generator=, eager dropout) can fail with 'Offset increment "
            "outside graph capture encountered unexpectedly'. fxguard puts the default state "
            "back as soon as the capture has begun, but cannot order other threads' eager "
            "draws against it: draw eager random numbers from a generator of the thread's own "
            "(torch.Generator(device='cuda')); torch 2.12+ has no such moment "
            "(docs/cuda-graphs.md)", threading.current_thread().name, device, torch.__version__)

    # -- the capture (CUDAGraph.capture_begin / capture_end) -------------------------
    # Each step below may be interrupted: the templates call close() on any
    # exception, and it is idempotent.
    def begin(self) -> Any:
        """Before capture_begin: this thread captures from now on, and the
        generator state the capture registers."""
        self._capture_starts()
        plan = self._current()
        if plan is None or plan.device is None or plan.saved is not None:
            return None
        if not plan.whole and (live_managers.on_device(plan.device) >= 2
                               or cuda_thread.blocks.others(plan.device)):
            self._warn_beginning(plan.device)
        plan.swap_in()
        return plan

    def begun(self, plan: Any) -> None:
        if plan is not None and not plan.whole:
            plan.swap_out()

    def close(self, end_capture: Callable[[], Any]) -> None:
        """capture_begin, capture_end or what follows either here raised: a
        capture still open is ended (a stream left capturing fails every later
        call on the device), the default state put back, the mark dropped."""
        import torch
        if torch.cuda.is_current_stream_capturing():
            try:
                end_capture()
            except Exception:  # noqa: BLE001 - the capture is over either way
                pass
        self.ended()

    def ended(self) -> None:
        plan = self._current()
        if plan is not None:
            plan.swap_out()
        self._unmark_capture()

    # -- who captures now (capture_begin, called or not yet, to capture_end) -----------
    def _unmark_capture(self) -> None:
        """This thread captures nowhere: idempotent, so a cleanup that runs again
        after an interrupt at any line here still leaves no mark."""
        me = threading.get_ident()
        with self._capture_cond:
            for threads in self._captures.values():
                threads.discard(me)
            self._capture_cond.notify_all()

    def _capture_starts(self, device: int | None = None) -> None:
        """Before capture_begin: marks this thread capturing on its device (the
        current one where None; device-wide calls in other threads wait from now
        on), then waits for the ones already running there to return:
        capture_begin releases the GIL once the stream captures, and a device sync
        or kernel load meanwhile fails ("operation not permitted when stream is
        capturing"), as one still running when the capture begins does."""
        if device is None:
            import torch
            device = torch.cuda.current_device()
        me = threading.get_ident()
        with self._capture_cond:
            self._captures.setdefault(device, set()).add(me)
            while self.enabled:
                calls = self._device_calls.get(device, {})
                # A call an interrupt left listed (its frame no longer runs) is dropped.
                running = {t for t, frame in calls.items() if t != me and runs_on(t, frame)}
                for gone in set(calls) - running - {me}:
                    calls.pop(gone, None)
                if not running:
                    return
                self._capture_cond.wait(0.05)

    def no_capture_on(self, device: int) -> "_DeviceCall":
        """A device-wide call on ``device``: it waits while another thread captures
        there (only the capture itself, never its warm-up, which can wait for
        compiles: a wait there could close a cycle), and a capture does not
        begin there while it runs."""
        return _DeviceCall(self, device)

    def _device_call_begins(self, device: int, frame: types.FrameType) -> None:
        me = threading.get_ident()
        with self._capture_cond:
            while True:
                others = self._captures.get(device, set()) - {me}
                if not others:
                    break
                # Threads running Python now: a capture runs inside the recording's
                # frames, the autograd worker's too (a C++ thread threading does not list).
                alive = set(current_frames())
                self._captures[device] -= others - alive  # a thread that ended mid-capture
                if others & alive:
                    self._capture_cond.wait(0.05)
            self._device_calls.setdefault(device, {})[me] = frame

    def _device_call_ends(self, device: int) -> None:
        with self._capture_cond:
            self._device_calls.get(device, {}).pop(threading.get_ident(), None)
            self._capture_cond.notify_all()


class _DeviceCall:
    """``with``: a device-wide call of the calling frame (the swapped function's),
    listed while it runs; one an interrupt left listed lapses with that frame."""

    def __init__(self, streams: ThreadStreams, device: int) -> None:
        self.streams, self.device = streams, device

    def __enter__(self) -> None:
        self.streams._device_call_begins(self.device, sys._getframe(1))

    def __exit__(self, *exc: Any) -> None:
        self.streams._device_call_ends(self.device)


def _seed(seed: int, ordinal: int) -> int:
    return (seed + 0x9E3779B97F4A7C15 * ordinal) % (1 << 63)


def _marks_process(device: int, managers: int) -> bool:
    """Whether a capture that draws nothing needs a state of its own at its
    beginning: on torch <= 2.11 (whose capture marks the state it registers
    capturing for the process) where other threads use CUDA graphs on the
    device: more live tree managers there than ``managers`` - 1, or another
    thread's cuda_graph_thread() block."""
    import torch
    if torch.__version__ >= (2, 12):
        return False
    return live_managers.on_device(device) >= managers or cuda_thread.blocks.others(device)


class _Plan:
    """One recording on a device: whether the thread's own generator state
    stands in for the default one (device None: no, as stock), for the whole
    capture or for its beginning only.  The state is made as the capture begins."""

    def __init__(self, streams: ThreadStreams, device: int | None, whole: bool) -> None:
        self.streams, self.device, self.whole = streams, device, whole
        self.saved: Any = None
        self.frame: types.FrameType | None = None

    @property
    def state(self) -> Any:
        return None if self.device is None else self.streams._own_state(self.device)

    def swap_in(self) -> None:
        import torch
        default = torch.cuda.default_generators[self.device]
        own = self.state
        self.saved = default.graphsafe_get_state()
        default.graphsafe_set_state(own)

    def swap_out(self) -> None:
        import torch
        if self.saved is not None:
            torch.cuda.default_generators[self.device].graphsafe_set_state(self.saved)
            self.saved = None

    def __enter__(self) -> "_Plan":
        self.frame = sys._getframe(1)   # the recording's: the plan lapses with it
        self.streams._stack().append(self)
        return self

    def _leave(self) -> None:
        self.swap_out()   # a capture that failed before its end
        stack = self.streams._stack()
        if self in stack:
            stack.remove(self)

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        try:
            self._leave()
        except BaseException:
            self._leave()   # idempotent: an interrupt inside it
            raise
        if self.device is not None and not self.whole and isinstance(error, RuntimeError) \
                and "not in capture mode" in str(error):
            raise RuntimeError(
                "fxguard: a CUDA graph that fxguard read as drawing no random numbers drew "
                "from the default CUDA generator while it recorded (an op whose name does not "
                "say it draws); please report it. install(cuda_graphs_per_thread=False) "
                "records as stock") from error


thread_streams = ThreadStreams(lane_getter)


def recording_on(device: Any) -> Any:
    """What a device-wide call (torch.cuda.synchronize(device), a kernel load)
    waits for: other threads' captures on the device to end (not the capture
    lock, which also covers warm-ups that may wait for a compile this thread's
    call belongs to)."""
    import torch
    if not thread_streams.enabled:
        return contextlib.nullcontext()
    return thread_streams.no_capture_on(torch.cuda._utils._get_device_index(device, optional=True))


RECORD = """\
    with {ns}.streams.recording(self.device, model):
        return {ns}.inner({call})
"""
# Every line inside the try, cleanup in the handler (idempotent): an interrupt at
# any line of the body still ends a capture it began and puts the state back.
BEGIN = """\
    try:
        plan = {ns}.streams.begin()
        began = {ns}.inner({call})
        {ns}.streams.begun(plan)
        return began
    except BaseException:
        {ns}.streams.close(self.capture_end)
        raise
"""
END = """\
    try:
        ended = {ns}.inner({call})
        {ns}.streams.ended()
        return ended
    except BaseException:
        {ns}.streams.close(lambda: {ns}.inner(self))
        raise
"""
SYNC = """\
    with {ns}.waiting(device):
        return {ns}.inner({call})
"""
LOAD = """\
    if self.module is not None:
        return {ns}.inner({call})
    with {ns}.waiting(None):
        return {ns}.inner({call})
"""
# torch.cuda.manual_seed (the current device's) and manual_seed_all (torch.manual_seed's):
# threads' own states follow the new seed.
RESEED = """\
    seeded = {{ns}}.inner({{call}})
    {{ns}}.streams.reseed(seed, {device})
    return seeded
"""
STREAMS = ("streams", lambda: thread_streams)
KERNEL_LOAD = "triton.compiler.compiler.CompiledKernel._init_handles"


def rng_needed(_facts: Any) -> tuple[Outcome, str] | None:
    import torch
    if plain_function(NODE_RECORD) is None or plain_function(CAPTURE_BEGIN) is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    if not hasattr(torch.Generator, "graphsafe_set_state"):
        return stood_down("no graph-safe generator state on this torch")
    code = plain_function(NODE_RECORD).__code__
    if "graph" not in code.co_names or "device" not in code.co_names:
        return stood_down("CUDAGraphNode._record is not the one fxguard knows")
    return None


def reseed_needed(_facts: Any) -> tuple[Outcome, str] | None:
    for where in ("torch.cuda.random.manual_seed", "torch.cuda.random.manual_seed_all"):
        fn = plain_function(where)
        if fn is None or "seed" not in fn.__code__.co_varnames[:fn.__code__.co_argcount]:
            return (Outcome.NOT_COVERED, f"{where} is not the one fxguard knows: a later "
                    "manual_seed leaves the threads' own CUDA-graph streams as they are")
    return None


ROWS = (
    Wrapped("CUDA-graph random numbers per thread",
            (Swap(NODE_RECORD, RECORD, (STREAMS,), params=("self", "model")),
             Swap(CAPTURE_BEGIN, BEGIN, (STREAMS,), params=("self",)),
             Swap(CAPTURE_END, END, (STREAMS,), params=("self",))),
            rng_needed, option=OPTION),
    # Its own row: a manual_seed fxguard does not know leaves the graphs' streams per thread.
    Wrapped("CUDA-graph streams follow torch.cuda.manual_seed",
            (Swap("torch.cuda.random.manual_seed", RESEED.format(device=-1), (STREAMS,),
                  params=("seed",)),
             Swap("torch.cuda.random.manual_seed_all", RESEED.format(device=None), (STREAMS,),
                  params=("seed",))),
            reseed_needed, option=OPTION),
    Wrapped("torch.cuda.synchronize() waits for the device's recording",
            (Swap(SYNCHRONIZE, SYNC, (("waiting", lambda: recording_on),),
                  params=("device",)),),
            lambda _facts: None, option=OPTION),
    # Loading a compiled kernel's module (cuModuleLoadData) while a stream of the
    # device captures fails "operation not permitted when stream is capturing":
    # a fresh kernel's load waits until other threads' captures there end.
    Wrapped("Triton kernel loads wait for the device's recording",
            (Swap(KERNEL_LOAD, LOAD, (("waiting", lambda: recording_on),),
                  params=("self",)),),
            lambda _facts: None, option=OPTION),
)
