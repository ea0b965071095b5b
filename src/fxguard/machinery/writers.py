"""Who in a package assigns a module global as an attribute (``mod.name = v``).

A per-thread global is served from the C core once install() deleted it; a
write ``torch.compiler._is_compiling_flag = True`` in a function fxguard did
not rewrite would set a module attribute nobody reads.  ``attribute_writes``
lists every such store inside a def, in every ``.py`` file under a package
folder, so install() can check each row's listed writers against the package
it meets (a new release may add one).  The scan reads every file once (~0.1 s
for torch) and parses only those with text that may store a name (an
assignment, augmented or annotated, or a tuple or list element after it); its
result is kept in the code cache, keyed by a marker file of the package
(torch's ``version.py``, which names its build).  Knows no torch names.
"""
from __future__ import annotations

import ast
import os
import re

from . import code_cache

Write = tuple[str, int, tuple[str, ...]]  # (path under the folder, line, enclosing defs, innermost first)


def attribute_writes(root: str, marker: str, names: tuple[str, ...]) -> dict[str, tuple[Write, ...]]:
    """name -> every ``<expr>.<name> = ...`` inside a def under ``root``."""
    names = tuple(sorted(set(names)))
    may_store = re.compile(r"\.\s*(?:%s)\b\s*(?:[,)\]:]|(?://|>>|<<|\*\*|[-+*/%%&|^@])?=(?!=))"
                           % "|".join(map(re.escape, names)))

    def scan() -> dict[str, tuple[Write, ...]]:
        found: dict[str, list[Write]] = {name: [] for name in names}
        for folder, _, files in os.walk(root):
            for file in sorted(files):
                if file.endswith(".py"):
                    _scan_file(os.path.join(folder, file), root, names, may_store, found)
        return {name: tuple(sorted(writes)) for name, writes in found.items()}

    return code_cache.memo("writers", marker, (root, names), scan, _is_writes)


def _scan_file(path: str, root: str, names: tuple[str, ...], may_store: re.Pattern,
               found: dict) -> None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return
    if not may_store.search(text):  # one pass; most files end here
        return
    wanted = [name for name in names if name in text]
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    relative = os.path.relpath(path, root)

    def walk(node: ast.AST, defs: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs = (node.name,) + defs
        if defs and isinstance(node, ast.Attribute) and node.attr in wanted and \
                isinstance(node.ctx, ast.Store):
            found[node.attr].append((relative, node.lineno, defs))
        for child in ast.iter_child_nodes(node):
            walk(child, defs)

    walk(tree, ())


def unlisted(writes: tuple[Write, ...], listed: set[str]) -> list[str]:
    """The writes no listed function makes (the writer, or a def around it: a
    closure it makes), as ``path:line in def()``."""
    return [f"{path}:{line} in {defs[0]}()" for path, line, defs in writes
            if not listed & set(defs)]


def _is_writes(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, tuple) for k, v in value.items())
