"""What a change is, what every kind of row offers prepare(), and what install()
says about each row of its plan."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple


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
    option: Any = None  # the option its row follows (None: always on); prepare() sets it

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
                "outcome": self.outcome.value, "patched": self.patched,
                "option": getattr(self.option, "value", self.option)}


class NotCovered(RuntimeError):
    """A row's state is used where fxguard cannot follow it: the row stands down."""


@dataclass(frozen=True)
class Planned:
    """What planning one row gives: its changes (applied in order), its outcome,
    and its effects, each typed: nothing reaches install() another way."""
    changes: tuple[Change, ...] | list[Change] = ()
    outcome: Outcome = Outcome.PATCHED
    detail: str = ""
    rows: tuple[Row, ...] = ()   # a group of entries: one status row each, instead of the row's own
    also: tuple[Row, ...] = ()   # rows shown after the row's own (a global's fast readers)
    up_front: tuple[Callable[[], None], ...] = ()  # run by install() before any change
    provides: Mapping[str, Any] = field(default_factory=dict)  # values later rows read (needs)
    carries_context: bool = False  # records note their thread's Context


@dataclass(frozen=True)
class Context:
    """What rows are planned with: the library, the options, the per-thread
    globals' planner (what the other rows wrap is the code it leaves), every
    writer of a per-thread name, and what earlier rows provided."""
    facts: Any                                  # what the library and Python are
    options: Any                                # install()'s options (options.Options)
    planner: Any                                # per_thread_globals.Planner
    writes: Mapping[str, tuple] = field(default_factory=dict)  # writers of per-thread names
    provided: Mapping[str, Any] = field(default_factory=dict)  # read-only: earlier rows' provides

    def code_for(self, fn: Any) -> Any:
        """fn's code as the per-thread globals leave it (what a wrapper runs as inner)."""
        return self.planner.code_for(fn)


class RowKind:
    """What prepare() asks of every kind of row: ``what`` and ``where`` (shown
    in status()), ``option`` (None: always on), ``needed(facts)`` (None, or
    (outcome, detail): why this library needs no change), ``required`` (not
    covered means the library is unsupported), ``provides`` and ``needs``
    (names of values a row hands to later rows through Planned.provides, read
    as ``ctx.provided``: a row needing one comes after the row providing it,
    checked by prepare()), ``plan(ctx) -> Planned`` (NotCovered: the row stands
    down), and ``report(outcome, detail)``: its status rows.  A kind is a
    frozen dataclass inheriting this; its fields may override the defaults
    below (``what`` and ``where`` it must give: a dataclass would take a
    default here for theirs)."""
    option: Any = None
    required = False
    provides: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    @staticmethod
    def needed(facts: Any) -> tuple[Outcome, str] | None:
        return None

    def plan(self, ctx: Context) -> Planned:
        raise NotImplementedError

    def report(self, outcome: Outcome, detail: str = "") -> list[Row]:
        return [Row(self.what, self.where, outcome, detail)]


def not_available(what: str, where: str, detail: str = "") -> Row:
    return Row(what, where, Outcome.NOT_AVAILABLE, detail)


class GroupKind(RowKind):
    """A kind whose ``entries`` are planned together (one lock, one rewrite of a
    function that several touch); a status row each.  ``plan_entries(ctx)``
    gives the changes and each entry's (entry, outcome, detail)."""
    entries: tuple = ()

    @property
    def where(self) -> str:
        return self.entries[0].where

    def plan_entries(self, ctx: Context) -> tuple[list[Change], list[tuple[Any, Outcome, str]]]:
        raise NotImplementedError

    def plan(self, ctx: Context) -> Planned:
        changes, outcomes = self.plan_entries(ctx)
        return Planned(changes, rows=tuple(Row(self.what, entry.where, outcome, detail)
                                           for entry, outcome, detail in outcomes))

    def report(self, outcome: Outcome, detail: str = "") -> list[Row]:
        return [Row(self.what, entry.where, outcome, detail) for entry in self.entries]
