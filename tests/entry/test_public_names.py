"""What ``dir(fxguard)`` shows a user: the public names, no typing helpers or submodules."""
import fxguard


def test_dir_shows_the_public_names_only():
    names = dir(fxguard)
    assert "Any" not in names and "annotations" not in names
    assert [n for n in names if not n.startswith("__")] == sorted(
        n for n in fxguard.__all__ if not n.startswith("__"))
    for name in fxguard.__all__:
        assert getattr(fxguard, name) is not None
