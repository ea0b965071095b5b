"""What a change is, and what install() says about each row of its plan."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple


class Change(NamedTuple):
    """Set ``owner.attr`` (an item, for a plain dict owner) to ``value``; originals.MISSING deletes."""
    label: str      # the row it is for, as status() shows it
    owner: object
    attr: str
    value: Any


class Outcome(enum.Enum):
    """What install() did with a row.  Code branches on this; text is made only
    where it is shown (Row.reason)."""
    PATCHED = "patched"
    OPTION_OFF = "option off"
    NOT_NEEDED = "not needed"          # detail: why this torch or Python has no such race
    NOT_AVAILABLE = "not available"    # detail: where ("on this torch", "on this Python ...")
    NOT_COVERED = "not covered"        # detail: why fxguard stood down (logged as a WARNING)
    WAITING = "waiting"                # detail: the module it is applied on import of


@dataclass(frozen=True)
class Row:
    what: str
    where: str
    outcome: Outcome
    detail: str = ""

    @property
    def patched(self) -> bool:
        return self.outcome is Outcome.PATCHED

    @property
    def reason(self) -> str:
        if self.outcome is Outcome.NOT_AVAILABLE:
            return f"not available {self.detail or 'on this torch'}"
        if self.outcome is Outcome.WAITING:
            return f"waiting for {self.detail} (applied when it is imported)"
        return self.outcome.value + (f": {self.detail}" if self.detail else "")

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "where": self.where, "reason": self.reason,
                "outcome": self.outcome.value, "patched": self.patched}


class NotCovered(RuntimeError):
    """A row's state is used where fxguard cannot follow it: the row stands down."""


def not_available(what: str, where: str, detail: str = "") -> Row:
    return Row(what, where, Outcome.NOT_AVAILABLE, detail)
