"""CUDA-graph trees (``mode="reduce-overhead"``) per thread.

What torch shares between threads (``torch/_inductor/cudagraph_trees.py``,
``compile_fx.cudagraphify``; docs/cuda-graphs.md has it per release):

- torch <= 2.12 sets the tree managers up in the thread that imported the
  module only: any other thread's first CUDA-graph call fails ``get_obj``'s
  assert; and warm-up and recording run in several threads at once;
- ``cudagraphify`` makes one callable per compile, bound on its first call to
  that thread's tree (<= 2.12: for every thread; 2.13+: per Python thread, so
  the backwards of all threads, which run on one autograd worker per device,
  share the first one's);
- ``mark_step_begin()`` moves one counter for the process, and every compiled
  call of any thread bumps the one generation a tree reads as "a new step".

The rows make each of these the calling thread's.  A thread's state is kept
where torch keeps its tree managers: in torch's thread-local stash, which an
autograd worker takes from the thread whose backward it runs, so a
single-threaded trainer's ``cudagraph_mark_step_begin()`` still reaches its
backward's graphs (a plain ``threading.local`` would not).
"""
from __future__ import annotations

import threading
import types
import weakref
from collections import defaultdict
from typing import Any, Callable

from ..machinery import originals, rewrite
from ..machinery.changes import Outcome
from ..machinery.wrapped import Swap, Wrapped, plain_function
from .options import Option

TREES = "torch._inductor.cudagraph_trees"
MANAGER = f"{TREES}.CUDAGraphTreeManager"
CUDAGRAPHIFY = "torch._inductor.compile_fx.cudagraphify"
CALLABLE_ROW = "CUDA-graph callable per thread"
TAGGING = "torch._dynamo.mutation_guard.install_generation_tagging_init"
LANE_KEY = "fxguard_cudagraph_lane"
OPTION = Option.CUDA_GRAPHS_PER_THREAD


class Lane:
    """One thread's CUDA-graph step counter and generation.  Written by its
    thread only; read there and on the autograd workers running its backward."""
    __slots__ = ("step", "generation", "__weakref__")

    def __init__(self) -> None:
        self.step = 0        # mark_step_begin() counts down, as torch's MarkStepBox
        self.generation = 0  # this thread's entries into compiled functions


def _tls() -> tuple[Callable[[str], bool], Callable[[str], Any], Callable[[str, Any], None]]:
    import torch
    return torch._C._is_key_in_tls, torch._C._get_obj_in_tls, _owning(torch._C._stash_obj_in_tls)


def _owning(stash: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """torch's stash, giving it a reference of its own.  The binding of torch
    <= 2.12 keeps the object without a reference yet releases one when the
    thread ends (torch's own stashed objects live in a threading.local too);
    2.13+ takes one.  Told apart by the object's count, per call."""
    import ctypes
    import sys

    def stash_owned(key: str, obj: Any) -> None:
        before = sys.getrefcount(obj)
        stash(key, obj)
        if sys.getrefcount(obj) == before:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return stash_owned


# What a thread made for itself where torch's stash had nothing, kept per Python
# thread: an autograd worker gets a fresh copy of the stash with each backward,
# so a backward from a thread that never ran a compiled function would make (and
# record) anew each time; it reuses the worker's own instead, as torch 2.13 does.
_made_here = threading.local()


def _own(name: str, make: Callable[[], Any]) -> Any:
    made = getattr(_made_here, name, None)
    if made is None:
        made = make()
        setattr(_made_here, name, made)
    return made


def lane_getter() -> Callable[[], Lane]:
    """lane(): the calling thread's Lane (a worker: the backward's thread's),
    made on first use."""
    has, get, stash = _tls()

    def lane() -> Lane:
        if has(LANE_KEY):
            return get(LANE_KEY)
        own = _own("lane", Lane)
        stash(LANE_KEY, own)
        return own
    return lane


# -- the callable per thread ------------------------------------------------------------

# run()'s closure in cudagraphify: the cell that holds its tree-bound callable,
# per torch generation, and what a fresh one starts with; the other cells are shared.
STATE_CELLS: dict[str, Callable[[], Any]] = {
    "compiled_fn": lambda: None,   # <= 2.12: nonlocal, one for every thread
    "thread_local": threading.local,  # 2.13+: per Python thread
}
SHARED_CELLS = frozenset({"cudagraphify_fn", "model", "static_input_idxs"})


def run_cells(fn: types.FunctionType | None = None) -> tuple[str, ...] | None:
    """The free variables of cudagraphify's nested run(), where they are the
    ones this module knows (one state cell, the rest shared); else None."""
    fn = fn or plain_function(CUDAGRAPHIFY)
    code = originals.get_original(fn, "__code__") if fn else None  # not the row's own
    runs = [c for c in (code.co_consts if code else ()) if
            isinstance(c, types.CodeType) and c.co_name == "run"]
    if len(runs) != 1:
        return None
    cells = set(runs[0].co_freevars)
    state = cells - SHARED_CELLS
    return runs[0].co_freevars if len(state) == 1 and state <= set(STATE_CELLS) else None


def per_thread(run: types.FunctionType, lane: Callable[[], Lane]) -> Callable[[Any], Any]:
    """A callable that runs its own copy of ``run`` (fresh state cell) per
    thread: each thread's calls, and its backward on an autograd worker, reach
    that thread's tree."""
    code, closure = run.__code__, run.__closure__ or ()

    def spawn() -> types.FunctionType:
        cells = tuple(types.CellType(STATE_CELLS[name]()) if name in STATE_CELLS else cell
                      for name, cell in zip(code.co_freevars, closure))
        return types.FunctionType(code, run.__globals__, run.__name__, run.__defaults__, cells)

    copies: weakref.WeakKeyDictionary[Lane, Callable[[Any], Any]] = weakref.WeakKeyDictionary()
    made = threading.Lock()  # a thread's first call; later ones only read

    def run_in_thread(new_inputs: Any) -> Any:
        own = lane()
        fn = copies.get(own)
        if fn is None:
            with made:
                fn = copies.setdefault(own, spawn())
        return fn(new_inputs)
    run_in_thread.__qualname__ = run.__qualname__
    return run_in_thread


def callable_per_thread_in_place() -> bool:
    """Whether cudagraphify hands out per-thread callables now (compile once may
    then share a CUDA-graph compile)."""
    fn = plain_function(CUDAGRAPHIFY) if _imported("torch._inductor.compile_fx") else None
    return fn is not None and CALLABLE_ROW in originals.changed_by(fn, "__code__")


def _imported(name: str) -> bool:
    import sys
    return name in sys.modules


# -- tree managers per thread (torch <= 2.12) ----------------------------------------------

TREE_STATE = ("tree_manager_containers", "tree_manager_locks")


def tree_state_getter() -> Callable[[str], Any]:
    """state(attr_name): the calling thread's tree managers (a worker: its
    backward's thread's), made on first use as torch 2.13's _initialize_tls
    does; None for a name it does not know.  torch's stash first: an autograd
    worker must see the thread whose backward it runs."""
    has, get, stash = _tls()

    def state(attr_name: str) -> Any:
        if attr_name not in TREE_STATE:
            return None
        if not has(attr_name):
            containers, locks = _own("trees", lambda: ({}, defaultdict(threading.Lock)))
            stash("tree_manager_containers", containers)
            stash("tree_manager_locks", locks)
        return get(attr_name)
    return state


class CaptureLocks:
    """One lock per device for warm-up and recording (torch 2.13+ holds one for
    every device).  Process-wide on purpose: CUDA capture state is."""

    def __init__(self) -> None:
        self._locks: dict[int, threading.RLock] = {}
        self._made = threading.Lock()

    def __call__(self, device_index: int) -> Any:
        lock = self._locks.get(device_index)
        if lock is None:
            with self._made:
                lock = self._locks.setdefault(device_index, threading.RLock())
        return lock


capture_locks = CaptureLocks()


# -- steps and generations per thread --------------------------------------------------------

class LiveManagers:
    """Tree managers made and not shut down, in any thread: a reset in one
    thread leaves cached tensors on while another's trees run."""

    def __init__(self) -> None:
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, manager: Any) -> Any:
        with self._lock:
            self._managers.add(manager)
        return manager

    def discard(self, manager: Any) -> None:
        with self._lock:
            self._managers.discard(manager)

    def __bool__(self) -> bool:
        with self._lock:
            return len(self._managers) > 0

    def on_device(self, device_index: int) -> int:
        """How many live managers record on that device (any thread's)."""
        with self._lock:
            return sum(getattr(m, "device_index", None) == device_index for m in self._managers)


live_managers = LiveManagers()


def after_reset_maker() -> Callable[[], None]:
    lane = lane_getter()

    def after_reset() -> None:
        """reset_cudagraph_trees() shut this thread's trees down; torch then
        zeroes the step counter and turns cached tensors off for the process."""
        lane().step = 0
        if live_managers:
            import torch
            torch._C._set_cached_tensors_enabled(True)
    return after_reset


# -- the bodies ------------------------------------------------------------------------------

def _dynamo() -> Any:
    import torch
    return torch.compiler.is_dynamo_compiling


def _manager_capture() -> Callable[[int], Any]:
    """The plan of a new tree manager's first (empty) capture: row 'CUDA-graph
    random numbers per thread' (one function, one swap: it rides on this one)."""
    from .cudagraph_rng import thread_streams
    return thread_streams.manager_recording


MANAGER_CAPTURE = ("manager_capture", _manager_capture)
LANE = ("lane", lane_getter)
DYNAMO = ("is_dynamo_compiling", _dynamo)

PER_THREAD_CALLABLE = """\
    return {ns}.per_thread({ns}.inner({call}), {ns}.lane)
"""
GET_OBJ = """\
    found = {ns}.state(attr_name)
    return {ns}.inner({call}) if found is None else found
"""
CAPTURE_INIT = """\
    with {ns}.capture_lock(device_index), {ns}.manager_capture(device_index):
        return {ns}.inner({call})
"""
CAPTURE_METHOD = """\
    with {ns}.capture_lock(self.device_index):
        return {ns}.inner({call})
"""
MARK_STEP = """\
    {ns}.lane().step -= 1
"""
CURRENT_GENERATION = """\
    lane = {ns}.lane()
    return lane.step if lane.step != 0 else lane.generation
"""
USER_MARKED = """\
    return {ns}.lane().step != 0
"""
# Every entry into a torch.compile'd function (OptimizeContext's on_enter).
ENTRY = """\
    if not {ns}.is_dynamo_compiling():
        {ns}.lane().generation += 1
    return {ns}.inner({call})
"""
RESET = """\
    result = {ns}.inner({call})
    {ns}.after_reset()
    return result
"""
MANAGER_MADE = """\
    return {ns}.live.add({ns}.inner({call}))
"""
MANAGER_SHUT = """\
    {ns}.live.discard(self)
    return {ns}.inner({call})
"""

# The stock bodies the step swaps replace whole (rewrite.def_body's form).
STOCK_BODIES = {
    f"{TREES}.mark_step_begin": "MarkStepBox.mark_step_counter -= 1",
    f"{MANAGER}.get_curr_generation": "if MarkStepBox.mark_step_counter != 0:\n"
                                      "    return MarkStepBox.mark_step_counter; "
                                      "return GenerationTracker.generation",
    f"{MANAGER}.user_invoked_mark_step": "return MarkStepBox.mark_step_counter != 0",
}
# What the wrapped ones must still do for the swaps to mean what they say.
STOCK_PARTS = {
    TAGGING: ("GenerationTracker.generation += 1",),
    f"{TREES}.reset_cudagraph_trees": ("MarkStepBox.mark_step_counter = 0",
                                       "_set_cached_tensors_enabled(False)"),
}
# torch 2.13+: the thread's threading.local first, so an autograd worker that once
# set up trees of its own keeps them for the backwards of every thread.
INITIALIZING_GET_OBJ = ("if hasattr(local, attr_name):\n    return getattr(local, attr_name); "
                        "if not torch._C._is_key_in_tls(attr_name):\n    _initialize_tls(local)\n"
                        "    return getattr(local, attr_name); "
                        "return torch._C._get_obj_in_tls(attr_name)")
ASSERTING_GET_OBJ = ("if hasattr(local, attr_name):\n    return getattr(local, attr_name)\n"
                     "else:\n    assert torch._C._is_key_in_tls(attr_name)\n"
                     "    return torch._C._get_obj_in_tls(attr_name)")


def _body(where: str) -> str | None:
    """The body of the function at ``where`` as torch wrote it (not a row's own)."""
    fn = plain_function(where)
    return rewrite.def_body(originals.get_original(fn, "__code__")) if fn is not None else None


def stood_down(detail: str) -> tuple[Outcome, str]:
    return Outcome.NOT_COVERED, f"{detail}; CUDA graphs in threads run as stock (docs/cuda-graphs.md)"


def callable_needed(_facts: Any) -> tuple[Outcome, str] | None:
    if plain_function(CUDAGRAPHIFY) is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    if run_cells() is None:
        return stood_down("cudagraphify's run() keeps other state than fxguard knows")
    return None


def trees_needed(facts: Any) -> tuple[Outcome, str] | None:
    body = _body(f"{TREES}.get_obj")
    if body is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    if body != ASSERTING_GET_OBJ:
        if "_initialize_tls" in body:
            return Outcome.NOT_NEEDED, "torch makes them per thread (2.13+); capture one at a time"
        return stood_down("get_obj is not the one fxguard knows")
    if not sets_attribute(f"{MANAGER}.__init__", "device_index"):
        return stood_down("CUDAGraphTreeManager keeps its device under another name")
    return callable_needed(facts)  # a thread's own tree needs its own callable


def worker_trees_needed(_facts: Any) -> tuple[Outcome, str] | None:
    body = _body(f"{TREES}.get_obj")
    if body is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    if body == ASSERTING_GET_OBJ:
        return Outcome.NOT_NEEDED, "<= 2.12: row 'CUDA-graph trees per thread' reads the stash first"
    if body != INITIALIZING_GET_OBJ:
        return stood_down("get_obj is not the one fxguard knows")
    return None


def _has_parts(where: str) -> bool:
    body = _body(where)
    return body is not None and all(part in body for part in STOCK_PARTS[where])


def sets_attribute(where: str, attr: str) -> bool:
    """Whether the function at ``where`` stores ``self.<attr>`` (a body reads it),
    read from its original code (not a row's own)."""
    fn = plain_function(where)
    return fn is not None and attr in originals.get_original(fn, "__code__").co_names


def steps_needed(_facts: Any) -> tuple[Outcome, str] | None:
    for where, stock in STOCK_BODIES.items():
        if _body(where) != stock:
            return stood_down(f"{where} is not the one fxguard knows")
    for where in STOCK_PARTS:
        if not _has_parts(where):
            return stood_down(f"{where} is not the one fxguard knows")
    return None


ROWS = (
    Wrapped(CALLABLE_ROW,
            (Swap(CUDAGRAPHIFY, PER_THREAD_CALLABLE,
                  (("per_thread", lambda: per_thread), LANE)),),
            callable_needed, option=OPTION),
    Wrapped("CUDA-graph trees per thread",
            (Swap(f"{TREES}.get_obj", GET_OBJ, (("state", tree_state_getter),),
                  params=("attr_name",)),
             Swap(f"{MANAGER}.__init__", CAPTURE_INIT, (("capture_lock", lambda: capture_locks),
                                                        MANAGER_CAPTURE), params=("device_index",)),
             Swap(f"{MANAGER}.run_eager", CAPTURE_METHOD,
                  (("capture_lock", lambda: capture_locks),), params=("self",)),
             Swap(f"{MANAGER}.record_function", CAPTURE_METHOD,
                  (("capture_lock", lambda: capture_locks),), params=("self",))),
            trees_needed, option=OPTION),
    Wrapped("CUDA-graph trees follow the backward's thread",
            (Swap(f"{TREES}.get_obj", GET_OBJ, (("state", tree_state_getter),),
                  params=("attr_name",)),),
            worker_trees_needed, option=OPTION),
    Wrapped("CUDA-graph steps per thread",
            (Swap(f"{MANAGER}.get_curr_generation", CURRENT_GENERATION, (LANE,)),
             Swap(f"{MANAGER}.user_invoked_mark_step", USER_MARKED, (LANE,)),
             Swap(f"{TREES}.mark_step_begin", MARK_STEP, (LANE,)),
             Swap(f"{TREES}.reset_cudagraph_trees", RESET, (("after_reset", after_reset_maker),)),
             Swap(f"{TREES}.TreeManagerContainer.get_tree_manager", MANAGER_MADE,
                  (("live", lambda: live_managers),)),
             Swap(f"{MANAGER}.shutdown", MANAGER_SHUT, (("live", lambda: live_managers),),
                  params=("self",)),
             Swap(TAGGING, ENTRY, (LANE, DYNAMO))),
            steps_needed, option=OPTION),
)
