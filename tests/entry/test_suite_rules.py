"""The suite's own rules, read from its source:

- a test checks a status row's typed ``outcome``, never the ``reason`` sentence
  made from it (the sentence is for people; its words may change); a check that
  status or doctor *shows* the reason to users is marked ``# shows the reason``;
- no test module imports another: what tests share lives in helper modules
  whose names do not start with ``test_`` (guarded.py, injected_faults.py, ...);
  the imports are read with ast, the reason reads as text (a script a test runs
  in a child interpreter is a string).
"""
import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(TESTS)
SHOWS = "# shows the reason"  # a check of the rendered text, kept on purpose


# r["reason"], r.get("reason"), row.reason
READS_REASON = re.compile(r"""\[\s*(['"])reason\1\s*\]|\.get\(\s*(['"])reason\2|\.reason\b""")


def reason_reads(source: str) -> list[int]:
    """Lines that read a ``reason``, but for those marked ``# shows the reason``."""
    return [n for n, line in enumerate(source.splitlines(), 1)
            if READS_REASON.search(line) and SHOWS not in line]


def imported_test_modules(source: str) -> list[str]:
    """The modules named test_* that ``source`` imports (import, from-import,
    importlib.import_module or __import__ with a literal name)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [node.module] if node.module else []
            names += [alias.name for alias in node.names] if node.level or not node.module else []
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "import_module", "__import__"):
            names.append(node.args[0].value)
    return [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]


def sources():
    for path in sorted(TESTS.rglob("*.py")):
        yield path.relative_to(TESTS), path.read_text(encoding="utf-8")


def test_the_checks_can_fail():
    assert reason_reads('a = r["reason"]\nb = row.reason\nc = r.get("reason")\n'
                        'd = r["outcome"]\ne = r["reason"]  # shows the reason: doctor\n'
                        'f = r["break_reasons"]\ng = pytest.mark.skip(reason="x")\n'
                        "h = '''p[ 'reason' ]'''\n") == [1, 2, 3, 8]
    assert imported_test_modules("import test_a\nfrom test_b import f\nfrom . import test_c\n"
                                 "import importlib\nimportlib.import_module('x.test_d')\n"
                                 "import guarded\nfrom guarded import test_like_helper\n") == \
        ["test_a", "test_b", "test_c", "x.test_d"]


def test_no_test_reads_a_rows_reason():
    found = [f"{path}:{line}" for path, text in sources() if path != THIS  # its own examples
             for line in reason_reads(text)]
    assert found == [], f"read the row's outcome instead (or mark '{SHOWS}'): {found}"


def test_no_test_module_imports_another():
    found = [f"{path}: {name}" for path, text in sources() for name in imported_test_modules(text)]
    assert found == [], f"move what they share into a helper module: {found}"
