"""Eager create_block_mask holds fxguard's block_mask_lock (option
block_mask_lock)."""
from __future__ import annotations

from .. import _core
from ..machinery.wrapped import Swap, Wrapped
from .options import Option
from .shared_bodies import DYNAMO

# Eager mask creation holds block_mask_lock.  Not across a compile: with
# _compile=True a new shape compiles, and one lock would queue every thread's
# masks behind it (dynamo's compile_lock serialises the compile itself).
# Under torch.compile (is_dynamo_compiling() folds to True) the original is
# inlined: no graph break.
BLOCK_MASK = """\
    if _compile or {ns}.is_dynamo_compiling():
        return {ns}.inner({call})
    with {ns}.block_mask_lock:
        return {ns}.inner({call})
"""

ROWS = (
    Wrapped("block-mask lock",
            (Swap("torch.nn.attention.flex_attention.create_block_mask", BLOCK_MASK,
                  (DYNAMO, ("block_mask_lock", lambda: _core.block_mask_lock)),
                  params=("_compile",)),),
            option=Option.BLOCK_MASK_LOCK),
)
