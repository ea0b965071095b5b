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
    assert [(path, defs) for path, _, defs in found["flag"]] == [
        ("a.py", ("plain",)), ("a.py", ("augmented",)), ("a.py", ("annotated",)),
        ("a.py", ("unpacked",)), ("a.py", ("unpacked",)), ("a.py", ("inner", "outer"))]
