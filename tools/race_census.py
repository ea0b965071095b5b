"""Which race tests are seen failing without their fix, on the torch at hand.

A race test runs with the fix and without it (guard off, stock, the option
off, a lock made a no-op): the variant without it is a strict xfail where the
installed torch races, so an xfail in the report is that variant seen failing.

    python3 tools/race_census.py --paths        # the test files to run
    python3 -m pytest -p no:cacheprovider --junitxml=race.xml $(python3 tools/race_census.py --paths)
    python3 tools/race_census.py race.xml       # the counts, and the tests without a failing variant
    python3 -m pytest ... --runxfail --junitxml=why.xml ...; python3 tools/race_census.py race.xml why.xml

With a second report, run with ``--runxfail`` (each variant without its fix then
fails as a plain test), it prints why each of those variants fails and flags
the ones that fail by a hang guard (a timeout, a thread that did not finish)
rather than by the state the test checks: those are not seen racing.

Race tests: every test in tests/races, and elsewhere every test with a variant
that xfails or a parametrization of guard.both_ways / concurrent_ways (files
that use them or xfail).  One test is a test function: its variants are its
parametrizations, and a strict-xfail test named ``<test>_<more>`` (the lock
made a no-op, in a test of its own) is a variant of ``<test>``.
"""
from __future__ import annotations

import collections
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MARKERS = re.compile(r"\b(both_ways|concurrent_ways)\(|xfail")


def paths() -> list[str]:
    """tests/races, and the other test files that make race variants."""
    found = ["tests/races"]
    for folder, _, files in sorted(os.walk(os.path.join(ROOT, "tests"))):
        rel = os.path.relpath(folder, ROOT)
        if rel.startswith(os.path.join("tests", "races")):
            continue
        for name in sorted(files):
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    if MARKERS.search(f.read()):
                        found.append(os.path.join(rel, name))
    return [p for p in found if not p.endswith("test_thread_failures.py")]  # the guard's own


HANG = re.compile(r"TimeoutError|waited \d+ s|did not finish|still running|= wait\(|\.wait\(")


def outcomes(report: str) -> dict[str, dict[str, tuple[str, str]]]:
    """{'module::test': {variant: (outcome, reason)}} from a junit xml report."""
    tests: dict[str, dict[str, tuple[str, str]]] = collections.defaultdict(dict)
    for case in ElementTree.parse(report).iter("testcase"):
        name, _, variant = case.get("name", "").partition("[")
        key = f"{case.get('classname', '')}::{name}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, reason = ("xfailed" if xfail else "skipped"), child.get("message", "")
            elif child.tag in ("failure", "error"):
                outcome, reason = child.tag, " ".join((child.get("message") or "").split())[:200]
        tests[key][variant.rstrip("]") or "-"] = (outcome, reason)
    return tests


def census(tests: dict[str, dict[str, tuple[str, str]]]) -> dict[str, list]:
    """Race tests sorted into: failing (a variant xfailed, none failed), skipped
    (every variant skipped), passing_only (no variant fails here), broken."""
    merged = {k: dict(v) for k, v in tests.items()}
    for key in sorted(tests, key=len, reverse=True):  # <test>_<more> -> <test>
        for other in tests:
            if key != other and key.startswith(other + "_") and key in merged and \
                    all(o == "xfailed" for o, _ in tests[key].values()):
                merged[other].update({f"{key.split('::')[1]}": v for v in tests[key].values()})
                del merged[key]
                break
    races = {k: v for k, v in merged.items()
             if ".races." in k or any(o == "xfailed" for o, _ in v.values())
             or any(re.search(r"\b(off|stock|option off|no-op lock)\b", var) for var in v)}
    sorted_out: dict[str, list] = {"failing": [], "skipped": [], "passing_only": [], "broken": []}
    for key, variants in sorted(races.items()):
        seen = {o for o, _ in variants.values()}
        if seen & {"failure", "error"}:
            sorted_out["broken"].append((key, variants))
        elif "xfailed" in seen:
            sorted_out["failing"].append((key, variants))
        elif seen == {"skipped"}:
            sorted_out["skipped"].append((key, variants))
        else:
            sorted_out["passing_only"].append((key, variants))
    return sorted_out


def why(tests, runxfail: str) -> int:
    """Each xfailed variant's failure in the --runxfail report; the count of hang-guard ones."""
    failures, hangs = outcomes(runxfail), 0
    print("Why each variant without its fix fails (--runxfail):")
    for key, variants in sorted(tests.items()):
        for variant, (outcome, _) in variants.items():
            if outcome != "xfailed":
                continue
            got, message = failures.get(key, {}).get(variant, ("missing", ""))
            hang = got != "failure" or bool(HANG.search(message))
            hangs += hang
            print(f"  {'HANG-GUARD ' if hang else ''}{key}[{variant}]: {got}: {message[:160]}")
    print(f"{hangs} of them fail by a hang guard or not at all")
    return hangs


def main(argv: list[str]) -> int:
    if argv[1:] == ["--paths"]:
        print(" ".join(paths()))
        return 0
    if len(argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = census(outcomes(argv[1]))
    total = sum(len(v) for v in out.values())
    print(f"{total} race tests: {len(out['failing'])} seen failing without their fix, "
          f"{len(out['passing_only'])} with no variant that fails here, "
          f"{len(out['skipped'])} skipped here, {len(out['broken'])} failing or erroring")
    for what in ("passing_only", "skipped", "broken"):
        for key, variants in out[what]:
            reasons = sorted({f"{o}: {r}" if r else o for o, r in variants.values()})
            print(f"  {what}: {key} [{', '.join(variants)}] {'; '.join(reasons)}")
    for key, variants in out["failing"]:
        skipped = {v: r for v, (o, r) in variants.items() if o == "skipped"}
        if skipped:
            print(f"  seen failing, these variants skipped here: {key} [{', '.join(skipped)}] "
                  f"{'; '.join(sorted(set(skipped.values())))}")
    hangs = why(outcomes(argv[1]), argv[2]) if len(argv) == 3 else 0
    return 1 if out["broken"] or hangs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
