"""Backward graphs compiled with the forward (option eager_backward): a torch
config default changed for every thread."""
from __future__ import annotations

from ..machinery.changes import Outcome
from ..machinery.config_default import ConfigDefault
from .options import Option

ROWS: tuple[ConfigDefault, ...] = (
    # Backward graphs compiled with the forward: the autograd worker never
    # needs compile_lock (the shared-GPU deadlock).
    ConfigDefault("eager backward", "torch._functorch.config.force_non_lazy_backward_lowering",
                  True, option=Option.EAGER_BACKWARD,
                  missing=(Outcome.NOT_COVERED,
                           "this torch has no such switch; a backward first compiled on a GPU's "
                           "autograd worker can deadlock with another thread's compile "
                           "(docs/limits.md)")),
)
