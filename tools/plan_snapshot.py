"""What install() changes (owner, attribute, order, what it puts there) and the
rows it reports, for a set of option choices, as JSON: compared before and after
a change to the plan's structure, which must not change behaviour.

    python tools/plan_snapshot.py > before.json
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import types

MODULES = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "torch.fx.experimental.proxy_tensor",
           "torch.nn.attention.flex_attention", "torch._functorch.aot_autograd", "torch.export",
           "torch._inductor.cudagraph_trees", "torch._higher_order_ops.utils")


def _name(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, types.CodeType):
        return f"code {obj.co_name} names={sorted(obj.co_names)}"
    if isinstance(obj, dict):
        return "dict"
    try:
        qual = getattr(obj, "__qualname__", None)
        mod = getattr(obj, "__module__", None)
    except Exception:  # noqa: BLE001 - an object whose __getattr__ raises KeyError
        qual = mod = None
    if qual is not None:
        return f"{type(obj).__name__} {mod}.{qual}"
    return type(obj).__name__


def snapshot(options: dict) -> dict:
    import fxguard
    from fxguard import _core
    from fxguard.machinery import originals
    fxguard.uninstall()
    status = fxguard.install(**options)
    out = {
        "changes": [[p.label, _name(p.owner), p.attr, _name(p.value)] for p in originals.applied()],
        "rows": [[r["what"], r["where"], r["outcome"], r["reason"]] for r in status["patch_points"]],
        "mode": status["mode"], "workers": status["autograd_workers"],
        "waiting": status["waiting"], "compile_once": status["compile_once"],
        "concurrent": status["concurrent_compiles"],
        "layout": repr(getattr(_core, "_layout", lambda: None)()),
    }
    fxguard.uninstall()
    return out


def main() -> None:
    import logging
    logging.disable(logging.WARNING)
    try:
        from fxguard.torch_support.options import Options
    except ImportError:  # before options.py
        from fxguard.torch_support.rows import Options
    defaults = dataclasses.asdict(Options())
    sets = {"defaults": {}}
    for name, value in defaults.items():
        sets[f"{name}={not value}"] = {name: not value}
    sets["all off"] = {k: False for k in defaults}
    sets["all on"] = {k: True for k in defaults}
    import os
    os.environ.setdefault("FXGUARD_ALLOW_UNTESTED", "concurrent_compiles")
    result = {"torch only, defaults": None}
    import torch  # noqa: F401
    result["torch only, defaults"] = snapshot({})
    for m in MODULES:
        try:
            importlib.import_module(m)
        except ImportError:
            pass
    for label, options in sets.items():
        try:
            result[label] = snapshot(options)
        except Exception as e:  # noqa: BLE001 - a refusal is behaviour too
            result[label] = f"{type(e).__name__}: {e}"
    json.dump(result, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
