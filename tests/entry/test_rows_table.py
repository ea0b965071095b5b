"""docs/rows.md's table is what tools/rows_table.py makes from the rows (nobody edits it by hand)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rows_md_is_generated_from_the_rows():
    spec = importlib.util.spec_from_file_location("rows_table", ROOT / "tools" / "rows_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    current = (ROOT / "docs" / "rows.md").read_text(encoding="utf-8")
    assert module.render(current) == current, \
        "docs/rows.md differs from the rows: run python3 tools/rows_table.py"
