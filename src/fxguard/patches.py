"""Generic patch machinery: one map of saved originals, so undo is exact.

Every change fxguard makes to another library is one ``Patch``: set attribute
``attr`` of ``owner`` to a new value, remembering what was there (or that
nothing was).  ``revert_all`` undoes them in reverse order.  Nothing here knows
about torch; the torch-specific plan lives in ``plan``.

To keep object identity (compiled functions, dynamo's tables and other modules
all hold torch's function objects), functions are never replaced: their
``__code__`` is.  ``wrapper_code`` builds such replacement code.
"""
from __future__ import annotations

import importlib
import inspect
import types
from typing import Any, NamedTuple

# "No attribute there" in a Patch; never handed out (get_original raises instead).
MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "<missing>"})()


class Patch(NamedTuple):
    label: str      # what this patch is for, as status() shows it
    owner: object   # whose attribute changes
    attr: str       # which attribute
    original: Any   # what was there (MISSING if nothing)
    value: Any      # what we put there
    version: tuple | None = None  # a function's (version, defaults, kwdefaults) before __code__ changed


_applied: list[Patch] = []


def resolve_path(path: str) -> tuple[object, str, object]:
    """'pkg.mod.Class.attr' -> (owner, 'attr', current value), importing pkg.mod."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:-1]:
            obj = getattr(obj, name)
        return obj, parts[-1], getattr(obj, parts[-1], MISSING)
    raise ImportError(f"cannot import any module prefix of {path!r}")


def apply_patch(label: str, owner: object, attr: str, value: Any) -> Patch:
    """Set (or, with value MISSING, delete) ``owner.attr``, saving what was there.
    A dict owner (a module's globals) has the item ``attr`` changed instead."""
    original = _get(owner, attr)
    version = None
    if attr == "__code__" and isinstance(owner, types.FunctionType):
        from . import _core
        version = (_core._function_version(owner), owner.__defaults__, owner.__kwdefaults__)
    _put(owner, attr, value)
    patch = Patch(label, owner, attr, original, value, version)
    _applied.append(patch)
    return patch


def revert(patch: Patch) -> None:
    if patch.original is not MISSING or patch.value is not MISSING:
        _put(patch.owner, patch.attr, patch.original)
        if patch.version is not None and patch.original is not MISSING:
            _restore_version(patch.owner, *patch.version)


def _get(owner: object, attr: str) -> Any:
    return owner.get(attr, MISSING) if isinstance(owner, dict) else getattr(owner, attr, MISSING)


def _put(owner: object, attr: str, value: Any) -> None:
    """owner.attr = value (owner[attr] for a dict); MISSING deletes."""
    if isinstance(owner, dict):
        if value is MISSING:
            del owner[attr]
        else:
            owner[attr] = value
    elif value is MISSING:
        delattr(owner, attr)
    else:
        setattr(owner, attr, value)


def undo(patch: Patch) -> None:
    """Revert one patch now and forget it (it must be the latest on its attribute)."""
    for i in range(len(_applied) - 1, -1, -1):
        if _applied[i] is patch:  # by identity: comparing owners could call anything
            del _applied[i]
            revert(patch)
            return


def _restore_version(fn: types.FunctionType, version: int, defaults: Any, kwdefaults: Any) -> None:
    """Setting __code__ clears a function's specialisation version (3.11+), for
    good on 3.13: stock call sites would stay unspecialised after uninstall.
    Give it back, only if the function is again exactly what it described."""
    if fn.__defaults__ is defaults and fn.__kwdefaults__ is kwdefaults:
        from . import _core
        _core._restore_function_version(fn, version)


def revert_all() -> None:
    while _applied:
        revert(_applied.pop())


def applied() -> tuple[Patch, ...]:
    return tuple(_applied)


def get_original(owner: object, attr: str) -> Any:
    """What ``owner.attr`` was before fxguard first changed it; its current value if
    fxguard never changed it.  AttributeError if there was no such attribute."""
    for patch in _applied:  # the first change to it holds what was there before
        if patch.owner is owner and patch.attr == attr:
            if patch.original is MISSING:
                raise AttributeError(f"{owner!r} had no attribute {attr!r} before fxguard set it")
            return patch.original
    value = _get(owner, attr)
    if value is MISSING:
        raise AttributeError(f"{owner!r} has no attribute {attr!r}")
    return value


def is_object_patched(owner: object, attr: str | None = None) -> bool:
    return any(p.owner is owner and (attr is None or p.attr == attr) for p in _applied)


# -- replacement code for functions whose identity must survive -------------

def _parameters(code: types.CodeType) -> tuple[str, str]:
    """Parameter list and matching call arguments, as source text."""
    names = code.co_varnames
    npos, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    pos, kw = names[:npos], names[npos:npos + nkw]
    i = npos + nkw
    star = starstar = None
    if code.co_flags & inspect.CO_VARARGS:
        star, i = names[i], i + 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        starstar = names[i]
    params = list(pos)
    if nposonly:
        params.insert(nposonly, "/")
    if star:
        params.append("*" + star)
    elif kw:
        params.append("*")
    params += kw
    call = list(pos) + ([f"*{star}"] if star else []) + [f"{k}={k}" for k in kw]
    if starstar:
        params.append("**" + starstar)
        call.append("**" + starstar)
    return ", ".join(params), ", ".join(call)


def wrapper_code(fn: types.FunctionType, body: str) -> types.CodeType:
    """Code for ``fn`` with the same parameters, running ``body`` instead.

    ``body`` is indented source that may use ``{call}`` (the parameters passed
    on, e.g. ``self, root, concrete_args``).  Globals it names resolve in
    ``fn.__globals__``.  The result keeps fn's file, name and first line, so
    dynamo's skip rules treat it as the original did.
    """
    original = fn.__code__
    params, call = _parameters(original)
    source = f"def {original.co_name}({params}):\n" + body.format(call=call)
    if original.co_freevars:
        # Same free variables (a method using super() has __class__), so that
        # the code fits fn's closure: define them in an enclosing function and
        # name each once in the body.
        free = original.co_freevars
        source = (f"def __fxguard_outer__():\n    {' = '.join(free)} = None\n" +
                  "\n".join("    " + line for line in source.splitlines()).replace(
                      "):\n", f"):\n        {', '.join(free)}\n", 1) +
                  f"\n    return {original.co_name}\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, original.co_filename, "exec"), namespace)
    made = namespace["__fxguard_outer__"]() if original.co_freevars else namespace[original.co_name]
    code = made.__code__
    if code.co_freevars != original.co_freevars:
        raise TypeError(f"{fn.__qualname__}: wrapper body must not change the closure "
                        f"({code.co_freevars} vs {original.co_freevars})")
    changes = dict(co_firstlineno=original.co_firstlineno)
    if hasattr(original, "co_qualname"):
        changes["co_qualname"] = original.co_qualname
    return code.replace(**changes)


def shadow_function(fn: types.FunctionType, code: types.CodeType | None = None) -> types.FunctionType:
    """A new function object running fn's (or the given) code with fn's globals and defaults."""
    shadow = types.FunctionType(code or fn.__code__, fn.__globals__, fn.__name__,
                                fn.__defaults__, fn.__closure__)
    shadow.__kwdefaults__ = fn.__kwdefaults__
    shadow.__qualname__ = fn.__qualname__
    shadow.__module__ = fn.__module__
    shadow.__doc__ = fn.__doc__
    return shadow


def rename_global(code: types.CodeType, old: str, new: str) -> types.CodeType:
    """Code whose global/attribute name ``old`` reads and writes ``new`` instead."""
    return code.replace(co_names=tuple(new if n == old else n for n in code.co_names))
