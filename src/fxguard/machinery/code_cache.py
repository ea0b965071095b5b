"""What install() computes from a library's source, kept on disk like ``.pyc``.

install() recompiles functions from the source of the installed torch
(``rewrite.py``): parsing, rewriting and compiling cost seconds, in every
process that installs (``FXGUARD=1`` torchrun workers, DataLoader spawns,
``pytest --fxguard``).  Every result is a pure function of a source file's text
and of the request, so it is cached:

- key: the request (what is asked, of which def: name and first line) and the
  file's name and SHA-256 of its text, so any change of the source misses;
- one file per (Python bytecode magic, fxguard's own code, environment
  ``sys.prefix``), so another Python or fxguard never reads it;
- written atomically (a temporary file, then ``os.replace``), in a folder made
  private to the user; a file that is corrupt (checksum), foreign (another
  owner, another header) or holds values of the wrong type is ignored and
  rebuilt, never trusted;
- a missing or read-only folder works: nothing is cached, install() is slower.

Where: ``$FXGUARD_CACHE_DIR`` if set (empty: no cache), else
``$XDG_CACHE_HOME/fxguard`` (``~/.cache/fxguard``), file ``code/*.bin``.
Clear it with ``rm -r ~/.cache/fxguard/code``.  Knows no torch names.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import linecache
import logging
import marshal
import os
import sys
import tempfile
from typing import Any, Callable, Iterator, TypeVar

from .held_by_frame import on_my_stack

ENV = "FXGUARD_CACHE_DIR"
_HEADER = b"fxguard-code-cache 1\n"
log = logging.getLogger("fxguard")
T = TypeVar("T")


def directory() -> str | None:
    """The cache folder; None when caching is off (``FXGUARD_CACHE_DIR=``)."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        return chosen or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fxguard")


class Session:
    """Results of one install(): what the file held, what was asked now, and
    each source file's text and parse, read once."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.entries: dict[tuple, Any] = _load(path) if path else {}
        self.added = False
        self.digests: dict[str, str] = {}      # filename -> SHA-256 of its text, as read now
        self.trees: dict[str, Any] = {}        # filename -> parsed module (ast), read once
        self.hits = self.misses = 0
        self.owner: Any = None                 # the frame whose with-block it is

    def save(self) -> None:
        if not (self.path and self.added):
            return
        # Drop entries of files whose text changed since (a torch upgrade in this prefix).
        kept = {k: v for k, v in self.entries.items()
                if self.digests.get(k[1], k[2]) == k[2]}
        _store(self.path, kept)


_session: Session | None = None  # set while install() prepares (under its lock)
# The last session's file and counts, for status(): {"path", "hits", "misses"}.
last: dict[str, Any] = {}


@contextlib.contextmanager
def session() -> Iterator[Session]:
    """Cache what is computed inside (nested sessions join the outer one)."""
    global _session
    outer = _session
    if outer is not None and outer.owner is not None and on_my_stack(outer.owner):
        yield outer
        return
    folder = directory()
    s = _session = Session(os.path.join(folder, "code", _file_name()) if folder else None)
    s.owner = sys._getframe(2)  # the with-statement's: a session an interrupt left lapses with it
    try:
        yield s
        s.save()
    finally:
        last.clear()
        last.update(path=s.path, hits=s.hits, misses=s.misses)
        if _session is s:
            _session = None


def source(filename: str) -> tuple[str, str]:
    """(text, SHA-256) of a source file as linecache reads it; ("", "") without one."""
    text = "".join(linecache.getlines(filename))
    s = _session
    if s is not None and filename in s.digests:
        return text, s.digests[filename]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() if text else ""
    if s is not None:
        s.digests[filename] = digest
    return text, digest


def parsed(filename: str, parse: Callable[[str], T]) -> T:
    """parse(text of filename), once per session."""
    s = _session
    if s is not None and filename in s.trees:
        return s.trees[filename]
    tree = parse(source(filename)[0])
    if s is not None:
        s.trees[filename] = tree
    return tree


def memo(kind: str, filename: str, request: tuple, compute: Callable[[], T],
         valid: Callable[[Any], bool]) -> T:
    """compute(), or what it gave before for this request on this file's text.
    ``valid(value)`` checks a cached value's shape: one that fails is recomputed."""
    s = _session
    if s is None:
        return compute()
    text, digest = source(filename)
    if not text:
        return compute()  # no source: let compute() say so
    key = (kind, filename, digest) + request
    value = s.entries.get(key, _ABSENT)
    if value is not _ABSENT and valid(value):
        s.hits += 1
        return value
    s.misses += 1
    value = compute()
    s.entries[key] = value
    s.added = True
    return value


_ABSENT = object()


# -- the file ---------------------------------------------------------------------

def _fingerprint() -> str:
    """fxguard's own code: its version and the text of its Python modules."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def _file_name() -> str:
    key = b"\0".join([importlib.util.MAGIC_NUMBER, str(marshal.version).encode(),
                      sys.prefix.encode(), _fingerprint().encode()])
    tag = sys.implementation.cache_tag or "python"
    return f"{tag}-{hashlib.sha256(key).hexdigest()[:20]}.bin"


def _load(path: str) -> dict[tuple, Any]:
    try:
        with open(path, "rb") as f:
            if hasattr(os, "getuid") and os.fstat(f.fileno()).st_uid != os.getuid():
                log.debug("fxguard code cache %s: not ours, ignored", path)
                return {}
            data = f.read()
    except OSError:
        return {}
    header, checksum, payload = data[:len(_HEADER)], data[len(_HEADER):len(_HEADER) + 32], \
        data[len(_HEADER) + 32:]
    if header != _HEADER or hashlib.sha256(payload).digest() != checksum:
        log.debug("fxguard code cache %s: corrupt or foreign, rebuilt", path)
        return {}
    try:
        entries = marshal.loads(payload)
    except Exception:  # noqa: BLE001  (marshal raises several kinds on bad data)
        return {}
    if not isinstance(entries, dict) or not all(
            isinstance(k, tuple) and len(k) >= 3 and all(isinstance(p, str) for p in k[:3])
            for k in entries):
        return {}
    return entries


def _store(path: str, entries: dict[tuple, Any]) -> None:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        payload = marshal.dumps(entries)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except (OSError, ValueError) as e:  # read-only or full: install() still works
        log.debug("fxguard code cache %s not written: %s", path, e)
