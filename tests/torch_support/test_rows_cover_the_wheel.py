"""The plan's rows cover every writer in the installed torch wheel.

A per-thread global that some other module assigns as an attribute
(``torch.compiler._is_compiling_flag = True``) must be a listed writer, or
that write would land in a module attribute nobody reads after install().
"""
import ast
import os

import torch

from fxguard.torch_support import rows

ROOT = os.path.dirname(torch.__file__)


def attribute_writes(name: str):
    """(file, line, function) of every ``<expr>.<name> = ...`` in the wheel."""
    for folder, _, files in os.walk(ROOT):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if name not in text:
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            for fn in ast.walk(tree):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in ast.walk(fn):
                        if isinstance(node, ast.Attribute) and node.attr == name and \
                                isinstance(node.ctx, ast.Store):
                            yield os.path.relpath(path, ROOT), node.lineno, fn.name


def test_every_attribute_writer_of_a_per_thread_global_is_listed():
    unlisted = []
    for row in rows.PER_THREAD:
        listed = {w.rsplit(".", 1)[1] for w in row.writers + row.or_writers}
        for path, line, fn in attribute_writes(row.name):
            if fn not in listed:
                unlisted.append(f"{row.where}: {path}:{line} in {fn}()")
    assert unlisted == []


def test_every_row_is_patched_or_says_why():
    import fxguard
    rows = fxguard.install()["patch_points"]
    assert all(r["reason"] == "patched" or r["reason"].startswith(("not needed", "not available",
                                                                   "option off"))
               or r["what"] in KNOWN_HAZARDS for r in rows), rows
    for r in rows:
        if r["what"] in KNOWN_HAZARDS and r["reason"].startswith("not covered"):
            assert "README" in r["reason"], r  # says where the user reads about it


# Rows whose absence on an older torch is a hazard fxguard reports rather than fixes.
KNOWN_HAZARDS = {"eager backward"}  # no force_non_lazy_backward_lowering before torch 2.10
