"""Torch-free helpers for the machinery's tests: a module of our own, from source."""
import importlib
import sys
import textwrap
from itertools import count

import pytest

from fxguard.machinery import originals

_names = count()


@pytest.fixture
def source_module(tmp_path, monkeypatch):
    """make(source) -> a module imported from a file (rewrites read its source);
    every change the test applied is undone afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []
    mark = len(originals.applied())

    def make(source: str):
        name = f"fxguard_machinery_probe_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        made.append(name)
        return importlib.import_module(name)

    yield make
    originals.revert_all(down_to=mark)
    for name in made:
        sys.modules.pop(name, None)
