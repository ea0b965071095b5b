"""The package's structure from its imports: modules, import arrows between them,
arrows that run back up the layers, import circles, and the longest functions.

Layers, bottom up: the start-up hook (_fxguard_startup), the C core's stub
(fxguard._core) and fxguard.interpreter, fxguard.machinery (torch-free), fxguard.torch_support, the
package's top-level modules, and cli/doctor/demos (what a user runs).  An arrow
"back" imports a higher layer from a lower one; a circle is a set of modules
that import each other (module-level imports, and all imports).

    python tools/structure.py [src]
"""
from __future__ import annotations

import ast
import os
import sys


def modules(src: str) -> dict[str, str]:
    found = {}
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith((".py", ".pyi")):  # _core.pyi: the C core, a module of its own
                path = os.path.join(root, f)
                name = os.path.relpath(path, src).rsplit(".", 1)[0].replace(os.sep, ".")
                found[name.removesuffix(".__init__")] = path
    return found


def layer(name: str) -> int:
    if name.startswith("_fxguard_startup"):
        return 0
    if name.startswith("fxguard._core") or name == "fxguard.interpreter":  # what this Python is
        return 1
    if name.startswith("fxguard.machinery"):
        return 2
    if name.startswith("fxguard.torch_support"):
        return 3
    if name.split(".")[1:2] in (["cli"], ["doctor"], ["demos"], ["__main__"], ["pytest_plugin"]):
        return 5
    return 4


def arrows(name: str, path: str, known: set[str]) -> tuple[set[str], set[str]]:
    """(imported at module level, imported anywhere) among the known modules."""
    tree = ast.parse(open(path).read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    top, anywhere = set(), set()

    def target(mod: str | None, level: int, names: list[str]) -> list[str]:
        if level:
            base = package.split(".")
            base = base[:len(base) - level + 1]
            mod = ".".join(base + ([mod] if mod else []))
        out = []
        for n in names:
            if f"{mod}.{n}" in known:
                out.append(f"{mod}.{n}")
            elif mod in known:
                out.append(mod)
        return out

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            found: list[str] = []
            if isinstance(child, ast.Import):
                found = [a.name for a in child.names if a.name in known]
            elif isinstance(child, ast.ImportFrom):
                found = target(child.module, child.level, [a.name for a in child.names])
            for f in found:
                if f != name:
                    anywhere.add(f)
                    if depth == 0:
                        top.add(f)
            inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only
            visit(child, inner)
    visit(tree, 0)
    return top, anywhere


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in graph:
        if v not in index:
            strong(v)
    return out


def longest_functions(paths: dict[str, str], most: int = 5) -> list[tuple[int, str]]:
    found = []
    for name, path in paths.items():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    return sorted(found, reverse=True)[:most]


def main(src: str) -> None:
    paths = modules(src)
    known = set(paths)
    top, anywhere = {}, {}
    for name, path in paths.items():
        top[name], anywhere[name] = arrows(name, path, known)
    edges = [(a, b) for a in anywhere for b in anywhere[a]]
    back = sorted((a, b) for a, b in edges if layer(b) > layer(a))
    print(f"modules: {len(paths)}; lines: {sum(len(open(p).readlines()) for p in paths.values())}")
    print(f"import arrows: {len(edges)} ({sum(len(v) for v in top.values())} at module level)")
    print(f"arrows back up the layers: {len(back)}")
    for a, b in back:
        print(f"  {a} -> {b}")
    for label, graph in (("module-level", top), ("all imports", anywhere)):
        found = circles(graph)
        print(f"circles ({label}): {len(found)}")
        for c in found:
            print("  " + " <-> ".join(c))
    print("longest functions:")
    for n, name in longest_functions(paths):
        print(f"  {n:4d} {name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "src")
