"""machinery.writers, torch-free: every store of an attribute name inside a def."""
import textwrap

from fxguard.machinery import writers

SOURCE = textwrap.dedent("""
    import m

    m.flag = 0                      # module level: not inside a def

    def plain():
        m.flag = True

    def augmented():
        m.flag += 1

    def annotated():
        m.flag: bool = False

    def unpacked():
        (m.flag, other) = 1, 2
        [m.flag] = [3]

    def outer():
        def inner():
            m.flag = None
        return inner

    def reads():
        print(m.flag, m.flag == 1, m.flag <= 2)
        return {m.flag: 1}
""")


def test_every_kind_of_store_in_a_def_and_no_read(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    (tmp_path / "pkg" / "b.py").write_text("import m\n\ndef reads():\n    return m.flag\n")
    marker = tmp_path / "pkg" / "version.py"
    marker.write_text("v = 1\n")
    found = writers.attribute_writes(str(tmp_path / "pkg"), str(marker), ("flag", "absent"))
    assert found["absent"] == ()
    assert [(path, [name for _, name in scopes]) for path, _, scopes in found["flag"]] == [
        ("a.py", ["plain"]), ("a.py", ["augmented"]), ("a.py", ["annotated"]),
        ("a.py", ["unpacked"]), ("a.py", ["unpacked"]), ("a.py", ["inner", "outer"])]


def _package(tmp_path, files: dict) -> tuple[str, str]:
    root = tmp_path / "pkg"
    root.mkdir(exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    (root / "version.py").write_text("v = 1\n")
    return str(root), str(root / "version.py")


def test_a_package_edited_in_place_is_scanned_again(tmp_path):
    """The scan is cached; a file edited in place (same version.py) must not
    hide a new writer behind the cache."""
    from fxguard.machinery import code_cache
    import os
    root, marker = _package(tmp_path, {"a.py": "import m\n\ndef f():\n    return m.flag\n"})
    with code_cache.session():
        assert writers.attribute_writes(root, marker, ("flag",))["flag"] == ()
        path = os.path.join(root, "a.py")
        with open(path, "a") as f:  # in place: no new file, version.py as it was
            f.write("\ndef g():\n    m.flag = True\n")
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert [w[0] for w in writers.attribute_writes(root, marker, ("flag",))["flag"]] == ["a.py"]


def test_listed_writers_are_matched_by_module_and_qualified_name(tmp_path):
    """A write in another module, or in a def that only shares a listed
    writer's name, is not made by the listed writer."""
    root, marker = _package(tmp_path, {
        "a.py": """
            import m
            class Tracer:
                def trace(self):
                    m.flag = True
                    def closure():
                        m.flag = False
            def other():
                def trace():
                    m.flag = 1
        """,
        "b.py": "import m\n\ndef trace():\n    m.flag = 2\n"})
    found = writers.attribute_writes(root, marker, ("flag",))["flag"]
    missed = writers.unlisted(found, {"pkg.a.Tracer.trace"}, "pkg")
    assert sorted(missed) == ["a.py:10 in pkg.a.other.trace()", "b.py:4 in pkg.b.trace()"]


def _age(root, seconds=3600):
    """Every file and folder under root modified ``seconds`` ago: no listing is racy."""
    import os
    import time
    then = time.time_ns() - seconds * 1_000_000_000
    for folder, _, files in os.walk(root):
        for name in files + [""]:
            os.utime(os.path.join(folder, name) if name else folder, ns=(then, then))


def test_the_cached_listing_is_reused_and_an_edit_in_place_still_seen(tmp_path, monkeypatch):
    """A warm signature stats the listed folders and files without reading a
    folder; a file edited in place (its folder's mtime unchanged) still gives
    another signature, and the scan runs again."""
    from fxguard.machinery import code_cache
    import os
    root, marker = _package(tmp_path, {"a.py": "import m\n\ndef f():\n    return m.flag\n"})
    os.mkdir(os.path.join(root, "sub"))
    with open(os.path.join(root, "sub", "c.py"), "w") as f:
        f.write("x = 1\n")
    _age(root)
    monkeypatch.setenv(code_cache.ENV, str(tmp_path / "cache"))
    with code_cache.session():
        first = writers.tree_signature(root, marker)
        assert writers.attribute_writes(root, marker, ("flag",))["flag"] == ()
    walks = []
    real_walk = os.walk
    monkeypatch.setattr(writers.os, "walk", lambda *a, **k: walks.append(a) or real_walk(*a, **k))
    with code_cache.session():
        assert writers.tree_signature(root, marker) == first == writers.tree_signature(root)
    assert len(walks) == 1  # only the uncached call above listed the tree
    path = os.path.join(root, "sub", "c.py")
    with open(path, "a") as f:  # in place: the folder's mtime stays
        f.write("\ndef g(m):\n    m.flag = True\n")
    with code_cache.session():
        assert writers.tree_signature(root, marker) != first
        assert len(walks) == 1  # the listing was still the tree's
        assert [w[0] for w in writers.attribute_writes(root, marker, ("flag",))["flag"]] == \
            [os.path.join("sub", "c.py")]


def test_a_file_added_in_a_listed_folder_is_listed_again(tmp_path, monkeypatch):
    """A new file changes its folder's mtime: the cached listing is not used."""
    from fxguard.machinery import code_cache
    import os
    root, marker = _package(tmp_path, {"a.py": "x = 1\n"})
    os.mkdir(os.path.join(root, "sub"))
    _age(root)
    monkeypatch.setenv(code_cache.ENV, str(tmp_path / "cache"))
    with code_cache.session():
        assert writers.attribute_writes(root, marker, ("flag",))["flag"] == ()
    with open(os.path.join(root, "sub", "new.py"), "w") as f:
        f.write("def g(m):\n    m.flag = True\n")
    _age(root, 1800)  # not racy: the folder's mtime moved, from one old time to another
    with code_cache.session():
        assert [w[0] for w in writers.attribute_writes(root, marker, ("flag",))["flag"]] == \
            [os.path.join("sub", "new.py")]


def test_a_folder_changed_just_now_is_listed_again_by_the_next_process(tmp_path):
    """Within its mtime's granularity a folder could gain an entry without a new
    mtime: a listing made within two seconds of a change is never trusted."""
    root, _ = _package(tmp_path, {"a.py": "x = 1\n"})
    dirs, stats, files = writers._list_tree(root)
    assert dirs == "." and files == "a.py\0version.py"
    assert stats == writers._RACY and not writers._still_listed(root, (dirs, stats, files))
    _age(root)
    listing = writers._list_tree(root)
    assert listing[1] != writers._RACY and writers._still_listed(root, listing)
