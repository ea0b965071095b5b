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
