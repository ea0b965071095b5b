"""torch.compile's options without a process-wide config window.

``torch.compile(fn, mode="reduce-overhead")`` (or ``options=...``) asks its
inductor wrapper for ``get_compiler_config()``, at the call of torch.compile
itself, outside dynamo's compile_lock:

    def get_patched_config_dict(config_patches=None):
        with config.patch(config_patches):
            return config.get_config_copy()

Where config is process-wide (torch <= 2.11) that window sets, say,
``triton.cudagraphs = True`` for every thread: a compile elsewhere meanwhile
graphs what it compiles (a block mask, an optimizer step), and two threads'
windows interleave their saves and restores, so the option stays on for good.
Three drafter threads that each call ``torch.compile(model,
mode="reduce-overhead")`` at start-up hit both (docs/cuda-graphs.md).

The row gives the same dictionary without writing config: a copy with the
patches laid over it.  Patches the copy cannot stand for (an aliased or
deleted entry, a form other than a dict) run torch's own window, holding
dynamo's compile_lock, so no compile and no other window overlaps it.
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable

from ..machinery.wrapped import Swap, Wrapped
from .options import Option

WHERE = "torch._inductor.compile_fx.get_patched_config_dict"
# What the row stands for: torch's body, as rewrite.def_body gives it (2.5-2.11).
TORCH_BODY = "with config.patch(config_patches):\n    return config.get_config_copy()"
BODY = """\
    return {ns}.patched_copy({ns}.inner, config_patches)
"""

def patched_copy(original: Callable[[Any], dict], config_patches: Any) -> dict:
    """``get_patched_config_dict(config_patches)``'s result, config untouched."""
    if not config_patches:
        return original(config_patches)  # patch(None) or patch({}) writes nothing
    config = sys.modules["torch._inductor.config"]
    entries = getattr(config, "_config", None)
    if isinstance(config_patches, dict) and isinstance(entries, dict) and all(
            _plain(entries.get(key)) for key in config_patches):
        made = config.get_config_copy()
        made.update((key, copy.deepcopy(value)) for key, value in config_patches.items()
                    if not _forced(entries[key]))  # as config.patch: an env-forced value wins
        return made
    with _compile_lock():
        return original(config_patches)


def _plain(entry: Any) -> bool:
    """An entry whose patch only sets its own value (no alias, not deleted)."""
    return entry is not None and getattr(entry, "alias", None) is None and not getattr(entry, "hide", False)


def _forced(entry: Any) -> bool:
    """An entry an environment variable forces (``Config(env_name_force=...)``):
    reads give that value whatever a patch sets."""
    module = sys.modules.get("torch.utils._config_module")
    unset = getattr(module, "_UNSET_SENTINEL", None)
    force = getattr(entry, "env_value_force", unset)
    return unset is not None and force is not unset


def _compile_lock() -> Any:
    from torch._dynamo import convert_frame  # read at the call: concurrent_compiles replaces it
    return convert_frame.compile_lock


def needed(facts: Any) -> tuple[Any, str] | None:
    """None where the row applies: config process-wide and torch's body the one
    the copy stands for (else the row stands down: torch.compile runs as stock)."""
    from ..machinery import originals, rewrite
    from ..machinery.changes import Outcome
    from ..machinery.wrapped import plain_function
    if facts.config_per_thread:
        return Outcome.NOT_NEEDED, "config per thread"
    fn = plain_function(WHERE)
    if fn is None:
        return Outcome.NOT_AVAILABLE, "on this torch"
    if rewrite.def_body(originals.get_original(fn, "__code__")) != TORCH_BODY:
        return Outcome.NOT_COVERED, "get_patched_config_dict is not the window fxguard knows; runs as stock"
    return None


ROWS = (
    Wrapped("torch.compile options per thread",
            (Swap(WHERE, BODY, (("patched_copy", lambda: patched_copy),), params=("config_patches",)),),
            needed, option=Option.CONFIG_WINDOW_LOCK),
)
