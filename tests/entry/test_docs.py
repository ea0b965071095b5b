"""What a user reads: README.md, docs/ and benchmarks/RESULTS.md speak of the product only
(machines by card and versions; no issue numbers of ours, no word of how a machine was
obtained), name files that exist, keep their lines readable, and their generated parts are
exactly what their tools make (nobody edits those by hand)."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "benchmarks" / "RESULTS.md"]
LONGEST_LINE = 200

# (pattern, why it has no place in a user's docs).  Upstream references
# (pytorch#123, triton-lang/triton#8491) are the user's business and pass.
INTERNAL = (
    (r"\bissues? #?\d+", "an issue number of ours"),
    (r"(?<![\w/])#\d+\b", "an issue number of ours (upstream ones read pytorch#NNN)"),
    (r"\blent\b|\blending\b|\bon loan\b", "how a machine was obtained"),
    (r"\bdevice time\b|\bbudget", "how long a machine was held"),
    (r"\bsessions?\b", "our own way of working"),
    (r"\bwarm machine\b|\bheld for \d+ min", "how a machine was held"),
)


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCS, ids=_doc_id)
def test_docs_speak_of_the_product_only(path):
    found = [f"{_doc_id(path)}:{n}: {why}: {m.group(0)!r}"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for pattern, why in INTERNAL
             for m in re.finditer(pattern, line, re.IGNORECASE)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("words", [
    "seen in issue 32", "see #32", "the machine we were lent", "the session's 30 minutes",
    "device time left", "a warm machine keeps the build"])
def test_the_internal_words_are_caught(words):
    assert any(re.search(p, words, re.IGNORECASE) for p, _ in INTERNAL)


@pytest.mark.parametrize("words", [
    "pytorch#186192", "triton-lang/triton#8491", "a lock held shared", "the device's allocator",
    "a warm thread steps at stock's rate", "[Install](#install)"])
def test_the_products_own_words_pass(words):
    assert not any(re.search(p, words, re.IGNORECASE) for p, _ in INTERNAL)


# A file a doc names by its path from the repository root (or from docs/, as links do).
# Sources only: reports and outputs (benchmarks/out/, results/*.json) are made by runs.
NAMED = re.compile(r"(?<![\w/.])(?:\.\./)?((?:tests|tools|benchmarks|examples|src|docs|\.ci)"
                   r"/[\w./-]*\.(?:py|pyi|md|sh|c|h|toml))\b")


@pytest.mark.parametrize("path", DOCS, ids=_doc_id)
def test_files_the_docs_name_exist(path):
    missing = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for name in NAMED.findall(line):
            if not any((base / name).exists() for base in (ROOT, path.parent)):
                missing.append(f"{_doc_id(path)}:{n}: {name}")
    assert not missing, "moved or gone:\n" + "\n".join(missing)


def _outside_generated(text: str) -> list[tuple[int, str]]:
    """(line number, line) of what people write; the tables benchmarks/_results.py
    generates are checked against their tool instead."""
    lines, generated = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(r"<!-- results:\w+:begin -->", line):
            generated = True
        elif re.match(r"<!-- results:\w+:end -->", line):
            generated = False
        elif not generated:
            lines.append((n, line))
    return lines


@pytest.mark.parametrize("path", DOCS, ids=_doc_id)
def test_doc_lines_are_readable(path):
    long = [f"{_doc_id(path)}:{n}: {len(line)} characters"
            for n, line in _outside_generated(path.read_text(encoding="utf-8"))
            if len(line) > LONGEST_LINE]
    assert not long, f"lines over {LONGEST_LINE} characters (a table cell? a list reads " \
                     "better):\n" + "\n".join(long)


def _load(path: Path):
    sys.path.insert(0, str(path.parent))  # benchmarks/_results imports _harness beside it
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


# (doc, its generator, how to rewrite it)
GENERATED = (
    ("docs/rows.md", "tools/rows_table.py", "python3 tools/rows_table.py"),
    ("docs/versions.md", "tools/sweep_versions.py", "python3 tools/sweep_versions.py --table-only"),
    ("benchmarks/RESULTS.md", "benchmarks/_results.py", "python3 benchmarks/_results.py"),
)


@pytest.mark.parametrize("doc, tool, command", GENERATED, ids=[g[0] for g in GENERATED])
def test_generated_parts_are_what_their_tool_makes(doc, tool, command):
    current = (ROOT / doc).read_text(encoding="utf-8")
    assert _load(ROOT / tool).render(current) == current, f"{doc} differs: run {command}"
