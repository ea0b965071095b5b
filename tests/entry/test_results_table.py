"""benchmarks/RESULTS.md's tables are what benchmarks/_results.py makes from benchmarks/results/
(so nobody edits them by hand), and every result is named as benchmarks/_harness.py names it.
No torch: the generator reads JSON only."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def results_module():
    sys.path.insert(0, str(BENCHMARKS))  # _results imports _harness from beside it
    try:
        spec = importlib.util.spec_from_file_location("_results", BENCHMARKS / "_results.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_results_md_tables_are_generated_from_results(results_module):
    current = (BENCHMARKS / "RESULTS.md").read_text()
    assert results_module.render(current) == current, \
        "RESULTS.md's tables differ from results/: run python3 benchmarks/_results.py"


def test_every_json_result_is_named_by_the_harness(results_module):
    for path in (BENCHMARKS / "results").glob("*/*.json"):
        match = results_module.NAME.match(path.stem)
        assert match, path.name
        report = json.loads(path.read_text())
        versions = report.get("versions") or report
        assert match["date"] == versions["date"], path
        torch = versions.get("torch")
        expected = f"torch{torch.split('+')[0]}" if torch else f"py{versions['python']}"
        assert match["versions"] == expected, path


def test_a_table_row_links_its_report_relative_to_results_md(results_module):
    table = results_module.table("thread_start")
    assert "](results/thread_start/cpu-torch2.13.0-2026-12-03.json)" in table
    assert str(BENCHMARKS) not in table


def test_readme_figures_are_generated_from_results(results_module):
    """README.md's "What it costs" figures are the newest install_cost report's, with its
    machine, versions, date and a link to it (nobody types them)."""
    readme = results_module.README_MD.read_text()
    assert "<!-- figures:install_cost:begin -->" in readme
    assert results_module.render_readme(readme) == readme, \
        "README.md's figures differ from results/: run python3 benchmarks/_results.py"
    newest = [p for p, r in results_module.reports("install_cost")
              if results_module.FIGURES["install_cost"][0](r)][-1]
    assert f"](benchmarks/results/install_cost/{newest.name})" in " ".join(readme.split())
