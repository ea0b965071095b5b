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
(torch's ``version.py``, which names its build) and by every ``.py`` file's
size and modification time, so a package edited in place is scanned again.
Writes are matched to listed writers by module and qualified name, never by a
bare function name.  Knows no torch names.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re

from . import code_cache

# (path under the folder, line, enclosing scopes innermost first: ("def", name) or ("class", name))
Write = tuple[str, int, tuple[tuple[str, str], ...]]


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

    return code_cache.memo("writers", marker, (root, names, tree_signature(root)), scan, _is_writes)


def tree_signature(root: str) -> str:
    """Every .py file's path, size and modification time under ``root``: a file
    edited, added or removed gives another signature (~20 ms for torch)."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for file in sorted(files):
            if file.endswith(".py"):
                try:
                    st = os.stat(os.path.join(folder, file))
                except OSError:
                    continue
                h.update(f"{folder}/{file}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


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

    def walk(node: ast.AST, scopes: tuple[tuple[str, str], ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scopes = (("def", node.name),) + scopes
        elif isinstance(node, ast.ClassDef):
            scopes = (("class", node.name),) + scopes
        if isinstance(node, ast.Attribute) and node.attr in wanted and \
                isinstance(node.ctx, ast.Store) and any(k == "def" for k, _ in scopes):
            found[node.attr].append((relative, node.lineno, scopes))
        for child in ast.iter_child_nodes(node):
            walk(child, scopes)

    walk(tree, ())


def module_of(path: str, package: str) -> str:
    """'fx/_symbolic_trace.py' under package 'torch' -> 'torch.fx._symbolic_trace'."""
    parts = path[:-len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package] + parts)


def writers_of(write: Write, package: str) -> list[str]:
    """The dotted paths of the functions a write lies in: the innermost def and
    every def around it (a closure it makes), each ``module.Qual.name``."""
    path, _, scopes = write
    module = module_of(path, package)
    names = [name for _, name in reversed(scopes)]  # outermost first
    return [".".join([module] + names[:len(names) - i])
            for i, (kind, _) in enumerate(scopes) if kind == "def"]


def unlisted(writes: tuple[Write, ...], listed: set[str], package: str) -> list[str]:
    """The writes no listed function makes (the writer, or a def around it: a
    closure it makes), as ``path:line in module.Qual.name()``; listed writers
    are dotted paths ('torch.fx._symbolic_trace.Tracer.trace')."""
    missed = []
    for write in writes:
        paths = writers_of(write, package)
        if not listed & set(paths):
            missed.append(f"{write[0]}:{write[1]} in {paths[0]}()")
    return missed


def _is_writes(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, tuple) and all(
            len(w) == 3 and all(isinstance(s, tuple) and len(s) == 2 for s in w[2]) for w in v)
        for k, v in value.items())
