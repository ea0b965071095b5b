"""Recompile a function from its own source so that chosen globals live elsewhere.

Knows no torch names.  ``redirect(fn, names, via)`` reads the file ``fn`` was
compiled from, finds its ``def`` in the module's AST, turns every use of a
global in ``names`` (a read, an assignment, ``global x``) into an attribute of
``via`` (a name in the function's globals), and compiles it again with the
original file name and line numbers: tracebacks, ``inspect`` and dynamo's
skip rules see the same function.  The caller swaps the result into
``fn.__code__``, so every holder of the function object (closures, tables,
``from ... import`` aliases) runs the new code.

Why source and not bytecode: bytecode changes with every CPython release;
the AST of a ``def`` does not, and a global read and write are plain
``Name`` nodes in it.  The price is that the file must be there and match the
loaded code, which ``_find_def`` checks (name and first line).
"""
from __future__ import annotations

import ast
import copy
import types
from typing import Iterable

from . import code_cache


class RewriteError(RuntimeError):
    """The function's source is missing, does not match, or binds a name locally."""


def redirect(fn: types.FunctionType, names: Iterable[str], via: str,
             attributes: dict[str, str] | None = None,
             patches: dict[tuple[str, str], str] | None = None) -> tuple[types.CodeType, int]:
    """New code for ``fn`` and how many uses it changed.

    ``names``: globals of fn's module to serve as ``<via>.<name>``.
    ``attributes``: dotted expressions (``"pkg.mod.name"``) to serve as
    ``<via>.<name>`` too (writers in other modules).
    ``patches``: ``(target source, attribute) -> name``: a call
    ``patch.object(<target>, "<attribute>", new)`` (``mock.`` / ``unittest.mock.``
    too) becomes ``<via>.patch("<name>", new)``.  Raises RewriteError.
    """
    names, attributes = tuple(sorted(names)), tuple(sorted((attributes or {}).items()))
    request = (names, via, attributes) + ((tuple(sorted(patches.items())),) if patches else ())
    return _cached_recompile("redirect", fn.__code__, request,
                             lambda: _Redirect(set(names), via, dict(attributes), patches=patches))


def uses_in_defs(filename: str, name: str) -> list[int]:
    """Lines where code inside a def (or lambda) of this file uses global ``name``."""
    def find() -> tuple[int, ...]:
        finder = _Redirect({name}, "_", {}, dry=True)  # one pass, the parse left as read
        finder.visit(_module_ast(filename))
        return tuple(sorted(finder.lines))

    return list(code_cache.memo("uses", filename, (name,), find, _is_int_tuple))


def def_body(code: types.CodeType) -> str | None:
    """The body of code's def as ``ast.unparse`` writes it, statements joined by
    "; ", docstring dropped; None without source."""
    def body() -> str | None:
        try:
            statements = _find_def(_module_ast(code.co_filename), code)[-1].body
        except RewriteError:
            return None
        if statements and isinstance(statements[0], ast.Expr) and \
                isinstance(statements[0].value, ast.Constant) and isinstance(statements[0].value.value, str):
            statements = statements[1:]  # the docstring
        return "; ".join(ast.unparse(statement) for statement in statements)

    return code_cache.memo("body", code.co_filename, (code.co_name, code.co_firstlineno), body,
                           lambda v: v is None or isinstance(v, str))


def _is_int_tuple(value: object) -> bool:
    return isinstance(value, tuple) and all(type(v) is int for v in value)


def def_span(code: types.CodeType) -> tuple[int, int]:
    """First and last source line of a function's code, nested code included."""
    last, stack = code.co_firstlineno, [code]
    while stack:
        c = stack.pop()
        last = max([last] + [line for _, _, line in c.co_lines() if line is not None])
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return code.co_firstlineno, last


def global_users(codes: Iterable[types.CodeType], name: str) -> bool:
    """Whether any of these code objects (nested ones included) names ``name``."""
    stack = list(codes)
    while stack:
        code = stack.pop()
        if name in code.co_names:
            return True
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return False


# -- finding the def ---------------------------------------------------------

def _module_ast(filename: str) -> ast.Module:
    """The module's parse, shared while a code_cache session lasts: never change it."""
    if not code_cache.source(filename)[0]:
        raise RewriteError(f"no source for {filename}")

    def parse(text: str) -> ast.Module:
        try:
            return ast.parse(text, filename)
        except SyntaxError as e:
            raise RewriteError(f"cannot parse {filename}: {e}") from None

    return code_cache.parsed(filename, parse)


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _find_def(tree: ast.Module, code: types.CodeType) -> list[ast.AST]:
    """Path of nodes (enclosing classes, then the def) whose code is ``code``."""
    def search(body: list[ast.stmt], path: list[ast.AST]):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == code.co_name and _first_line(node) == code.co_firstlineno:
                    return path + [node]
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found = search(node.body, path + [node])  # methods; closures made by a def
                if found:
                    return found
            for field in ("body", "orelse", "finalbody", "handlers"):  # defs under if/try
                inner = getattr(node, field, None)
                if isinstance(node, (ast.If, ast.Try, ast.With, ast.ExceptHandler)) and inner:
                    found = search(inner, path)
                    if found:
                        return found
        return None

    found = search(tree.body, [])
    if found is None:
        raise RewriteError(f"def {code.co_name} at line {code.co_firstlineno} not found in "
                           f"{code.co_filename}: source and loaded code differ")
    return found


def _copy(node: ast.AST) -> ast.AST:
    return copy.deepcopy(node)  # the parsed module stays as read


def _future_imports(tree: ast.Module) -> list[ast.stmt]:
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]


def _nest(func: ast.AST, classes: list[ast.AST], future: list[ast.stmt],
          free: tuple[str, ...] = ()) -> ast.Module:
    """Put the def back inside its classes (for ``__class__``/qualname) and
    enclosing defs (binding its free variables), alone."""
    node = func
    for cls in reversed(classes):
        if not isinstance(cls, ast.ClassDef):  # an enclosing def: bind what the closure uses
            bind = [ast.Assign(targets=[ast.Name(id=v, ctx=ast.Store()) for v in free],
                               value=ast.Constant(value=None))] if free else []
            shell = ast.FunctionDef(name=cls.name, args=_copy(cls.args), body=bind + [node],
                                    decorator_list=[], returns=None, type_comment=None,
                                    **({"type_params": []} if hasattr(cls, "type_params") else {}))
            ast.copy_location(shell, cls)
            node = shell
            continue
        shell = ast.ClassDef(name=cls.name, bases=[], keywords=[], body=[node],
                             decorator_list=[], **({"type_params": []} if hasattr(cls, "type_params") else {}))
        ast.copy_location(shell, cls)
        node = shell
    return ast.Module(body=future + [node], type_ignores=[])


def _find_code(compiled: types.CodeType, original: types.CodeType) -> types.CodeType:
    stack = [compiled]
    while stack:
        code = stack.pop()
        if code.co_name == original.co_name and code.co_firstlineno == original.co_firstlineno \
                and code is not compiled:
            return code
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    raise RewriteError(f"recompiled {original.co_name} not found")


# -- the change itself -------------------------------------------------------

class _Redirect(ast.NodeTransformer):
    """Global ``x`` -> ``via.x`` in a def and the defs nested in it.

    A name is redirected in a scope only if it is global there: declared
    ``global``, or never bound locally.  A scope that binds it locally
    without ``global`` keeps its own variable (and nested scopes that see it)."""

    PATCH_OBJECT = {"patch.object", "mock.patch.object", "unittest.mock.patch.object"}

    def __init__(self, names: set[str], via: str, attributes: dict[str, str], dry: bool = False,
                 patches: dict[tuple[str, str], str] | None = None):
        self.names, self.via, self.attributes = names, via, attributes
        self.patches = patches or {}
        self.dry = dry  # count and note lines only: the tree is left as it is
        self.count = 0
        self.lines: set[int] = set()
        self.scopes: list[tuple[ast.AST, ast.arguments | None]] = []  # enclosing defs, lambdas
        self.local: list[set[str] | None] = []  # per scope: names bound locally (None: not yet)

    def _scope(self, node: ast.AST, args: ast.arguments | None) -> ast.AST:
        self.scopes.append((node, args))
        # A dry pass changes nothing, so a scope's locals can wait until a name
        # of interest shows up in it (most never see one); a rewrite needs them
        # before it turns `global x` into `pass`.
        self.local.append(None if self.dry else self._locals_of(len(self.scopes) - 1))
        try:
            self.generic_visit(node)
        finally:
            self.local.pop()
            self.scopes.pop()
        return node

    def _locals_of(self, i: int) -> set[str]:
        """Names of interest bound locally in scope i (or in a scope around it)."""
        node, args = self.scopes[i]
        declared = {n for g in _own_nodes(node, ast.Global) for n in g.names}
        bound = _bound_names(node, args) - declared
        inherited = self._local(i - 1) if i else set()
        return (inherited | bound) & self.names

    def _local(self, i: int) -> set[str]:
        if self.local[i] is None:
            self.local[i] = self._locals_of(i)
        return self.local[i]

    def visit_FunctionDef(self, node):
        return self._scope(node, node.args)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        return self._scope(node, node.args)

    def visit_Global(self, node: ast.Global) -> ast.AST:
        kept = [n for n in node.names if n not in self.names]
        if len(kept) == len(node.names):
            return node
        self.count += 1
        if self.dry:
            return node
        return ast.copy_location(ast.Global(names=kept), node) if kept \
            else ast.copy_location(ast.Pass(), node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in self.names or (self.dry and not self.local):
            return node  # (module or class level: not inside a def)
        if not self.local or node.id not in self._local(len(self.local) - 1):
            self.count += 1
            self.lines.add(node.lineno)
            return node if self.dry else ast.copy_location(self._slot(node.id, node.ctx), node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        path = dotted(node)
        if path in self.attributes:
            self.count += 1
            if self.dry:
                return node
            return ast.copy_location(self._slot(self.attributes[path], node.ctx), node)
        self.generic_visit(node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = self._patched(node)
        self.generic_visit(node)
        if name is None:
            return node
        self.count += 1
        self.lines.add(node.lineno)
        if self.dry:
            return node
        call = ast.Call(func=ast.Attribute(value=ast.Name(id=self.via, ctx=ast.Load()), attr="patch",
                                           ctx=ast.Load()),
                        args=[ast.Constant(value=name), node.args[2]], keywords=[])
        return ast.copy_location(call, node)

    def _patched(self, node: ast.Call) -> str | None:
        """The name a ``patch.object(target, "attr", new)`` call is served by, if listed."""
        if not self.patches or dotted(node.func) not in self.PATCH_OBJECT or \
                len(node.args) != 3 or node.keywords or not isinstance(node.args[1], ast.Constant):
            return None
        return self.patches.get((ast.unparse(node.args[0]), node.args[1].value))

    def _slot(self, name: str, ctx: ast.expr_context) -> ast.Attribute:
        return ast.Attribute(value=ast.Name(id=self.via, ctx=ast.Load()), attr=name, ctx=ctx)


def dotted(node: ast.AST) -> str | None:
    """'a.b.c' for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def _own_nodes(scope: ast.AST, kind: type):
    """Nodes of ``kind`` in this scope, not in scopes nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack += list(ast.iter_child_nodes(node))


def _bound_names(scope: ast.AST, args: ast.arguments | None) -> set[str]:
    bound = set()
    if args is not None:
        every = args.posonlyargs + args.args + args.kwonlyargs + \
            [a for a in (args.vararg, args.kwarg) if a is not None]
        bound |= {a.arg for a in every}
    for node in _own_nodes(scope, ast.AST):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


# -- container operations through a view ---------------------------------------

def view_containers(fn: types.FunctionType, containers: Iterable[str],
                    via: str) -> tuple[types.CodeType, int]:
    """New code for ``fn`` in which every item, membership and attribute
    operation on one of ``containers`` (source text: ``"frame_dict"``,
    ``"self.frame_dict"``) goes through ``via(container)`` instead:
    ``d[k] = v``, ``k in d``, ``d.items()``, ``getattr(d, k)``,
    ``setattr(d, k, v)``.  Passing the container on (``f(d)``) is left alone.
    Returns (code, how many operations changed).  Raises RewriteError.
    """
    containers = tuple(sorted(containers))
    return _cached_recompile("view", fn.__code__, (containers, via),
                             lambda: _ViewContainers(set(containers), via))


class _ViewContainers(ast.NodeTransformer):
    ATTRIBUTE_FUNCTIONS = {"getattr", "setattr", "delattr", "hasattr"}

    def __init__(self, containers: set[str], via: str):
        self.containers, self.via, self.count = containers, via, 0

    def _view(self, node: ast.expr) -> ast.expr:
        if ast.unparse(node) not in self.containers:
            return node
        self.count += 1
        call = ast.Call(func=ast.Name(id=self.via, ctx=ast.Load()), args=[node], keywords=[])
        return ast.copy_location(call, node)

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        node.value = self._view(node.value)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        node.comparators = [self._view(c) if isinstance(op, (ast.In, ast.NotIn)) else c
                            for op, c in zip(node.ops, node.comparators)]
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.value = self._view(node.value)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in self.ATTRIBUTE_FUNCTIONS and node.args:
            node.args[0] = self._view(node.args[0])
        return node


def _cached_recompile(kind: str, code: types.CodeType, request: tuple,
                      make_changer) -> tuple[types.CodeType, int]:
    """_recompiled(), through the code cache; an unchanged def gives code itself."""
    def compute() -> tuple[types.CodeType | None, int]:
        new, count = _recompiled(code, make_changer)
        return (new if count else None), count

    new, count = code_cache.memo(kind, code.co_filename,
                                 (code.co_name, code.co_firstlineno, code.co_freevars) + request,
                                 compute, _is_recompiled)
    return (new if count else code), count


def _is_recompiled(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and type(value[1]) is int and \
        (isinstance(value[0], types.CodeType) if value[1] else value[0] is None)


def _recompiled(code: types.CodeType, make_changer) -> tuple[types.CodeType, int]:
    """code's def, from its module's source, run through a fresh NodeTransformer
    that counts its changes (``.count``), compiled where and as code was."""
    tree = _module_ast(code.co_filename)
    path = _find_def(tree, code)
    changer = make_changer()
    func = changer.visit(_copy(path[-1]))
    if changer.count == 0:
        return code, 0
    wrapped = _nest(func, path[:-1], _future_imports(tree), code.co_freevars)
    compiled = compile(ast.fix_missing_locations(wrapped), code.co_filename, "exec",
                       dont_inherit=True)
    new = _find_code(compiled, code)
    if new.co_freevars != code.co_freevars:
        raise RewriteError(f"{getattr(code, 'co_qualname', code.co_name)}: "
                           f"free variables differ ({new.co_freevars} vs {code.co_freevars})")
    return new, changer.count
