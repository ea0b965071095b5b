"""install()'s code cache: what it computes from torch's source, kept on disk.

A warm cache gives the very code a cold one computes; any change of the source
misses; a corrupt, foreign or ill-typed file is rebuilt, never trusted; a folder
that cannot be written still installs."""
import hashlib
import linecache
import marshal
import os

import pytest
import torch

import fxguard
from fxguard import _core
from fxguard.machinery import code_cache, originals


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("FXGUARD_CACHE_DIR", str(folder))
    return folder


def install() -> tuple[dict, dict]:
    """A fresh install(): (status(), what the code cache did in it)."""
    fxguard.uninstall()
    status = fxguard.install()
    return status, status["code_cache"]


def installed_code() -> list:
    """(label, function, new code); a fast reader's code carries its Reader (made
    anew by each install) as a constant on 3.12+: left out of the comparison."""
    def comparable(code):
        return code.replace(co_consts=tuple(c for c in code.co_consts
                                            if not isinstance(c, _core.Reader)))
    return [(p.label, p.owner, comparable(p.value)) for p in originals.applied()
            if p.attr == "__code__"]


def cache_file(folder) -> str:
    files = list((folder / "code").glob("*.bin"))
    assert len(files) == 1, files
    return str(files[0])


def rewrite_payload(path: str, change) -> None:
    """Let ``change`` edit the entries, then store them with a valid checksum."""
    with open(path, "rb") as f:
        data = f.read()
    header = code_cache._HEADER
    entries = marshal.loads(data[len(header) + 32:])
    change(entries)
    payload = marshal.dumps(entries)
    with open(path, "wb") as f:
        f.write(header + hashlib.sha256(payload).digest() + payload)


@pytest.mark.slow
def test_a_warm_cache_gives_the_code_a_cold_one_computed(cache_dir):
    cold, stats = install()
    assert stats["misses"] > 0 and stats["path"].startswith(str(cache_dir))
    cold_code = installed_code()
    warm, stats = install()
    assert stats["misses"] == 0 and stats["hits"] > 0
    assert warm["patch_points"] == cold["patch_points"]
    warm_code = installed_code()
    assert [(label, owner) for label, owner, _ in warm_code] == \
        [(label, owner) for label, owner, _ in cold_code]
    assert [code for _, _, code in warm_code] == [code for _, _, code in cold_code]
    # And the warm code works: a symbolic trace and a compiled call.
    torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    assert torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2)).tolist() == [2, 2]
    assert not fxguard.is_fx_tracing()


@pytest.mark.slow
def test_a_changed_source_file_misses_and_its_old_entries_go(cache_dir, monkeypatch):
    _, cold = install()
    changed = torch.fx.traceback.__file__
    real = linecache.getlines

    def getlines(filename, module_globals=None):
        lines = real(filename, module_globals)
        return lines + ["# a comment added by an upgrade\n"] if filename == changed else lines

    monkeypatch.setattr(linecache, "getlines", getlines)
    _, stats = install()
    assert 0 < stats["misses"] < cold["misses"] and stats["hits"] > 0
    with open(cache_file(cache_dir), "rb") as f:
        entries = marshal.loads(f.read()[len(code_cache._HEADER) + 32:])
    digests = {key[2] for key in entries if key[1] == changed}
    assert len(digests) == 1  # only the text as it is now


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "other header", "empty"])
@pytest.mark.slow
def test_a_corrupt_file_is_rebuilt(cache_dir, damage):
    cold_status, cold = install()
    path = cache_file(cache_dir)
    with open(path, "rb") as f:
        data = f.read()
    damaged = {"truncated": data[:len(data) // 2],
               "flipped byte": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
               "other header": b"fxguard-code-cache 0\n" + data[len(code_cache._HEADER):],
               "empty": b""}[damage]
    with open(path, "wb") as f:
        f.write(damaged)
    status, stats = install()
    assert stats["misses"] == cold["misses"]
    assert status["patch_points"] == cold_status["patch_points"]  # the same rows and outcomes
    _, stats = install()
    assert stats["misses"] == 0  # written again, whole


@pytest.mark.slow
def test_values_of_the_wrong_type_are_recomputed_not_used(cache_dir):
    cold_status, cold = install()
    cold_code = installed_code()

    def poison(entries):
        for key in entries:
            entries[key] = 42 if key[0] != "uses" else ("not", "ints")

    rewrite_payload(cache_file(cache_dir), poison)
    status, stats = install()
    assert stats["misses"] == cold["misses"]
    assert status["patch_points"] == cold_status["patch_points"]
    assert [code for _, _, code in installed_code()] == [code for _, _, code in cold_code]


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="giving a file to another owner needs root")
@pytest.mark.slow
def test_a_file_of_another_owner_is_not_read(cache_dir):
    _, cold = install()
    path = cache_file(cache_dir)
    os.chown(path, 4242, 4242)
    _, stats = install()
    assert stats["misses"] == cold["misses"]


@pytest.mark.slow
def test_a_folder_that_cannot_be_made_still_installs(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FXGUARD_CACHE_DIR", str(blocker / "cache"))
    for _ in range(2):
        status, stats = install()
        assert stats["misses"] > 0
        assert any(r["patched"] for r in status["patch_points"])


@pytest.mark.slow
def test_an_empty_setting_turns_the_cache_off(monkeypatch):
    monkeypatch.setenv("FXGUARD_CACHE_DIR", "")
    assert code_cache.directory() is None
    _, stats = install()
    assert stats["path"] is None and stats["misses"] > 0


def test_location_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("FXGUARD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert code_cache.directory() == str(tmp_path / "xdg" / "fxguard")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert code_cache.directory() == str(tmp_path / "home" / ".cache" / "fxguard")


def test_another_python_or_fxguard_uses_another_file(monkeypatch):
    name = code_cache._file_name()
    monkeypatch.setattr(code_cache, "_fingerprint", lambda: "another fxguard")
    assert code_cache._file_name() != name
    monkeypatch.undo()
    import importlib.util
    monkeypatch.setattr(importlib.util, "MAGIC_NUMBER", b"\x00\x00\r\n")
    assert code_cache._file_name() != name


def test_fxguards_fingerprint_covers_its_own_modules(tmp_path, monkeypatch):
    """Every .py of the package counts: an edited rewrite.py must miss."""
    here = os.path.dirname(code_cache.__file__)
    names = sorted(n for n in os.listdir(here) if n.endswith(".py"))
    assert {"rewrite.py", "per_thread_globals.py", "code_cache.py"} <= set(names)
    before = code_cache._fingerprint()
    real_open = open

    def edited(path, *args, **kwargs):
        f = real_open(path, *args, **kwargs)
        if os.path.basename(str(path)) == "rewrite.py":
            data = f.read() + b"# edited\n"
            f.close()
            import io
            return io.BytesIO(data)
        return f

    monkeypatch.setattr("builtins.open", edited)
    assert code_cache._fingerprint() != before
