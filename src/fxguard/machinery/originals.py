"""The one record of originals, so undo is exact (gevent.monkey's ``saved``).

Every change fxguard makes to another library is one ``Patch``: set attribute
``attr`` of ``owner`` (an item, for a plain dict owner: a module's globals; a
dict subclass, such as a defaultdict, is changed by attribute) to a new value, remembering
what was there, or that nothing was.  ``revert_all`` undoes them in reverse
order; ``get_original`` answers from the record.
"""
from __future__ import annotations

import importlib
import types
from typing import Any, Callable, NamedTuple

from .changes import Change

# "No attribute there" in a Patch; never handed out (get_original raises instead).
MISSING: Any = type("MISSING", (), {"__repr__": lambda self: "<missing>"})()


class Patch(NamedTuple):
    label: str      # what this patch is for, as status() shows it
    owner: object   # whose attribute changes
    attr: str       # which attribute
    original: Any   # what was there (MISSING if nothing)
    value: Any      # what we put there
    version: tuple | None = None  # a function's (version, defaults, kwdefaults) before __code__ changed


_applied: list[Patch] = []


def resolve_path(path: str) -> tuple[object, str, object]:
    """'pkg.mod.Class.attr' -> (owner, 'attr', current value), importing pkg.mod."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:-1]:
            obj = getattr(obj, name)
        return obj, parts[-1], getattr(obj, parts[-1], MISSING)
    raise ImportError(f"cannot import any module prefix of {path!r}")


def apply(change: Change) -> Patch:
    """Make the change (MISSING deletes), saving what was there.  Recorded
    before it is made: an interrupt in between leaves a record whose revert
    puts back what is there anyway, never a change nothing records."""
    label, owner, attr, value = change
    original = _get(owner, attr)
    kept = next((item for item in _held  # a name uninstall kept bound: fxguard's, not the library's
                 if not item.deletion and item.change.owner is owner and item.change.attr == attr
                 and original is item.change.value), None)
    if kept is not None:
        original = MISSING
    version = None
    if attr == "__code__" and isinstance(owner, types.FunctionType):
        from .. import _core
        version = (_core._function_version(owner), owner.__defaults__, owner.__kwdefaults__)
    patch = Patch(label, owner, attr, original, value, version)
    _applied.append(patch)
    try:
        _put(owner, attr, value)
    except BaseException:
        _forget(patch)
        raise
    if kept is not None:
        _held.remove(kept)
    return patch


def _forget(patch: Patch) -> None:
    """Drop ``patch`` from the record, the newest such first (by identity:
    comparing owners could call anything)."""
    for i in range(len(_applied) - 1, -1, -1):
        if _applied[i] is patch:
            del _applied[i]
            return


def revert(patch: Patch) -> None:
    """Put back what was there.  A name fxguard added that something else has
    replaced since, or a name it deleted that is back (importlib.reload ran the
    module again), is left as it is now."""
    now = _own(patch.owner, patch.attr)
    if (patch.original is MISSING and now is not patch.value) or \
            (patch.value is MISSING and now is not MISSING):
        return
    if patch.original is not MISSING or patch.value is not MISSING:
        _put(patch.owner, patch.attr, patch.original)
        if patch.version is not None and patch.original is not MISSING:
            _restore_version(patch.owner, *patch.version)


def _get(owner: object, attr: str) -> Any:
    return owner.get(attr, MISSING) if type(owner) is dict else getattr(owner, attr, MISSING)


def _own(owner: object, attr: str) -> Any:
    """What owner itself holds (a module's dict: never its PEP 562 __getattr__)."""
    if isinstance(owner, types.ModuleType):
        return vars(owner).get(attr, MISSING)
    return _get(owner, attr)


def _put(owner: object, attr: str, value: Any) -> None:
    """owner.attr = value (owner[attr] for a plain dict); MISSING deletes."""
    if type(owner) is dict:
        if value is MISSING:
            del owner[attr]
        else:
            owner[attr] = value
    elif value is MISSING:
        delattr(owner, attr)
    else:
        setattr(owner, attr, value)


def undo(patch: Patch) -> None:
    """Revert one patch now and forget it (it must be the latest on its attribute)."""
    if any(p is patch for p in _applied):
        revert(patch)
        _forget(patch)


def _restore_version(fn: types.FunctionType, version: int, defaults: Any, kwdefaults: Any) -> None:
    """Setting __code__ clears a function's specialisation version (3.11+), for
    good on 3.13: stock call sites would stay unspecialised after uninstall.
    Give it back, only if the function is again exactly what it described."""
    if fn.__defaults__ is defaults and fn.__kwdefaults__ is kwdefaults:
        from .. import _core
        _core._restore_function_version(fn, version)


Frames = Callable[[list[types.CodeType]], Any]  # settle.live: frames of retired code
InUse = Callable[[Any, set[str]], set[str]]     # settle.names_in_use


class Held(NamedTuple):
    """A name a frame of retired code can still use, so not removed yet:
    a deletion install() defers, or a name uninstall() keeps bound (to
    ``value``, which behaves as stock)."""
    change: Change      # the deletion to make, or (owner, attr, value) kept bound
    frames: Any         # those frames (settle.Live)
    deletion: bool


_held: list[Held] = []


def apply_all(changes: list[Change], frames: Frames | None = None,
              in_use: InUse | None = None) -> None:
    """Apply every change, deletions last.  A deletion of a name that a frame of
    the code the ``__code__`` changes retired can still use waits in ``held``
    (the name stays bound, as that frame expects) until ``sweep`` finds it free."""
    deletions = [c for c in changes if c.value is MISSING]
    retired = []
    for change in changes:
        if change.value is not MISSING:
            patch = apply(change)
            if patch.attr == "__code__" and isinstance(patch.original, types.CodeType):
                retired.append(patch.original)
    found, busy = _in_use_by_frames({change.attr for change in deletions}, retired, frames, in_use)
    for change in deletions:
        if change.attr in busy:
            _held.append(Held(change, found, True))
        else:
            apply(change)


def _in_use_by_frames(names: set[str], retired: list[types.CodeType], frames: Frames | None,
                      in_use: InUse | None) -> tuple[Any, set[str]]:
    """(the frames of retired code naming one of ``names``, the names they use)."""
    if not names or frames is None or in_use is None:
        return None, set()
    found = frames([code for code in retired if _uses(code, names)])
    return found, in_use(found, names)


def _uses(code: types.CodeType, names: set[str]) -> bool:
    """Whether code (or code nested in it) names one of ``names``."""
    return not names.isdisjoint(code.co_names) or any(
        _uses(const, names) for const in code.co_consts if isinstance(const, types.CodeType))


def revert_all(frames: Frames | None = None, in_use: InUse | None = None,
               stand_in: Callable[[Patch], Any] | None = None, down_to: int = 0) -> None:
    """Undo every patch (the newest ones, down to ``down_to`` left), newest
    first; names that fxguard added go last.  One that a frame of the code it had
    swapped in can still use stays bound, to ``stand_in(patch)`` (an object that
    behaves as stock), until ``sweep`` finds it free."""
    if down_to == 0:
        _held[:] = [h for h in _held if not h.deletion]  # deferred deletions: nothing to undo
    # Each patch is forgotten only once reverted: an interrupt leaves the rest
    # recorded, and reverting a patch twice puts back the same object.
    mine = _applied[down_to:]
    added = [p for p in mine if p.original is MISSING and p.value is not MISSING]
    retired = [p.value for p in mine if p.attr == "__code__" and isinstance(p.value, types.CodeType)
               and not any(p is a for a in added)]
    for patch in reversed(mine):
        if not any(patch is a for a in added):
            revert(patch)
            _forget(patch)
    found, busy = _in_use_by_frames({patch.attr for patch in added}, retired, frames, in_use)
    for patch in reversed(added):
        if patch.attr in busy and stand_in is not None:
            value = stand_in(patch)
            _held.append(Held(Change(patch.label, patch.owner, patch.attr, value), found, False))
            _put(patch.owner, patch.attr, value)
        else:
            revert(patch)
        _forget(patch)


def restore_to(owner: object, attr: str, value: Any) -> bool:
    """Where fxguard deleted ``owner.attr``, make ``value`` what undoing it puts
    back (not what was there then); whether such a deletion is in place."""
    for i in range(len(_applied) - 1, -1, -1):
        patch = _applied[i]
        if patch.owner is owner and patch.attr == attr and patch.value is MISSING:
            if patch.original is not MISSING:
                _applied[i] = patch._replace(original=value)
            return True
    return False


def held() -> tuple[Held, ...]:
    return tuple(_held)


def sweep(in_use: InUse) -> None:
    """Finish what waited for frames that have since moved on: make the deferred
    deletions (recorded, so uninstall restores them) and remove the names kept
    bound (where they still hold what uninstall left)."""
    for item in list(_held):
        change = item.change
        if in_use(item.frames, {change.attr}):
            continue
        _held.remove(item)
        if item.deletion:
            if _own(change.owner, change.attr) is not MISSING:
                apply(change)
        elif _own(change.owner, change.attr) is change.value:
            _put(change.owner, change.attr, MISSING)


def applied() -> tuple[Patch, ...]:
    """Every patch in place, oldest first (for status checks and tests)."""
    return tuple(_applied)


def get_original(owner: object, attr: str) -> Any:
    """What ``owner.attr`` was before fxguard first changed it; its current value if
    fxguard never changed it.  AttributeError if there was no such attribute."""
    for patch in _applied:  # the first change to it holds what was there before
        if patch.owner is owner and patch.attr == attr:
            if patch.original is MISSING:
                raise AttributeError(f"{owner!r} had no attribute {attr!r} before fxguard set it")
            return patch.original
    value = _get(owner, attr)
    if value is MISSING:
        raise AttributeError(f"{owner!r} has no attribute {attr!r}")
    return value


def changed_by(owner: object, attr: str) -> set[str]:
    """The labels (rows) of the changes in place to ``owner.attr``."""
    return {p.label for p in tuple(_applied) if p.owner is owner and p.attr == attr}


def is_object_patched(owner: object, attr: str | None = None) -> bool:
    return any(p.owner is owner and (attr is None or p.attr == attr) for p in _applied)
