"""fxguard: per-thread trace state for PyTorch.

    import fxguard
    fxguard.install()     # before or after torch.compile: identities are kept

``import fxguard`` does not import torch; ``install()`` does.
"""
from . import interpreter as _interpreter
from ._core import RLock, block_mask_lock, fx_tracing, is_fx_symbolic_tracing, is_fx_tracing
from ._install import __version__, install, is_installed, preview, status, uninstall
from .machinery.originals import get_original, is_object_patched
from .torch_support.config import ConfigSnapshot, config_snapshot
from .torch_support.cuda_thread import cuda_graph_thread
from .torch_support.facts import UnsupportedTorchError

__all__ = [
    "install", "uninstall", "is_installed", "status", "preview", "is_fx_tracing",
    "is_fx_symbolic_tracing", "fx_tracing", "block_mask_lock", "create_block_mask", "RLock",
    "UnsupportedTorchError", "get_original", "is_object_patched", "config_snapshot",
    "ConfigSnapshot", "cuda_graph_thread", "__version__",
]

_interpreter.watch()  # free-threaded builds: note which later imports turn the GIL on


def __getattr__(name: str) -> object:
    # create_block_mask carries torch's signature, so it is made (importing
    # torch) on first access.
    if name == "create_block_mask":
        from ._install import make_create_block_mask
        made = globals()["create_block_mask"] = make_create_block_mask()
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names and the module's own dunders; not the helpers it imports.
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})
