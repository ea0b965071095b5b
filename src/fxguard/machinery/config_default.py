"""A config entry's default changed for every thread (a row kind).

For config modules that keep their entries in a ``_config`` dict of objects
with a ``default`` (torch.utils._config_module's).  Assigning the config where
it is per thread would reach the calling thread's context only; a value a user
assigned explicitly still wins, as it should.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import originals
from .changes import Change, Context, Outcome, Planned, RowKind


@dataclass(frozen=True)
class ConfigDefault(RowKind):
    what: str
    where: str                    # 'pkg.config_module.entry'
    value: Any
    option: Any = None  # the option it follows (None: always on)
    missing: tuple[Outcome, str] = (Outcome.NOT_AVAILABLE, "")  # where the entry is absent

    def plan(self, ctx: Context) -> Planned:
        try:
            owner, name, _ = originals.resolve_path(self.where)
        except (ImportError, AttributeError):
            owner = name = None
        entry = getattr(owner, "_config", {}).get(name) if owner is not None else None
        if entry is None or not hasattr(entry, "default"):
            return Planned(outcome=self.missing[0], detail=self.missing[1])
        return Planned([Change(self.what, entry, "default", self.value)])
