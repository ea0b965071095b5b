"""A compile leaves the random numbers other threads drew.

Stock: dynamo's ``preserve_global_state`` saves the CPU and CUDA generator
states when a compile starts and sets them back when it ends (so do AOT
autograd's and inductor's ``preserve_rng_state`` windows).  A thread that drew random numbers meanwhile (a warm
drafter stepping while another compiles) draws the same numbers again
afterwards: repeated dropout masks, noise and sampled positions.

With the row, a compile's draws never touch the default generators, so their
restores have nothing to undo and are skipped, always: no guess about other
threads (whether they ran, how many there are, whether ``/proc`` can be read)
enters the decision.

- ``torch.random.set_rng_state`` and ``torch.cuda.set_rng_state`` (their code
  swapped, identity kept) skip the calls those restore sites make.  Every
  other caller, the user's own included, is served as stock.
- The compile-time places that draw real numbers inside those windows
  (``DRAW_SITES``: autotuning's example inputs and ``input_gen_fns``, pad_mm's
  benchmark inputs, AOT inductor's weights magic number, ...) run with a torch
  function mode of the compiling thread (torch keeps that stack per thread)
  that passes ``generator=`` to random torch functions called without one: a
  private generator per device, cloned from the default generator when the
  thread's window first draws.  The windows' saves and restores apply to it
  (each restore sets it back to what it was at the matching save; the
  outermost drops it), so one thread's compile draws exactly stock's numbers,
  and its default generators end the compile exactly where stock's restore
  leaves them.
- dynamo's ``checkpoint_params`` (the debugging config ``verify_correctness``,
  whose check runs the user's graph eagerly and compiled) saves and restores
  as stock: one thread gives stock's numbers there, and other threads' draws
  during that check are set back, as stock does.
- What it does not cover: a draw inside a window at a place not listed (a
  user's own backend that draws, a CUDA pattern's example input at the first compile, runtime windows such as
  a non-tree CUDA graph's warm-up in ``cudagraphify``) stays drawn where stock
  would set it back.  ``rng_sites`` classifies every draw call in torch's
  compiler source; a test fails on a call nobody classified, and ``needed``
  stands down (NOT_COVERED, a WARNING) where a listed draw site is missing or
  changed, read from torch's source without importing it.

Tested (tests/races/test_rng_not_rewound.py, tests/torch_support/
test_rng_one_working_thread.py and test_rng_sites.py,
tests/differential/test_rng_busy_helper.py): a thread that draws while
another thread's compile (or a preserve_rng_state window) is held never draws
those numbers again, 100 trials each for a drawer that sleeps, keeps
computing across the restore, or was started with ``_thread`` (stock repeats
them: strict xfail); one thread's covered draws are stock's numbers and the
default generator ends where stock's does, beside idle or computing threads;
seeded max-autotune programs give stock's outputs and next draws, cold and
warm cache, beside a computing thread; a profiled compile (max-autotune,
inductor training, aot_eager) moves the default generator at no draw call.
Nothing reads other threads' state (``/proc``, ``threading.enumerate``), so
hidden ``/proc`` or unlisted threads change nothing.  Each window entry holds
its saving frame until the matching restore pops it.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Any, Callable

from ..machinery.changes import Outcome
from ..machinery.wrapped import Swap, Wrapped
from . import rng_sites
from .options import Option
from .shared_bodies import DYNAMO

CONVERT_FRAME = "torch._dynamo.convert_frame"
SAVER = f"{CONVERT_FRAME}.preserve_global_state"
# Where a compile saves and restores the generators: around the whole compile
# (the contract the row needs), and inside it (AOT autograd's and inductor's
# preserve_rng_state) where this torch has them.  Not dynamo's checkpoint_params
# (verify_correctness): its check runs the user's graph, whose draws no site covers.
SITES = (SAVER, "torch._dynamo.utils.preserve_rng_state")

Key = tuple[str, str, int]  # (file, name, first line) of a code object


def _codes(fn: object) -> list[types.CodeType]:
    """fn's code and every code nested in it (a contextmanager: its generator's)."""
    fn = getattr(fn, "__wrapped__", fn)
    if not isinstance(fn, types.FunctionType):
        return []
    found, stack = [], [fn.__code__]
    while stack:
        code = stack.pop()
        found.append(code)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def _key(code: types.CodeType) -> Key:
    return code.co_filename, code.co_name, code.co_firstlineno


def _resolve(path: str) -> object:
    import importlib
    module, _, name = path.rpartition(".")
    return vars(importlib.import_module(module)).get(name)


def _sites() -> tuple[frozenset[Key], frozenset[Key]]:
    """(codes that save the generator states, codes that set them back) in SITES."""
    codes = [code for path in SITES for code in _codes(_resolve(path))]
    return (frozenset(_key(c) for c in codes if "get_rng_state" in c.co_names),
            frozenset(_key(c) for c in codes if "set_rng_state" in c.co_names))


def restorer_keys() -> frozenset[Key] | None:
    """The codes in preserve_global_state that save and set back the generator
    states; None where it has none (another contract)."""
    return frozenset(_key(c) for c in _codes(_resolve(SAVER))
                     if {"get_rng_state", "set_rng_state"} <= set(c.co_names)) or None


def needed(_facts: Any) -> tuple[Outcome, str] | None:
    if restorer_keys() is None:
        return (Outcome.NOT_COVERED,
                f"{SAVER} no longer sets the generator states back as fxguard knows; "
                "a compile there may rewind other threads' random numbers (stock)")
    broken = rng_sites.broken_draw_sites()
    if broken:
        return (Outcome.NOT_COVERED,
                "compile-time draw sites missing or changed on this torch: " + "; ".join(broken)
                + ". fxguard cannot keep a compile's draws off the default generators there, "
                "so it restores as stock (other threads' draws during a compile may repeat)")
    return None


class Windows:
    """One generator kind's ("cpu", "cuda") compile windows in each thread, and
    the thread's private generators for them.

    A save (get_rng_state from a save site) pushes the saving frame with the
    private generators' states; the restore from the same frame (set_rng_state
    from a restore site) is skipped, pops back to that entry and sets the
    private generators back to those states (dropping those made since), as
    stock's restore would set the default.  A restore no save of its frame
    matches is skipped and changes nothing."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._local = threading.local()
        self._saves, self._restores = _sites()

    def _thread(self) -> Any:
        local = self._local
        if not hasattr(local, "stack"):
            local.stack, local.private = [], {}
        return local

    @staticmethod
    def _caller() -> types.FrameType | None:
        try:
            return sys._getframe(3)  # 0 this, 1 saving/skip, 2 the swapped body
        except ValueError:  # no Python caller (a thread's target, atexit): not a site
            return None

    def saving(self) -> None:
        """In get_rng_state: a compile's window opens."""
        frame = self._caller()
        if frame is not None and _key(frame.f_code) in self._saves:
            local = self._thread()
            del local.stack[:-63]  # bound: saves whose restore never came
            local.stack.append((frame, {i: g.get_state() for i, g in local.private.items()}))

    def skip(self) -> bool:
        """In set_rng_state: whether this call is a compile's restore (skipped)."""
        frame = self._caller()
        if frame is None or _key(frame.f_code) not in self._restores:
            return False
        local = self._thread()
        at = next((i for i in range(len(local.stack) - 1, -1, -1)
                   if local.stack[i][0] is frame), None)
        if at is not None:
            states = local.stack[at][1]
            del local.stack[at:]
            for index in list(local.private):
                if index in states:
                    local.private[index].set_state(states[index])
                else:
                    del local.private[index]
        return True

    def private(self, index: int) -> Any:
        """This thread's private generator for device ``index``; None outside
        its compile windows (a draw there is stock's)."""
        local = self._thread()
        if not local.stack:
            return None
        generator = local.private.get(index)
        if generator is None:
            import torch
            default = torch.random.default_generator if self.kind == "cpu" \
                else torch.cuda.default_generators[index]
            generator = local.private[index] = default.clone_state()
        return generator


_windows: dict[str, Windows] = {}


def _windows_of(kind: str) -> Windows:
    return _windows.setdefault(kind, Windows(kind))


def helpers(generator: str) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """The swapped get/set bodies' helpers for one generator ("cpu", "cuda")."""
    return (("saving", lambda: _windows_of(generator).saving),
            ("skip", lambda: _windows_of(generator).skip))


# A compile's get_rng_state opens a window; its set_rng_state is skipped.
SAVE_RNG = """\
    if not {ns}.is_dynamo_compiling():
        {ns}.saving()
    return {ns}.inner({call})
"""
RESTORE_RNG = """\
    if not {ns}.is_dynamo_compiling() and {ns}.skip():
        return None
    return {ns}.inner({call})
"""


# -- the compile's own draws: a private generator ------------------------------------

# Random torch functions that take generator= (by name: torch.<name> or Tensor.<name>).
FACTORIES = ("rand", "randn", "randint", "randperm")
LIKE = ("rand_like", "randn_like", "randint_like")
FROM_TENSOR = ("normal", "bernoulli", "multinomial", "poisson")
IN_PLACE = ("normal_", "uniform_", "random_", "bernoulli_", "exponential_", "cauchy_",
            "log_normal_", "geometric_")


def _takes_generator(like: Any) -> bool:
    """Whether this torch's ``torch.*_like`` takes generator= (2.11 has none)."""
    import torch
    args = (torch.empty(1), 2) if like is torch.randint_like else (torch.empty(1),)
    try:
        like(*args, generator=torch.Generator())
    except TypeError:
        return False
    return True


def _draw_functions() -> dict[object, str]:
    """{torch function: how its device is found}, for the functions this torch has."""
    import torch
    found: dict[object, str] = {}
    for name in FACTORIES:
        found[getattr(torch, name)] = "factory"
    for name in LIKE + FROM_TENSOR:
        fn = getattr(torch, name, None)
        if fn is not None and (name not in LIKE or _takes_generator(fn)):
            found[fn] = "tensor"
    for name in FROM_TENSOR + IN_PLACE:
        method = getattr(torch.Tensor, name, None)
        if method is not None:
            found[method] = "tensor"
    return found


class PrivateDraws:
    """A torch function mode (made on first use: torch imported) that gives
    random torch functions called without ``generator=`` the thread's private
    generator for the tensor's device, inside compile windows."""

    _mode_class: type | None = None
    _functions: dict[object, str] = {}

    @classmethod
    def make(cls) -> Any:
        if cls._mode_class is None:
            cls._functions = _draw_functions()
            cls._mode_class = _mode_class(cls._functions)
        return cls._mode_class()


def _device_of(how: str, args: tuple, kwargs: dict) -> Any:
    import torch
    if how == "factory":
        device = kwargs.get("device")
        return torch.device(device) if device is not None else torch.get_default_device()
    first = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(first, torch.Tensor):
        return first.device
    return _device_of("factory", args, kwargs)  # torch.normal(mean, std, size): a factory


def _private_for(device: Any) -> Any:
    import torch
    if device is None or device.type not in ("cpu", "cuda"):
        return None
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return None  # fake tensors draw nothing
    windows = _windows.get(device.type)
    if windows is None:
        return None
    index = 0 if device.type == "cpu" else (
        device.index if device.index is not None else torch.cuda.current_device())
    return windows.private(index)


def _mode_class(functions: dict[object, str]) -> type:
    global _OVERRIDES
    import torch.overrides
    from torch.overrides import TorchFunctionMode
    _OVERRIDES = torch.overrides.__file__

    class _PrivateDrawsMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            how = functions.get(func)
            if how is not None and kwargs.get("generator") is None:
                generator = _private_for(_device_of(how, args, kwargs))
                if generator is not None:
                    kwargs = {**kwargs, "generator": generator}
            return _as_caller(sys._getframe(1), func)(func, args, kwargs)

    return _PrivateDrawsMode


def _forward(func, args, kwargs): return func(*args, **kwargs)  # noqa: E704 - one line


_forwarders: dict[tuple[types.CodeType, int], types.FunctionType] = {}
_OVERRIDES = ""  # torch/overrides.py, once the mode is made




def _as_caller(above: types.FrameType, func: Any) -> types.FunctionType:
    """``_forward`` in a code that reads as the line that called ``func``, so
    that what ``func`` warns with a stacklevel names that line as stock does
    (the mode's own frame would stand between them)."""
    while above is not None and above.f_code.co_filename == _OVERRIDES:
        above = above.f_back  # handle_torch_function
    if above is not None and above.f_code is getattr(func, "__code__", None):
        above = above.f_back  # func is Python: its first frame called handle_torch_function
    if above is None:
        return _forward
    key = (above.f_code, above.f_lineno)
    forward = _forwarders.get(key)
    if forward is None:
        if len(_forwarders) > 4096:
            _forwarders.clear()
        code = _forward.__code__.replace(co_filename=above.f_code.co_filename,
                                         co_name=above.f_code.co_name,
                                         co_firstlineno=above.f_lineno)
        forward = _forwarders[key] = types.FunctionType(code, above.f_globals)
    return forward


# A compile-time draw site runs with the private-draws mode pushed (this thread only).
PRIVATE_DRAWS = """\
    with {ns}.private_draws():
        return {ns}.inner({call})
"""


def _draw_swap(where: str) -> Swap:
    return Swap(where, PRIVATE_DRAWS, (("private_draws", lambda: PrivateDraws.make),))


def _draw_rows() -> tuple[Wrapped, ...]:
    """A row per module of DRAW_SITES (each applied when its module is imported)."""
    by_module: dict[str, list[str]] = {}
    for site in rng_sites.DRAW_SITES:
        module = site.where.split(".")[-3 if site.where.split(".")[-2][0].isupper() else -2]
        by_module.setdefault(module, []).append(site.where)
    return tuple(Wrapped(f"compile's draws private ({module})",
                         tuple(_draw_swap(where) for where in wheres),
                         _draws_needed, option=Option.RNG_NOT_REWOUND)
                 for module, wheres in by_module.items())


def _draws_needed(facts: Any) -> tuple[Outcome, str] | None:
    return needed(facts)


ROWS = (
    Wrapped("compile keeps others' random numbers",
            tuple(Swap(f"{module}.{verb}_rng_state", body, (DYNAMO,) + helpers(generator))
                  for module, generator in (("torch.random", "cpu"), ("torch.cuda.random", "cuda"))
                  for verb, body in (("set", RESTORE_RNG), ("get", SAVE_RNG))),
            needed, option=Option.RNG_NOT_REWOUND),
) + _draw_rows()
