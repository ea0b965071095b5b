#!/usr/bin/env python3
"""List the module-level state torch's compiler stack writes, and say for each
entry what overlapping compiles need of it: per thread, locked, once, harmless.

    python3 tools/compile_globals.py                     # the installed torch, static
    python3 tools/compile_globals.py --dynamic           # + what real compiles change
    python3 tools/compile_globals.py --torch-root DIR    # another wheel's sources (static)
    python3 tools/compile_globals.py --unknown           # only what CLASSIFY does not know

Static (AST of every .py under SCOPE, no import needed): in functions,
``global x`` + an assignment to x; a module-level mutable container mutated
(``x[k] = v``, ``x.append(...)``, ...); ``Cls.attr = v`` / ``cls.attr = v`` for a
class of the module; an assignment to another torch module's attribute
(``torch.compiler._is_compiling_flag = True``); and ``functools.cache`` /
``lru_cache`` / ``init_once_fakemode`` functions (lazy one-time set-up).
Dynamic (``--dynamic``, the installed torch only): imports every module in
SCOPE, snapshots module dicts, class dicts and the attributes of module-level
singletons, runs representative compiles (flex_attention + create_block_mask,
an MLP with backward, dynamic shapes, a graph break; compile_lock kept) and
snapshots again at the end and *inside* the compiles (a custom op's fake
implementation during dynamo's trace, inductor's post-grad custom pass): an
entry changed there is marked ``seen``.  Entries the static pass missed are
added with kind ``dynamic``.

The class column comes from CLASSIFY (tools/compile_globals_classes.py, keyed by module:name, so it holds
across torch versions) and from RULES (patterns); an entry neither knows is
``unknown``: read it, then add it to CLASSIFY.  Classes:

- ``per-thread``  one compile's state that another thread's compile or run-time
                  code reads: a fxguard row (module global, class or instance
                  attribute) is needed;
- ``row``         already a row of fxguard's plan;
- ``once``        lazy one-time set-up: needs a once-lock (see torch_support/concurrent_compiles.py, ONCE);
- ``locked``      shared on purpose (caches, registries, counters) and not safe
                  to mutate from two compiles at once: the narrowest lock named in why;
- ``harmless``    shared on purpose and safe under the GIL (why says why).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field

from compile_globals_classes import CLASSIFY, OK, ONCE, ROW, RULES, TEST_HELPER_PATCHES

from fxguard.machinery.rewrite import dotted

SCOPE = ("_dynamo", "_inductor", "_functorch", "_higher_order_ops", "fx", "_subclasses",
         "utils/_python_dispatch.py", "_guards.py")
SKIP_DIRS = ("/test", "/testing", "/benchmarks", "/fb/", "_inductor/kernel/vendored_templates",
             "_inductor/fx_passes/serialized_patterns", "_inductor/codegen/cutlass",
             "_inductor/codegen/rocm", "_dynamo/polyfills")
MUTATORS = {"append", "extend", "add", "update", "pop", "clear", "setdefault", "insert",
            "remove", "discard", "popitem", "appendleft", "extendleft", "popleft", "sort",
            "__setitem__", "__delitem__", "difference_update", "intersection_update"}
CONTAINER_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque",
                   "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "OrderedSet",
                   "collections.defaultdict", "collections.OrderedDict", "collections.Counter",
                   "collections.deque", "weakref.WeakKeyDictionary",
                   "weakref.WeakValueDictionary", "weakref.WeakSet"}
EFFECT_CALL = re.compile(r"^_?(gen_)?register|^_?\w*_init$|^lazy_init$|^populate|^patch_|^add_pass")
CACHE_DECORATORS = {"functools.cache", "functools.lru_cache", "cache", "lru_cache",
                    "init_once_fakemode", "functools.cached_property"}


@dataclass
class Entry:
    module: str
    name: str                 # global, Class.attr, or function qualname (kind cache)
    kind: str                 # global | container | class-attr | module-attr | cache | dynamic
    writers: list[str] = field(default_factory=list)   # file:line (function)
    seen: set[str] = field(default_factory=set)         # dynamic: where a change was seen
    effects: bool = False     # kind cache: its body registers or fills something

    @property
    def key(self) -> str:
        return f"{self.module}:{self.name}"


# -- static ------------------------------------------------------------------------

def module_name(root: str, path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def files(root: str) -> list[str]:
    out = []
    for part in SCOPE:
        base = os.path.join(root, part)
        if base.endswith(".py"):
            out += [base] if os.path.exists(base) else []
            continue
        for folder, _, names in os.walk(base):
            if any(s in folder.replace(os.sep, "/") + "/" for s in SKIP_DIRS):
                continue
            out += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    return sorted(out)


def root_name(node: ast.AST) -> str | None:
    """x for x, x[k], x[k][j] (the container a subscript chain starts at)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def is_container(value: ast.AST) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        return (dotted(value.func) or "") in CONTAINER_CALLS
    return False


class ModuleScan:
    """One module's AST: what its functions write at module or class level."""

    def __init__(self, root: str, path: str, rel: str) -> None:
        self.module, self.rel = module_name(root, path), rel
        with open(path, encoding="utf-8", errors="replace") as f:
            self.tree = ast.parse(f.read(), path)
        self.globals: set[str] = set()
        self.containers: set[str] = set()
        self.classes: set[str] = set()
        self.module_aliases: dict[str, str] = {}   # local name -> torch module it names
        self.class_aliases: dict[str, str] = {}    # local name -> 'torch.mod.Class' imported
        for node in self.tree.body:
            self._top(node)
        self.entries: dict[str, Entry] = {}

    def _top(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    self.globals.add(t.id)
                    if node.value is not None and is_container(node.value):
                        self.containers.add(t.id)
        elif isinstance(node, ast.ClassDef):
            self.classes.add(node.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch"):
                    self.module_aliases[a.asname or a.name.split(".")[0]] = \
                        a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("torch"):
            for a in node.names:  # from torch._dynamo import config: maybe a module
                self.module_aliases.setdefault(a.asname or a.name, f"{node.module}.{a.name}")
                if a.name[:1].isupper():
                    self.class_aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            package = self.module.split(".")
            package = package[:len(package) - node.level]  # a module's own package is one up
            source = ".".join(package + ([node.module] if node.module else []))
            for a in node.names:  # from .ir import FlexibleLayout; from . import ir
                if a.name[:1].isupper():
                    self.class_aliases[a.asname or a.name] = f"{source}.{a.name}"
                else:
                    self.module_aliases.setdefault(a.asname or a.name, f"{source}.{a.name}")
        elif isinstance(node, (ast.If, ast.Try)):
            for inner in node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []):
                self._top(inner)

    def add(self, module: str, name: str, kind: str, line: int, where: str) -> None:
        entry = self.entries.setdefault(f"{kind}:{module}:{name}", Entry(module, name, kind))
        entry.writers.append(f"{self.rel}:{line} ({where})")

    def scan(self) -> list[Entry]:
        self._walk(self.tree.body, [], [])
        return list(self.entries.values())

    def _walk(self, body: list, classes: list[str], funcs: list[str]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                self._walk(node.body, classes + [node.name], funcs)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = ".".join(classes + funcs + [node.name])
                self._cached(node, qual)
                self._function(node, qual, classes)
                self._walk(node.body, classes, funcs + [node.name])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for field_name in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field_name, None)
                    if inner:
                        self._walk(inner, classes, funcs)
            elif isinstance(node, ast.ExceptHandler):
                self._walk(node.body, classes, funcs)

    def _cached(self, fn: ast.AST, qual: str) -> None:
        for d in fn.decorator_list:
            name = dotted(d.func if isinstance(d, ast.Call) else d) or ""
            if name in CACHE_DECORATORS and name != "functools.cached_property":
                self.add(self.module, qual, "cache", fn.lineno, name)
                self.entries[f"cache:{self.module}:{qual}"].effects = self._effects(fn)

    def _effects(self, fn: ast.AST) -> bool:
        """Whether a cached function's body registers or fills process-wide state."""
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                return True
            if isinstance(node, ast.Call):
                name = (dotted(node.func) or "").rsplit(".", 1)[-1]
                if EFFECT_CALL.search(name):
                    return True
                if isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                        and root_name(node.func.value) in self.containers:
                    return True
        return False

    def _own(self, fn: ast.AST):
        """Nodes of fn, not of functions or classes nested in it."""
        stack = list(ast.iter_child_nodes(fn))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack += list(ast.iter_child_nodes(node))

    def _function(self, fn: ast.AST, qual: str, classes: list[str]) -> None:
        declared = {n for node in self._own(fn) if isinstance(node, ast.Global) for n in node.names}
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
        for node in self._own(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in declared:
                local.add(node.id)
        for node in self._own(fn):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            elif isinstance(node, (ast.For, ast.With)):
                targets = [node.target] if isinstance(node, ast.For) else \
                    [i.optional_vars for i in node.items if i.optional_vars is not None]
            for t in targets:
                for sub in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                    self._target(sub, qual, classes, declared, local, node.lineno)
            if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("patch.object") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                self._patched(node.args[0], node.args[1].value, qual, local, node.lineno)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATORS:
                base = root_name(node.func.value)
                if base in self.containers and base not in local:
                    self.add(self.module, base, "container", node.lineno, qual)

    def _patched(self, target: ast.AST, attr: str, qual: str, local: set, line: int) -> None:
        """patch.object(<a class>, "attr", new): a class attribute swapped for the process."""
        owner = dotted(target)
        if owner is None or owner.split(".")[0] in local:
            return  # an instance (V.graph, a fake mode, self): not process-wide
        if owner in self.classes:
            self.add(self.module, f"{owner}.{attr}", "class-attr", line, f"{qual}, patch.object")
        elif owner in self.class_aliases:
            module, _, cls = self.class_aliases[owner].rpartition(".")
            self.add(module, f"{cls}.{attr}", "class-attr", line, f"{qual}, patch.object")
        elif "." in owner and owner.split(".")[0] in self.module_aliases and owner[:1].islower() \
                and owner.rsplit(".", 1)[1][:1].isupper():
            head, _, cls = owner.rpartition(".")
            module = self.module_aliases[head.split(".")[0]] + head[len(head.split(".")[0]):]
            self.add(module, f"{cls}.{attr}", "class-attr", line, f"{qual}, patch.object")

    def _target(self, t: ast.AST, qual: str, classes: list[str], declared: set, local: set,
                line: int) -> None:
        if isinstance(t, ast.Name) and t.id in declared:
            self.add(self.module, t.id, "global", line, qual)
        elif isinstance(t, ast.Subscript):
            base = root_name(t)
            if base in self.containers and base not in local:
                self.add(self.module, base, "container", line, qual)
        elif isinstance(t, ast.Attribute):
            owner = dotted(t.value)
            if owner is None:
                return
            head = owner.split(".")[0]
            if owner in self.classes or (owner == "cls" and classes):
                cls = owner if owner != "cls" else classes[-1]
                self.add(self.module, f"{cls}.{t.attr}", "class-attr", line, qual)
            elif owner == "type(self)":
                pass
            elif head in self.module_aliases and head not in local:
                target = self.module_aliases[head] + owner[len(head):]
                if target.startswith("torch") and not target.endswith("config") \
                        and not re.search(r"\.(config|_config)\b", target):
                    self.add(target, t.attr, "module-attr", line, qual)


def static_entries(root: str) -> list[Entry]:
    merged: dict[tuple, Entry] = {}
    for path in files(root):
        rel = os.path.relpath(path, root)
        try:
            scan = ModuleScan(root, path, rel)
        except SyntaxError:
            continue
        for e in scan.scan():
            key = (e.kind, e.module, e.name)
            if key in merged:
                merged[key].writers += e.writers
            else:
                merged[key] = e
    return list(merged.values())


# -- dynamic -----------------------------------------------------------------------

def scope_modules() -> list[str]:
    import torch
    root = os.path.dirname(torch.__file__)
    return [module_name(root, p) for p in files(root)]


def fingerprint(value: object) -> object:
    if isinstance(value, (bool, int, float, str, bytes, type(None))):
        return ("v", value)
    try:
        if isinstance(value, (dict, list, set, tuple, frozenset)) or hasattr(value, "__len__"):
            return ("n", type(value).__name__, len(value))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a __len__ that fails
        pass
    return ("id", id(value))


def snapshot(names: list[str]) -> dict[tuple[str, str], tuple]:
    """(module, name) -> (id, fingerprint) for module globals, attributes of the
    module's classes, and attributes of module-level singleton instances."""
    import types
    out: dict[tuple[str, str], tuple] = {}
    for modname in names:
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for name, value in list(vars(mod).items()):
            if name.startswith("__") and name.endswith("__"):
                continue
            out[(modname, name)] = (id(value), fingerprint(value))
            own = getattr(value, "__module__", None) == modname
            if isinstance(value, type) and own:
                for attr, v in list(vars(value).items()):
                    if not (attr.startswith("__") and attr.endswith("__")):
                        out[(modname, f"{name}.{attr}")] = (id(v), fingerprint(v))
            elif not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                        types.BuiltinFunctionType)) \
                    and type(value).__module__.startswith("torch") and hasattr(value, "__dict__"):
                try:
                    attrs = list(vars(value).items())
                except TypeError:
                    continue
                for attr, v in attrs:
                    out[(modname, f"{name}.{attr}")] = (id(v), fingerprint(v))
    return out


def run_compiles(snap: dict[str, dict], names: list[str]) -> None:
    """Representative compiles; snapshots taken inside them land in ``snap``."""
    import threading

    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.lowering import lowerings, register_lowering

    @torch.library.custom_op("compile_globals::probe", mutates_args=(), schema="(Tensor x) -> Tensor")
    def probe(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @probe.register_fake
    def _(x):
        snap.setdefault("trace", snapshot(names))  # dynamo/AOT tracing, under FakeTensorMode
        return torch.empty_like(x)

    probe.register_autograd(lambda ctx, grad: grad)

    @register_lowering(torch.ops.compile_globals.probe.default)
    def _(x):
        snap.setdefault("lowering", snapshot(names))  # inside IRNode.current_origins
        return lowerings[torch.ops.aten.clone.default](x)

    def post_grad(graph):
        snap.setdefault("post_grad", snapshot(names))

    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def forward(x):
        return probe(mlp(x)).sum()

    with inductor_config.patch(post_grad_custom_post_pass=post_grad, fx_graph_cache=False):
        torch.compile(forward)(torch.randn(8, 16)).backward()  # MLP with backward

    def dynamic(x):
        return (x * x.shape[0]).cos()
    compiled = torch.compile(dynamic, dynamic=True)
    compiled(torch.ones(5))
    compiled(torch.ones(9))

    def breaks(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y + 1
    torch.compile(breaks)(torch.ones(4))

    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def causal(b, h, q, kv):
            return q >= kv
        mask = create_block_mask(causal, 1, 1, 128, 128, device="cpu")
        q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
        torch.compile(flex_attention)(q, k, v, block_mask=mask)
    except Exception as e:  # noqa: BLE001 - flex on this torch/CPU: say so, go on
        print(f"# flex_attention compile skipped: {type(e).__name__}: {e}", file=sys.stderr)
    _ = threading  # compile_lock kept: one thread


def dynamic_pass(entries: list[Entry]) -> list[Entry]:
    """Mark entries changed by representative compiles; add ones statics missed."""
    import importlib
    import warnings
    warnings.filterwarnings("ignore")
    names = []
    for name in scope_modules():
        try:
            importlib.import_module(name)
            names.append(name)
        except Exception:  # noqa: BLE001 - CUDA-only or optional-dependency modules
            continue
    before = snapshot(names)
    snap: dict[str, dict] = {}
    run_compiles(snap, names)
    snap["end"] = snapshot(names)
    by_key = {(e.module, e.name): e for e in entries}
    for stage, after in snap.items():
        for key, (ident, fp) in after.items():
            old = before.get(key)
            if old is not None and old == (ident, fp):
                continue
            if old is None and "." in key[1]:
                continue  # an instance/class attribute added lazily: reported via its owner
            if old is None and isinstance(sys.modules[key[0]].__dict__.get(key[1]),
                                          (type, type(sys), type(dynamic_pass))):
                continue  # a submodule, class or function bound by a lazy import
            entry = by_key.get(key)
            if entry is None:
                entry = by_key[key] = Entry(key[0], key[1], "dynamic")
                entries.append(entry)
            entry.seen.add(stage if old is not None else f"{stage}(new)")
    return entries


def collapse_aliases(entries: list[Entry]) -> list[Entry]:
    """A dynamic-only entry that is the same object as another entry (``from
    torch._dynamo.utils import counters`` in forty modules) is reported once."""
    owners: dict[int, Entry] = {}
    out = []
    for e in sorted(entries, key=lambda e: (e.kind == "dynamic", e.key not in CLASSIFY,
                                            len(e.module), e.key)):
        if e.kind == "dynamic":
            mod = sys.modules.get(e.module)
            value = getattr(mod, e.name.split(".")[0], None) if mod else None
            for part in e.name.split(".")[1:]:
                value = getattr(value, part, None)
            if value is not None and not isinstance(value, (bool, int, float, str)):
                first = owners.setdefault(id(value), e)
                if first is not e:
                    first.writers.append(f"alias {e.key}")
                    continue
        out.append(e)
    return out


# -- classification ------------------------------------------------------------------
# The tables: tools/compile_globals_classes.py.  What is already a row: read from
# fxguard's rows (option concurrent_compiles), never retyped here.


def concurrent_rows(root: str) -> set[str]:
    """module:name of everything option concurrent_compiles' rows cover: each
    row's state and what its lock or once-lock guards (``guards``)."""
    from fxguard.machinery.changes import Outcome
    from fxguard.torch_support import rows
    from fxguard.torch_support.options import Option
    keys = set()
    for row in rows.ROWS:
        if row.option != Option.CONCURRENT_COMPILES:
            continue
        wheres = [r.where for r in row.report(Outcome.PATCHED)]
        wheres += [g for entry in getattr(row, "entries", (row,)) for g in getattr(entry, "guards", ())]
        keys |= {module_key(root, where) for where in wheres if ", " not in where}
    return keys


def module_key(root: str, where: str) -> str:
    """'torch.mod.Cls.attr' -> 'torch.mod:Cls.attr': the longest prefix that is a
    module file under the torch folder ``root``."""
    parts = where.split(".")
    for n in range(len(parts) - 1, 1, -1):
        path = os.path.join(root, *parts[1:n])
        if os.path.exists(path + ".py") or os.path.exists(os.path.join(path, "__init__.py")):
            return ".".join(parts[:n]) + ":" + ".".join(parts[n:])
    return where


def classify(e: Entry, covered: set[str]) -> tuple[str, str]:
    if e.key in covered:
        why = CLASSIFY.get(e.key, ("", ""))[1]
        return ROW, "option concurrent_compiles" + (f"; {why}" if why else "")
    if e.key in TEST_HELPER_PATCHES:
        return OK, "inductor test helper (torch._inductor.utils) patching for the process"
    if e.key in CLASSIFY:
        return CLASSIFY[e.key]
    if e.kind == "cache" and e.effects:
        return (ONCE, "lazy one-time set-up that registers/fills shared state: two first compiles "
                      "both miss the cache and both run it (post_grad's: Duplicate pattern); "
                      "once-lock (concurrent_compiles.ONCE)")
    for kind, pattern, verdict in RULES:
        if re.match(kind, e.kind) and re.search(pattern, e.key):
            return verdict
    return ("unknown", "")


def main(argv: list[str] | None = None) -> int:
    import signal
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends us quietly
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-root", help="a torch package folder (default: the installed one)")
    parser.add_argument("--dynamic", action="store_true", help="also run representative compiles")
    parser.add_argument("--unknown", action="store_true", help="only entries CLASSIFY/RULES miss")
    parser.add_argument("--kinds", default="", help="comma-separated kinds to show (default all)")
    args = parser.parse_args(argv)
    if args.torch_root:
        root, version = args.torch_root, "?"
        version_file = os.path.join(root, "version.py")
        if os.path.exists(version_file):
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", open(version_file).read())
            version = m.group(1) if m else "?"
    else:
        import torch
        root, version = os.path.dirname(torch.__file__), torch.__version__
    if args.dynamic and args.torch_root:
        parser.error("--dynamic runs the installed torch; drop --torch-root")
    entries = static_entries(root)
    if args.dynamic:
        entries = collapse_aliases(dynamic_pass(entries))
    kinds = set(filter(None, args.kinds.split(",")))
    rows, covered = [], concurrent_rows(root)
    for e in sorted(entries, key=lambda e: (e.module, e.name)):
        cls, why = classify(e, covered)
        if (args.unknown and cls != "unknown") or (kinds and e.kind not in kinds):
            continue
        writers = "; ".join(e.writers[:2]) + (f"; +{len(e.writers) - 2}" if len(e.writers) > 2 else "")
        rows.append((e.key, e.kind, writers, ",".join(sorted(e.seen)), cls, why))
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r[4]] += 1
    print(f"# torch {version}: {len(rows)} entries ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})"
          f"{'; dynamic pass run' if args.dynamic else ''}\n")
    print("| global | kind | writers (file:line (function)) | seen changed | class | why |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
