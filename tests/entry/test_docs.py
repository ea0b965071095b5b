"""What a user reads: README.md, docs/, CHANGELOG.md and benchmarks/RESULTS.md, and the
docstrings and comments of src/, speak of the product only (machines by card and versions; no
issue numbers of ours, no word of how a machine was obtained or how the work was organised),
name files that exist, keep their lines readable, and their generated parts are exactly what
their tools make (nobody edits those by hand)."""
import ast
import importlib.util
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md",
        ROOT / "benchmarks" / "RESULTS.md"]
SOURCES = sorted((ROOT / "src").rglob("*.py"))
LONGEST_LINE = 200

# (pattern, why it has no place in a user's docs).  Upstream references
# (pytorch#123, triton-lang/triton#8491) are the user's business and pass.  Patterns match
# across line breaks (a phrase wrapped over two lines is still caught).
INTERNAL = (
    (r"\bissues? #?\d+", "an issue number of ours"),
    (r"(?<![\w/])#\d+\b", "an issue number of ours (upstream ones read pytorch#NNN)"),
    (r'\bissue "', "an issue of ours by its title"),
    (r"\bthe issue'?s\b", "an issue of ours"),
    (r"\blent\b|\blending\b|\bon loan\b|\bloans?\b", "how a machine was obtained"),
    (r"\bgot an? (?:[AH]\d{3}|GPU|machine)\b|\b(?:was|were) (?:not )?at hand\b",
     "how a machine was obtained"),
    (r"\bdevice time\b|\b(?:time|device|machine|GPU) budget\b|\bbudget left\b",
     "how long a machine was held"),
    (r"\bwarm machine\b|\bheld for \d+ min", "how a machine was held"),
    (r"\bcalls? of (?:one|the same|a|another) machine\b|\b(?:[AH]\d{3}|machine) of "
     r"(?:another|the same|one) call\b|\bdevice calls? (?:still )?pending\b",
     "a call to a machine of ours, not a run of the product"),
    (r"\bdiagnosis (?:windows?|calls?|runs?)\b", "our own way of working"),
    (r"\b(?:of|in|during) (?:this|that|each|the last|the previous|an earlier|a later) stop\b"
     r"|\b(?:this|that|each|last|previous|next|earlier|later) stop's", "our own way of working"),
    (r"\breviewers?\b", "our own way of working"),
    (r"\bmain(?:'s)? (?:of|at|with|build|branch)\b(?! [0-9a-f]{7,}\b)|\b(?:on|was|onto) main\b"
     r"(?! thread)", "our branch, not a release (a commit is named by its id)"),
)
# Words that are ours in the docs but the product's own in src/ (a pytest session, a code
# cache's session): checked in the docs only, where those two are named so.
DOCS_ONLY = (
    (r"(?<!cache's )(?<!code-cache )(?<!pytest )\bsessions?\b", "our own way of working"),
)


def _found(chunks, name, patterns):
    """Matches of patterns in chunks [(line number, text)], read as one text so a phrase
    wrapped over two lines is caught; each is named by the line where it starts."""
    text, starts = "", []
    for n, chunk in chunks:
        starts.append((len(text), n))
        text += " ".join(chunk.split()) + " "
    found = []
    for pattern, why in patterns:
        for m in re.finditer(pattern, text, re.IGNORECASE):
            line = max(n for offset, n in starts if offset <= m.start())
            found.append(f"{name}:{line}: {why}: {m.group(0)!r}")
    return found


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCS, ids=_doc_id)
def test_docs_speak_of_the_product_only(path):
    lines = enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    found = _found(lines, _doc_id(path), INTERNAL + DOCS_ONLY)
    assert not found, "\n".join(found)


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    chunks = [(tok.start[0], tok.string)
              for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                chunks += [(doc.lineno + i, line)
                           for i, line in enumerate(doc.value.value.splitlines())]
    return sorted(chunks)


def test_source_comments_speak_of_the_product_only():
    found = [hit for path in SOURCES
             for hit in _found(_comments_and_docstrings(path), _doc_id(path), INTERNAL)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("words", [
    "seen in issue 32", "see #32", "the machine we were lent", "the session's 30 minutes",
    "device time left", "a warm machine keeps the build", 'a release (issue "Trust")',
    "the issue's goals", "in two calls that each got an H200", "no two-GPU machine was at hand",
    "one 5 s diagnosis window", "No GPU ran (loans paused)", "as the reviewer asked",
    "main of that stop plus the meter", "this stop's edits", "an H200 of another call",
    "two calls of one machine", "the two device calls still pending", "seen in issue\n32",
    "rebase on main of 2026-12-03", "main's build fails it", "the\n  session's 30 minutes"])
def test_the_internal_words_are_caught(words):
    assert _found([(1, words)], "example", INTERNAL + DOCS_ONLY)


@pytest.mark.parametrize("words", [
    "pytorch#186192", "triton-lang/triton#8491", "a lock held shared", "the device's allocator",
    "a warm thread steps at stock's rate", "[Install](#install)", "the recompile budget",
    "records made before this fork stop counting", "when the last one stops",
    "threads that stop compiling", "registered from the main thread", "a diagnosis summary line",
    "GitHub issues list", "a call that also builds", "before: main at 2893738", "a device call",
    "the code-cache session", "the code cache's session exit",
    'torch issues "a deprecation warning"', "two calls that each compile a graph", "the issue is torch's", "main sets it"])
def test_the_products_own_words_pass(words):
    assert not _found([(1, words)], "example", INTERNAL)


# A file a doc names by its path from the repository root (or from docs/, as links do).
# Sources only: reports and outputs (benchmarks/out/, results/*.json) are made by runs.
# CHANGELOG.md is history: it names files as they were then (a rename names the old path).
NAMED = re.compile(r"(?<![\w/.])(?:\.\./)?((?:tests|tools|benchmarks|examples|src|docs|\.ci)"
                   r"/[\w./-]*\.(?:py|pyi|md|sh|c|h|toml))\b")


@pytest.mark.parametrize("path", [d for d in DOCS if d.name != "CHANGELOG.md"], ids=_doc_id)
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
