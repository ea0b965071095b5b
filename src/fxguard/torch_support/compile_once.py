"""Compile once: threads that reach the same graph share one compile.

Stock dynamo: the C eval-frame hook looks a frame's code object up in its
cache; on a miss it calls the Python callback (``CatchErrorsWrapper.__call__``),
which waits for ``compile_lock`` and compiles.  Nothing looks at the cache
again once the lock is held, so threads that missed together compile the same
graph one after another, and every copy is a cache entry counted against
``recompile_limit``.

``changes(state)`` wraps that callback and ``compute_cache_size``:

1. the callback passes the machinery's compile gate (``state.gate``): the first
   thread to miss for a code object (told apart by identity) holds a ticket
   and compiles as stock; a thread that misses while that compile is in flight
   waits (GIL released) for that very compile;
2. the waiter may run that compile if it has the same backend, torch has not
   retired it (``reset``, ``reset_code_caches``, ``remove_from_cache``, an
   object its guards match by id dying) and its guards pass for this frame;
   otherwise it passes the gate again and compiles itself;
3. to run it, the callback answers with that compile's code and a *stand-in*
   guard manager whose guards never pass.  C makes the stand-in a cache entry
   and runs the compiled code for this call (a strategy without code would run
   the frame eager); later calls hit the real entry, so the stand-in is never
   run again.  The wrapped ``compute_cache_size`` leaves stand-ins out, so
   they cost no recompile budget; there is one per waiter that ran a shared
   compile;
4. compiles torch changes after compiling them (CUDA graphs: ``mode="reduce-overhead"``)
   are shared only where fxguard's row hands each thread its own CUDA-graph
   callable (cudagraphs.py); elsewhere the callback runs as stock for them
   (``_changed_after_compile``);
5. nothing is kept once the waiters have the result: a later miss that waited
   for nothing compiles, as stock does.  A compile that raises (Ctrl-C too) or
   gives no code hands nothing on, and its waiters compile themselves.

Nested callbacks (a compile that runs another compiled function) and threads
holding ``compile_lock`` take the stock path: waiting there could deadlock.
Nothing here knows the rest of fxguard; ``changes`` only builds the changes
(install() applies them: the "compile once" row, option ``compile_once``).

Per torch (found at install, each a layout the tests ran on): the callback
returns a ConvertFrameReturn (``wrap_guarded_code``) or, on 2.5, a GuardedCode
whose guards are ``check_fn``; ``compute_cache_size`` takes a list of entries
(2.13+) or the head of a linked list.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import types
from typing import Any, Callable

from . import cudagraphs
from ..machinery.changes import Change, Context, Outcome, Planned, RowKind
from ..machinery.compile_gate import CompileGate
from .options import Option

LABEL = "compile once"
_MISSING = object()


class NotAvailable(RuntimeError):
    """This torch (or Python) lacks what the mechanism needs; nothing was changed."""

    def __init__(self, why: str, where: str = "on this torch") -> None:
        super().__init__(why)
        self.where = where


class ContractChanged(NotAvailable):
    """This torch has what the mechanism wraps, with another contract (a release
    fxguard has not seen): the row stands down with a WARNING; nothing was changed."""


# The callback and compute_cache_size as fxguard wraps them: their parameters
# (compute_cache_size's first; the rest are passed on as they come).
CALLBACK_PARAMETERS = ("self", "frame", "cache_entry", "frame_state")
CACHE_SIZE_PARAMETERS = ("frame",)  # then the entries: named cache_entry or cache_entries


class CompileOnce:
    """State of one install: the gate (one compile per code object at a time,
    its result handed to the threads that waited for it) and counters."""

    def __init__(self) -> None:
        self.gate = CompileGate()
        self._lock = threading.Lock()
        self.compiles_avoided = 0  # waiters that ran another thread's compile

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {"compiles_avoided": self.compiles_avoided, "waits": self.gate.waits}

    def avoided(self) -> None:
        """A waiter ran another thread's compile."""
        with self._lock:
            self.compiles_avoided += 1


@dataclasses.dataclass
class _Torch:
    """The pieces of this torch the mechanism uses, found once at install()."""
    convert_frame: types.ModuleType
    callback_cls: type
    callback_call: Callable
    compute_cache_size: Callable
    backend_attr: str
    guard_attr: str                      # GuardedCode's / CacheEntry's guard field
    guarded_code: type
    wrap: Callable[[Any], Any]           # GuardedCode -> what the callback returns
    unwrap: Callable[[Any], Any]         # callback result -> GuardedCode | None
    all_entries: Callable[[types.CodeType], list]
    standin_cls: type


@dataclasses.dataclass(frozen=True)
class CompileOnceRow(RowKind):
    """The row: it provides its state (counters) to later rows where patched."""
    where: str
    option: Any = None
    what = LABEL
    provides = ("compile_once",)

    @staticmethod
    def needed(facts: Any) -> tuple[Outcome, str] | None:
        if facts.gil_enabled:
            return None
        # Seen on 3.13t with torch 2.12: the process aborted while a compile
        # walked the code's cache entries (compute_cache_size) and threads that
        # had shared a compile ran it; dynamo's C cache takes no lock of its own.
        return Outcome.NOT_AVAILABLE, ("on this Python (the GIL off: dynamo's cache entries are "
                                       "not safe to read while other threads run the same code)")

    def plan(self, ctx: Context) -> Planned:
        state = CompileOnce()
        try:
            made = changes(state)
        except ContractChanged as e:  # a release fxguard has not seen: stock there
            return Planned(outcome=Outcome.NOT_COVERED, detail=f"{e}; dynamo's callback runs as stock")
        except NotAvailable as e:
            return Planned(outcome=Outcome.NOT_AVAILABLE, detail=f"{e.where} ({e})")
        return Planned(made, provides={"compile_once": state})


def changes(state: CompileOnce) -> list[Change]:
    """The changes that put the mechanism in.  Raises NotAvailable, changing
    nothing, where it is not available (``find``)."""
    t = find()
    call = _make_callback(state, t)
    ccs = _make_compute_cache_size(t)
    return [Change(LABEL, t.callback_cls, "__call__", call),
            Change(LABEL, t.convert_frame, "compute_cache_size", ccs)]


def find() -> _Torch:
    """What the mechanism needs; NotAvailable on a torch without a layout it knows
    (each piece below names the torch generations it tells apart)."""
    try:
        from torch._dynamo import convert_frame, eval_frame, guards
        from torch._dynamo import types as dtypes
    except ImportError as e:  # pragma: no cover - every claimed torch has these
        raise NotAvailable(f"torch._dynamo layout: {e}") from None
    need = ("CatchErrorsWrapper", "compile_lock", "compute_cache_size", "output_codes")
    missing = [n for n in need if not hasattr(convert_frame, n)]
    if missing:
        raise NotAvailable(f"torch._dynamo.convert_frame has no {', '.join(missing)}")
    cls, call, backend_attr = _callback(convert_frame)
    guarded_code, guard_attr, wrap, unwrap = _guarded_code(dtypes, guards)
    if not hasattr(eval_frame, "_debug_get_cache_entry_list"):
        raise NotAvailable("no way to list a code object's cache entries")
    standin = _standin(guards)
    if not hasattr(convert_frame.compile_lock, "_is_owned"):
        raise NotAvailable("compile_lock cannot tell whether this thread holds it")
    return _Torch(convert_frame, cls, call, convert_frame.compute_cache_size, backend_attr,
                  guard_attr, guarded_code, wrap, unwrap, eval_frame._debug_get_cache_entry_list,
                  standin)


def _callback(convert_frame: types.ModuleType) -> tuple[type, Callable, str]:
    """Dynamo's cache-miss callback: its class, its __call__, where it keeps the
    compiler it wraps (2.5-2.6: _torchdynamo_orig_callable; later: ..._backend)."""
    cls = convert_frame.CatchErrorsWrapper
    call = cls.__dict__.get("__call__")
    if not isinstance(call, types.FunctionType):
        raise NotAvailable("CatchErrorsWrapper.__call__ is not a plain function")
    if getattr(call, "_fxguard_compile_once", False):
        raise RuntimeError("compile_once is installed already: revert its changes first")
    _check_parameters(call, CALLBACK_PARAMETERS, exact=True)
    _check_parameters(convert_frame.compute_cache_size, CACHE_SIZE_PARAMETERS, exact=False)
    init_names = cls.__init__.__code__.co_names
    backend_attr = next((a for a in ("_torchdynamo_orig_backend", "_torchdynamo_orig_callable")
                         if a in init_names), None)
    if backend_attr is None:
        raise NotAvailable("CatchErrorsWrapper keeps its callback under an unknown name")
    return cls, call, backend_attr


def _guarded_code(dtypes: types.ModuleType, guards: types.ModuleType) -> tuple:
    """GuardedCode, its guard field (guard_manager, or check_fn on 2.5), and how
    the callback returns one (wrap_guarded_code's ConvertFrameReturn, or itself)."""
    guarded_code = getattr(dtypes, "GuardedCode", None) or getattr(guards, "GuardedCode", None)
    if guarded_code is None or not dataclasses.is_dataclass(guarded_code):
        raise NotAvailable("no GuardedCode dataclass")
    fields = {f.name for f in dataclasses.fields(guarded_code)}
    guard_attr = next((a for a in ("guard_manager", "check_fn") if a in fields), None)
    if guard_attr is None or "code" not in fields:
        raise NotAvailable(f"GuardedCode has fields {sorted(fields)}")
    wrap_fn = getattr(dtypes, "wrap_guarded_code", None)
    if wrap_fn is not None:
        return guarded_code, guard_attr, wrap_fn, lambda r: getattr(r, "guarded_code", None)
    # the callback returns a GuardedCode or None
    return (guarded_code, guard_attr, lambda g: g,
            lambda r: r if isinstance(r, guarded_code) else None)


def _standin(guards: types.ModuleType) -> type:
    """The stand-in guard manager's class, built on the wrapper class this torch
    has (DeletedGuardManagerWrapper; GuardManagerWrapper; 2.5: GuardManager)."""
    deleted = getattr(guards, "DeletedGuardManagerWrapper", None)
    base = deleted or next((c for c in (getattr(guards, n, None) for n in (
        "GuardManagerWrapper", "GuardManager")) if isinstance(c, type)
        and c.__module__ == guards.__name__), None)
    if base is None:
        raise NotAvailable("no guard manager wrapper class to build a stand-in from")
    return _standin_class(base, deleted)


def _check_parameters(fn: Callable, expected: tuple[str, ...], *, exact: bool) -> None:
    """ContractChanged unless fn's parameters are ``expected`` (or start with them)."""
    import inspect
    try:
        names = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = ()
    if names != expected if exact else names[:len(expected)] != expected:
        raise ContractChanged(f"{getattr(fn, '__qualname__', fn)} takes ({', '.join(names)}), "
                              f"fxguard knows ({', '.join(expected)}{'' if exact else ', ...'})")


def _never(_: object) -> bool:
    return False


def _standin_class(base: type, deleted: type | None) -> type:
    class SharedCompileStandIn(base):  # type: ignore[misc, valid-type]
        """Guard manager of the cache entry C makes for a thread that ran another
        thread's compile: its guards never pass, so C runs it only for the call
        that made it; compute_cache_size leaves it out."""

        def __init__(self, reason: str) -> None:
            if deleted is not None:
                super().__init__(reason)
            else:  # torch without DeletedGuardManagerWrapper: what reason-finding reads
                super().__init__()
                self.invalidation_reason = reason
                self.global_scope = {"G": {}}
                self.closure_vars = {"___check_tensors_verbose": None}
                self.verbose_code_parts = [repr(reason)]  # eval'd where guards are Python
            self.id_matched_objs = {}
            try:
                self.root.add_lambda_guard(_never, [reason], None)
            except TypeError:  # torch without the user-stack argument
                self.root.add_lambda_guard(_never, [reason])

        def check(self, x: Any) -> bool:
            return False

    SharedCompileStandIn._fxguard_compile_once_stand_in = True
    return SharedCompileStandIn


def is_stand_in(entry: Any) -> bool:
    """A cache entry (or guard manager) the mechanism made for a thread that ran
    another thread's compile: it never matches and counts against no limit."""
    guard = getattr(entry, "guard_manager", None) or getattr(entry, "check_fn", None) or entry
    return getattr(type(guard), "_fxguard_compile_once_stand_in", False)


def _guard_of(obj: Any, t: _Torch) -> Any:
    return getattr(obj, t.guard_attr, None)


def _passes(guard: Any, f_locals: dict) -> bool:
    """The frame's locals pass these guards (what C's lookup asks, from Python)."""
    try:
        check = getattr(guard, "check", None)
        return bool(check(f_locals) if check is not None else guard(f_locals))
    except Exception:  # a guard that cannot be evaluated here: compile, as stock would
        return False


def _same_backend(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _backend_of(callback: Any, attr: str) -> Any:
    """What C's get_backend() finds: the end of the callback chain."""
    while True:
        inner = getattr(callback, attr, _MISSING)
        if inner is _MISSING:
            return callback
        callback = inner


def _usable(ticket: Any, t: _Torch, frame: Any, backend: Any) -> tuple[Any, Any, Any] | None:
    """(code, compile_id, trace_annotation) of the compile a thread waited for,
    if it may run it: same backend, not retired by torch, its guards pass."""
    if ticket.result is None:
        return None
    made_by, g = ticket.result
    if not _same_backend(made_by, backend) or not _live(g, t, ticket):
        return None
    if not _passes(_guard_of(g, t), frame.f_locals):
        return None
    return g.code, getattr(g, "compile_id", None), getattr(g, "trace_annotation", "Unknown")


def _live(g: Any, t: _Torch, ticket: Any) -> bool:
    """torch has not retired this compile: reset() forgets its code
    (output_codes); reset_code_caches(), remove_from_cache() and the death of
    an object its guards match by id take its entry out of C's cache.  C puts
    the entry in its cache when the owner's callback returns, so an entry
    missing from the cache is live only while that callback still runs (a
    retired entry's ``cache_entry`` reads None too: it cannot tell)."""
    if g.code not in t.convert_frame.output_codes:
        return False
    guard = _guard_of(g, t)
    if any(_guard_of(e, t) is guard for e in t.all_entries(ticket.code)):
        return True
    return ticket.running()


# Backends that graph outside inductor: dynamo's ``backend="cudagraphs"`` keeps
# one callable cache per compile, bound to the first caller's tree (no row of
# fxguard makes it per thread).
GRAPHING_BACKENDS = frozenset({"torch._dynamo.backends.cudagraphs"})


def _changed_after_compile(backend: Any) -> bool:
    """Compiles torch changes after compiling them, for whoever runs them:
    CUDA graphs wrap the compiled graph in ``CompiledFxGraph.current_callable``,
    one attribute for every thread that runs that compile (pytorch#186192, in
    every torch up to 2.15).  Unless the row "CUDA-graph callable per thread"
    makes that attribute hand each thread its own graphs, such compiles are not
    shared: each thread compiles its own, as stock."""
    compiler = getattr(backend, "compiler_fn", backend)  # torch.compile's wrapper of a named backend
    if getattr(compiler, "__module__", None) in GRAPHING_BACKENDS:
        return True
    if cudagraphs.callable_per_thread_in_place():
        return False
    config = getattr(backend, "config", None)
    if isinstance(config, dict) and config.get("triton.cudagraphs"):
        return True  # mode="reduce-overhead", or options={"triton.cudagraphs": True}
    inductor = sys.modules.get("torch._inductor.config")
    return bool(getattr(getattr(inductor, "triton", None), "cudagraphs", False))


def _reuse(t: _Torch, found: tuple[Any, Any, Any]) -> Any:
    """What the callback returns to run another thread's compile: its code under
    a stand-in guard manager."""
    code, compile_id, annotation = found
    standin = t.standin_cls(f"fxguard compile once: ran compile {compile_id} of another "
                            "thread (never matches)")
    kwargs = {"code": code, t.guard_attr: standin}
    names = {f.name for f in dataclasses.fields(t.guarded_code)}
    if "compile_id" in names:
        kwargs["compile_id"] = compile_id
    if "trace_annotation" in names and annotation is not None:
        kwargs["trace_annotation"] = annotation
    result = t.wrap(t.guarded_code(**kwargs))
    if dataclasses.is_dataclass(result) and any(
            f.name == "apply_to_code" for f in dataclasses.fields(result)):
        # Run this call only: the code object's strategy (a skip or run-only another
        # thread's compile just set) stays as torch left it.
        result = dataclasses.replace(result, apply_to_code=False)
    return result


def _make_callback(state: CompileOnce, t: _Torch) -> Callable:
    original = t.callback_call
    gate, convert_frame = state.gate, t.convert_frame

    def __call__(self: Any, frame: Any, cache_entry: Any, frame_state: Any) -> Any:
        owned = getattr(convert_frame.compile_lock, "_is_owned", None)  # read as torch does
        if _inside_callback() or (owned is not None and owned()):
            return original(self, frame, cache_entry, frame_state)  # inside a compile: stock
        code = frame.f_code
        backend = _backend_of(self, t.backend_attr)
        if _changed_after_compile(backend):
            return original(self, frame, cache_entry, frame_state)  # not shared: stock
        result = None
        try:  # the ticket is this frame's: an interrupt anywhere here cannot leak it
            while True:
                ticket = gate.begin(code)
                if not ticket.done:
                    break  # this thread compiles
                found = _usable(ticket, t, frame, backend)
                if found is not None:
                    state.avoided()
                    return _reuse(t, found)
            result = original(self, frame, cache_entry, frame_state)
            return result
        finally:
            gate.end(code, _shareable(result, backend, t))

    def _inside_callback() -> bool:
        """A compile of this thread runs below (its callback is on the stack):
        a compiled function called while tracing.  Read from the stack, so no
        flag can be left set."""
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code is __call__.__code__:
                return True
            frame = frame.f_back
        return False

    __call__.__qualname__ = f"{t.callback_cls.__qualname__}.__call__"
    __call__.__doc__ = original.__doc__
    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    __call__._fxguard_compile_once = True  # type: ignore[attr-defined]
    return __call__


def _shareable(result: Any, backend: Any, t: _Torch) -> tuple[Any, Any] | None:
    """What the compile hands its waiters: (backend, GuardedCode), or None."""
    g = t.unwrap(result)
    return (backend, g) if g is not None and not is_stand_in(_guard_of(g, t)) else None


def _make_compute_cache_size(t: _Torch) -> Callable:
    """compute_cache_size without stand-ins: they cost no recompile budget."""
    original = t.compute_cache_size

    def compute_cache_size(frame: Any, cache_entries: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cache_entries, list):  # torch >= 2.13: (frame, entries, total)
            kept = [e for e in cache_entries if not is_stand_in(e)]
            if len(kept) == len(cache_entries):
                return original(frame, cache_entries, *args, **kwargs)
            gone = sum(map(is_stand_in, t.all_entries(frame.f_code)))
            if args:
                args = (max(0, args[0] - gone),) + args[1:]
            elif "total_cache_entries_all_regions" in kwargs:
                kwargs["total_cache_entries_all_regions"] = max(
                    0, kwargs["total_cache_entries_all_regions"] - gone)
            return original(frame, kept, *args, **kwargs)
        size = original(frame, cache_entries, *args, **kwargs)  # a linked list from its head
        gone = 0
        entry = cache_entries
        while entry is not None:
            gone += is_stand_in(entry)
            entry = entry.next() if callable(getattr(entry, "next", None)) else getattr(
                entry, "next", None)
        if not gone:
            return size
        return dataclasses.replace(
            size, num_cache_entries=size.num_cache_entries - gone,
            num_cache_entries_with_same_id_matched_objs=(
                size.num_cache_entries_with_same_id_matched_objs - gone))

    compute_cache_size.__doc__ = original.__doc__
    compute_cache_size.__wrapped__ = original  # type: ignore[attr-defined]
    return compute_cache_size


# Dynamo's callback for a cache miss (and compute_cache_size): a thread that
# missed while another compiled the same code runs that compile if its guards pass.
ROWS = (CompileOnceRow("torch._dynamo.convert_frame.CatchErrorsWrapper.__call__",
                       option=Option.COMPILE_ONCE),)
