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
(torch's ``version.py``, which names its build) and by the tree's signature:
every ``.py`` file's size and modification time and every folder's
modification time, so a package edited in place is scanned again.  Listing
the tree's folders costs ~40 ms for torch (~1000 folders holding ~14000
entries, C++ headers mostly), so the listing is cached too and only stat()ed,
in C (~5 ms): a folder's mtime changes whenever an entry is added, removed or
renamed in it (POSIX), so while every listed folder keeps its mtime the cached
listing is the tree's, and a file edited in place changes its own size or mtime.
Writes are matched to listed writers by module and qualified name, never by a
bare function name.  Knows no torch names.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
import time

from .. import _core
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

    return code_cache.memo("writers", marker, (root, names, tree_signature(root, marker)), scan, _is_writes)


def tree_signature(root: str, marker: str | None = None) -> str:
    """Every folder's path and modification time, and every .py file's path,
    size and modification time, under ``root``: a file edited, added or removed
    gives another signature.  With ``marker``, the listing of folders and files
    is kept in the code cache and checked by the folders' mtimes, so a warm
    signature costs one stat() per folder and per .py file (C, ~5 ms for torch)
    instead of reading every folder (~40 ms)."""
    if marker is None:
        listing = _list_tree(root)
    else:
        listing = code_cache.memo("writers-tree", marker, (root,), lambda: _list_tree(root),
                                  lambda value: _is_listing(value) and _still_listed(root, value))
    dirs, dir_stats, files = listing
    h = hashlib.sha256()
    for part in (dirs.encode("utf-8", "surrogateescape"), dir_stats,
                 files.encode("utf-8", "surrogateescape"), _core._stat_paths(root, files)):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


# A folder changed this recently may change again within its mtime's granularity
# (the kernel's coarse clock): a later process does not trust its listing.
_RACY_NS = 2_000_000_000
_RACY = (-2).to_bytes(8, sys.byteorder, signed=True) * 2  # no stat() gives it


def _list_tree(root: str) -> tuple[str, bytes, str]:
    """(every folder os.walk visits, their (size, mtime_ns) as _core._stat_paths
    gives them, the .py files), paths relative to ``root`` and joined by NUL
    (one str each: the cache holds ~3000 of them).  A folder modified in the
    last two seconds is recorded as (-2, -2), which no later stat() matches."""
    dirs, files = [], []
    for folder, subdirs, names in os.walk(root):
        subdirs.sort()
        relative = os.path.relpath(folder, root)
        dirs.append(relative)
        files += [name if relative == os.curdir else os.path.join(relative, name)
                  for name in sorted(names) if name.endswith(".py")]
    stats, now = _core._stat_paths(root, "\0".join(dirs)), time.time_ns()
    records = [stats[i:i + 16] for i in range(0, len(stats), 16)]
    stats = b"".join(_RACY if now - int.from_bytes(r[8:], sys.byteorder, signed=True) < _RACY_NS
                     else r for r in records)
    return "\0".join(dirs), stats, "\0".join(files)


def _still_listed(root: str, listing: tuple[str, bytes, str]) -> bool:
    """Every listed folder has the size and mtime it had when listed: no entry
    was added, removed or renamed in any of them since."""
    return _core._stat_paths(root, listing[0]) == listing[1]


def _is_listing(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str) \
        and isinstance(value[1], bytes) and isinstance(value[2], str) \
        and len(value[1]) == 16 * (value[0].count("\0") + 1)


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
