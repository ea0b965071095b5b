"""install()'s options: ``Options`` (the values chosen) and ``Option`` (the name a
row follows).  Below every feature module, which names its rows' option here."""
from __future__ import annotations

import dataclasses
import enum


class Option(enum.Enum):
    """An option a row follows (install()'s keyword of the same name)."""
    BLOCK_MASK_LOCK = "block_mask_lock"
    CONFIG_WINDOW_LOCK = "config_window_lock"
    EAGER_BACKWARD = "eager_backward"
    CONFIG_FOLLOWS_THREAD = "config_follows_thread"
    COMPILE_ONCE = "compile_once"
    CONCURRENT_COMPILES = "concurrent_compiles"
    RNG_NOT_REWOUND = "rng_not_rewound"
    CUDA_GRAPHS_PER_THREAD = "cuda_graphs_per_thread"


@dataclasses.dataclass(frozen=True)
class Options:
    """install()'s options (each documented there), in its keyword order."""
    block_mask_lock: bool = True
    config_window_lock: bool = True
    eager_backward: bool = True
    config_follows_thread: bool = True
    compile_once: bool = True
    concurrent_compiles: bool = False
    rng_not_rewound: bool = True
    cuda_graphs_per_thread: bool = True

    def on(self, option: Option) -> bool:
        return getattr(self, option.value)


OPTIONS = tuple(f.name for f in dataclasses.fields(Options))
OFF_BY_DEFAULT = tuple(f.name for f in dataclasses.fields(Options) if not f.default)
assert OPTIONS == tuple(o.value for o in Option), "Option and Options name the same options"
