"""New code for a function that keeps its identity.

Compiled functions capture torch's functions in closures, dynamo keys its
tables on function objects, libraries import them by name: fxguard never
replaces a function, it swaps its ``__code__`` (and ``uninstall()`` swaps it
back).  ``swap_code`` is the one way it does so: the function's new code runs a
body of source text that reaches what it needs through one global injected for
that function alone, its *namespace* (``__fxguard_<qualname>__``), so two
swapped functions of one module never share or clash.

The only other globals fxguard injects into a library's modules are per module
and read on hot paths, so they stay one ``LOAD_GLOBAL`` away: ``TLS`` (the
module's per-thread globals, per_thread_globals), ``VIEW`` (what per-thread
patching reads containers through), per_thread_attrs' ``__fxguard_attrs__`` and
shared_window's ``__fxguard_windows__``.
"""
from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from .changes import Change

TLS = "__fxguard_tls__"
VIEW = "__fxguard_view__"


def namespace_name(fn: types.FunctionType) -> str:
    """The global through which fn's swapped code reaches its namespace."""
    qualname = fn.__qualname__.replace("<locals>.", "").replace(".", "_")
    return f"__fxguard_{qualname}__"


def swap_code(label: str, fn: types.FunctionType, body: str, namespace: Any,
              name: str | None = None) -> list[Change]:
    """Changes that make ``fn`` run ``body`` while it keeps its identity.

    ``body``: indented source; ``{call}`` is fn's parameters passed on
    (``self, root, concrete_args``), ``{ns}`` is ``namespace`` (a
    ``types.SimpleNamespace`` of helpers, or one callable), injected into fn's
    globals under ``namespace_name(fn)`` (or ``name``, where closures made by
    one def share a qualname and a module).
    """
    name = name or namespace_name(fn)
    return [Change(label, _globals_owner(fn), name, namespace),
            Change(label, fn, "__code__", wrapper_code(fn, body.replace("{ns}", name)))]


def _globals_owner(fn: types.FunctionType) -> object:
    """fn's module (so get_original(module, name) finds the change), or its
    globals dict where no module holds them."""
    module = sys.modules.get(fn.__module__)
    return module if getattr(module, "__dict__", None) is fn.__globals__ else fn.__globals__


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
    """Code for ``fn`` with the same parameters, running ``body`` instead
    (``{call}``: the parameters passed on).  Globals it names resolve in
    ``fn.__globals__``.  It keeps fn's file, name, qualname and first line, so
    dynamo's skip rules treat it as the original did."""
    original = fn.__code__
    params, call = _parameters(original)
    source = f"def {original.co_name}({params}):\n" + body.replace("{call}", call)
    if original.co_freevars:
        # Same free variables (a method using super() has __class__), so that
        # the code fits fn's closure: define them in an enclosing function and
        # name each once, after the body: where every path of the body returns
        # or raises that line is dead code, so no line of the wrapper runs
        # before the body's own first line (whose try: covers the rest).
        free = original.co_freevars
        source = (f"def __fxguard_outer__():\n    {' = '.join(free)} = None\n" +
                  "\n".join("    " + line for line in source.splitlines()) +
                  f"\n        {', '.join(free)}\n    return {original.co_name}\n")
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
