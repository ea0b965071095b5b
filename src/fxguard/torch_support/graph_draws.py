"""Whether a graph inductor made may draw random numbers, read from its output code.

Torch itself says which ops draw: every aten op that takes numbers from a
generator carries ``torch.Tag.nondeterministic_seeded`` (poisson, gamma,
binomial, dirichlet, randint, dropout, the fused attentions with a dropout
argument...).  A graph draws nothing only where every call in inductor's
``call`` (or a graph partition's function) is known not to draw: an op whose
tags torch gives without that tag, an inductor kernel (its random numbers come
from seeds an extern ``aten.randint`` call makes, itself tagged), or one of the
wrapper's own helpers below.  Anything else, including code fxguard cannot
read, draws.  A custom op that draws carries the tag, as aten's do.
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
from typing import Any

OUTPUT_CODE = re.compile(r"call|partition_\d+")  # a graph partition's own function (2.9+)

# Inductor's wrapper code around kernels and ops: allocation, views, checks, streams.
HELPERS = frozenset({
    "empty_strided", "empty_strided_cpu", "empty_strided_cuda", "empty_strided_xpu",
    "empty_strided_cpu_pinned", "empty_strided_mtia", "reinterpret_tensor",
    "assert_size_stride", "assert_alignment", "check_alignment", "get_raw_stream",
    "torch.cuda._DeviceGuard", "torch.cuda.set_device", "torch.cuda.current_stream",
    "args.clear", "len", "int", "float", "bool", "range", "tuple", "list", "dict",
    "isinstance", "max", "min", "str", "print", "next", "iter", "zip",
    "torch._C._dynamo.guards.assert_size_stride",
    "torch._C._dynamo.guards._empty_strided_cpu", "torch._C._dynamo.guards._empty_strided_cuda",
})
KERNEL = re.compile(r"(triton|cpp|kernel|mps)_\w*")   # inductor's generated kernels


def output_code(fn: Any, seen: set[int] | None = None) -> types.FunctionType | None:
    """Inductor's ``call`` (or partition) function in ``fn`` or what it wraps,
    following closures, ``__wrapped__``, ``func`` and ``current_callable``."""
    seen = set() if seen is None else seen
    if id(fn) in seen or len(seen) > 64:
        return None
    seen.add(id(fn))
    fn = getattr(fn, "__func__", fn)
    inner: list[Any] = []
    if isinstance(fn, types.FunctionType):
        if OUTPUT_CODE.fullmatch(fn.__name__) and fn.__code__.co_filename.endswith(".py"):
            return fn
        inner = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
    inner += [getattr(fn, a) for a in ("__wrapped__", "func", "current_callable") if hasattr(fn, a)]
    for candidate in inner:
        if callable(candidate):
            found = output_code(candidate, seen)
            if found is not None:
                return found
    return None


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def draws(model: Any) -> bool:
    """Whether a graphed callable may draw random numbers (True where unsure)."""
    fn = output_code(model)
    return fn is None or _code_draws(fn, set())


def _code_draws(fn: types.FunctionType, seen: set[str]) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is None or _name_draws(name, fn, seen):
                return True
    return False


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None   # a call through a subscript or a call's result: unknown
    return ".".join([node.id, *reversed(parts)])


def _name_draws(name: str, fn: types.FunctionType, seen: set[str]) -> bool:
    if name in HELPERS:
        return False
    head, _, rest = name.partition(".")
    if KERNEL.fullmatch(head) and rest in ("", "run"):
        return False
    if OUTPUT_CODE.fullmatch(head) and not rest:   # a partition of the same module
        if head in seen:
            return False
        seen.add(head)
        target = fn.__globals__.get(head)
        return not isinstance(target, types.FunctionType) or _code_draws(target, seen)
    op = _op(name, fn.__globals__)
    return op is None or _tagged(op)


def _op(name: str, scope: dict) -> Any:
    """The torch op (overload or packet) a dotted name in output code calls, or None."""
    import torch
    parts = name.split(".")
    if parts[0] == "torch" and parts[1:2] == ["ops"]:
        parts = parts[2:]
    elif parts[0] in ("aten", "prims") and scope.get(parts[0]) is getattr(torch.ops, parts[0]):
        pass
    elif parts[0] == "extern_kernels" and len(parts) == 2:
        parts = ["aten", parts[1]]     # out= variants of aten ops
    elif parts[0] == "torch" and len(parts) == 2:
        parts = ["aten", parts[1]]     # torch.empty, torch.cat: aten's functions
    elif len(parts) == 2 and parts[0] not in scope:
        parts = ["aten", parts[1]]     # a method of a buffer (buf0.copy_): aten's method
    else:
        return None
    if len(parts) not in (2, 3):
        return None
    try:
        op: Any = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(op, parts[2]) if len(parts) == 3 else op
    except (AttributeError, RuntimeError):
        return None


def _tagged(op: Any) -> bool:
    import torch
    seeded = torch.Tag.nondeterministic_seeded
    if hasattr(op, "overloads"):    # a packet: draws if any overload does
        try:
            return any(seeded in getattr(op, o).tags for o in op.overloads())
        except (AttributeError, RuntimeError):
            return True
    return seeded in getattr(op, "tags", (seeded,))
