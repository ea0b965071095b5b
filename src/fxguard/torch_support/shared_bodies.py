"""What several feature modules' swapped bodies share: the dynamo check that
keeps a body out of the way under torch.compile, and a lock around a whole
(short) function."""
from __future__ import annotations

from typing import Any


def _is_dynamo_compiling() -> Any:
    import torch
    return torch.compiler.is_dynamo_compiling


DYNAMO = ("is_dynamo_compiling", _is_dynamo_compiling)

# A lock around the whole (short) function.
LOCKED = """\
    with {ns}.lock:
        return {ns}.inner({call})
"""
