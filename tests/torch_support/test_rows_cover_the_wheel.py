"""The plan's rows cover every writer in the installed torch wheel.

A per-thread global that some other module assigns as an attribute
(``torch.compiler._is_compiling_flag = True``) must be a listed writer, or
that write would land in a module attribute nobody reads after install().
"""
import ast
import os

import pytest

import torch

from fxguard.machinery import writers
from fxguard.machinery.per_thread_globals import PerThread
from fxguard.torch_support import concurrent_compiles, rows

ROOT = os.path.dirname(torch.__file__)


def test_every_attribute_writer_of_a_per_thread_global_is_listed():
    """What install() checks (PerThread.plan), over every row at once."""
    per_thread = [row for row in rows.ROWS if isinstance(row, PerThread)]
    writes = writers.attribute_writes(ROOT, os.path.join(ROOT, "version.py"),
                                      tuple(row.name for row in per_thread))
    unlisted = []
    for row in per_thread:
        listed = set(row.writers + row.or_writers)
        unlisted += [f"{row.where}: {w}" for w in writers.unlisted(writes[row.name], listed, "torch")]
    assert unlisted == []


def test_every_row_is_patched_or_says_why():
    import importlib

    import fxguard
    for module in ("torch._dynamo", "torch.export._trace", "torch.nn.attention.flex_attention",
                   "torch._functorch.config", "torch._inductor.compile_fx",
                   "torch._inductor.cudagraph_trees"):  # what rows wait for (install on import)
        importlib.import_module(module)
    rows = fxguard.install()["patch_points"]
    assert all(r["outcome"] in ("patched", "not needed", "not available", "option off")
               or r["what"] in KNOWN_HAZARDS for r in rows), rows
    for r in rows:
        if r["what"] in KNOWN_HAZARDS and r["outcome"] == "not covered":
            assert "docs/limits.md" in r["reason"], r  # shows the reason: where users read about it


# Rows whose absence on an older torch is a hazard fxguard reports rather than fixes.
KNOWN_HAZARDS = {"eager backward"}  # no force_non_lazy_backward_lowering before torch 2.10


def wheel_trees(names):
    """(path relative to torch, module name, AST) of every .py file in the wheel
    whose text holds one of ``names``."""
    for folder, _, files in os.walk(ROOT):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if not any(name in text for name in names):
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            rel = os.path.relpath(path, ROOT)
            module = "torch." + rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
            yield rel, module, tree


@pytest.mark.slow
def test_every_writer_of_a_per_thread_class_attribute_is_covered():
    """concurrent_compiles' class attributes: every ``<spelling> = ...`` is a
    listed writer, every ``patch.object(<Cls>, "<attr>", ...)`` lies in a
    module the row rewrites (install() then checks each such function)."""
    unlisted = []
    by_name = {row.where.rsplit(".", 1)[1]: row for row in concurrent_compiles.CLASS_ATTRS}
    for rel, module, tree in wheel_trees(by_name):
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                        node.attr in by_name:
                    row = by_name[node.attr]
                    if ast.unparse(node) in row.spelled and \
                            not any(w.endswith("." + fn.name) for w in row.writers):
                        unlisted.append(f"{rel}:{node.lineno} {fn.name}: {ast.unparse(node)} =")
                if isinstance(node, ast.Call) and len(node.args) >= 2 and \
                        isinstance(node.args[1], ast.Constant) and node.args[1].value in by_name \
                        and ast.unparse(node.func).endswith("patch.object"):
                    row = by_name[node.args[1].value]
                    if module not in row.patched_in or \
                            ast.unparse(node.args[0]) not in row.patch_targets:
                        unlisted.append(f"{rel}:{node.lineno} {fn.name}: {ast.unparse(node)}")
    assert unlisted == []
