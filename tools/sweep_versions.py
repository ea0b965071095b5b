"""Run fxguard on every torch release it claims, and write the sweep table (docs/versions.md).

    python3 tools/sweep_versions.py                 # every version below (hours; GBs)
    python3 tools/sweep_versions.py 2.8.0 2.9.1     # some of them
    python3 tools/sweep_versions.py --doctor-only   # doctor only (about 30 s a version)
    python3 tools/sweep_versions.py --table-only    # rewrite the table from saved results
    python3 tools/sweep_versions.py --doctor-only --ci-log ci.log 2.11.0 ...
                                   # doctor here; the suite's summary from a .ci/run log
    python3 tools/sweep_versions.py --doctor-with PYTHON ...
                                   # doctor under interpreters that already import this
                                   # tree's fxguard (PYTHONPATH as given); installs nothing

Each version gets a venv under ~/.cache/fxguard/venv-torch-<version> (made once;
torch 2.13.0 is the CPU wheel from this machine's disk, the others CUDA wheels
from the index, pip's 2.14.1 cap lifted for newer ones), the working tree
installed into it, then `python -m fxguard doctor` and the whole test suite.
What each printed is summarised in tools/sweep/<version>.json and docs/versions.md's
table between the sweep markers is rewritten from every saved result.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

VERSIONS = ("2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0",
            "2.14.1", "2.15.0")
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tools" / "sweep"
CACHE = Path(os.environ.get("FXGUARD_CI_CACHE", Path.home() / ".cache" / "fxguard"))
BEGIN, END = "<!-- sweep:begin -->", "<!-- sweep:end -->"
PIP_CAP = (2, 14, 1)  # /etc/xdg/pip caps torch here


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def venv_python(version: str) -> Path:
    venv = CACHE / f"venv-torch-{version}"
    python = venv / "bin" / "python"
    check = f"import torch, sys; sys.exit(torch.__version__.split('+')[0] != {version!r})"
    if not (python.exists() and subprocess.run([python, "-c", check]).returncode == 0):
        print(f"== setting up {venv} (downloads torch {version}: several GB)", flush=True)
        subprocess.run(["rm", "-rf", str(venv)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = dict(os.environ)
        if _key(version) > PIP_CAP:
            env.update(PIP_CONFIG_FILE="/dev/null", PIP_CONSTRAINT="")
        subprocess.run([python, "-m", "pip", "install", "-q", f"torch=={version}", "numpy",
                        "pytest", "setuptools"], check=True, env=env)
    subprocess.run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps",
                    str(ROOT)], check=True, stdout=subprocess.DEVNULL)
    return python


def run(python: Path, args: list[str], timeout: float) -> tuple[int, str]:
    try:
        p = subprocess.run([str(python), *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else str(e.stdout or "")


def suites_in_ci_log(text: str) -> dict[str, str]:
    """torch version -> the whole suite's summary line, from a .ci/run log."""
    found, version = {}, None
    for line in text.splitlines():
        m = re.match(r"== torch ([\d.]+): the whole suite", line) or \
            re.match(r"== README test command \(torch ([\d.]+)", line)
        if m:
            version = m.group(1)
        elif version and (m := re.match(r"^=*\s*(\d+ (?:passed|failed).*?) in [\d.]+s", line)):
            found[version], version = m.group(1) + " (in .ci/run)", None
    return found


def sweep_one(version: str, doctor_only: bool) -> dict:
    python = venv_python(version)
    return with_suite(python, version, doctor_result(python, version), doctor_only)


def doctor_result(python: Path | str, version: str | None = None) -> dict:
    """Run doctor under ``python``: what it found (``version`` None: read from doctor)."""
    rc, out = run(Path(python), ["-m", "fxguard", "doctor"], 900)
    build = _find(r"torch (\S+)\s+Python", out)
    version = version or (build or "?").split("+")[0]
    (RESULTS / f"{version}.doctor.txt").write_text(out)
    return {"torch": version, "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
            "python": subprocess.run([str(python), "-c", "import platform; "
                                      "print(platform.python_version())"],
                                     capture_output=True, text=True).stdout.strip(),
            "torch_build": build or version, "doctor_rc": rc,
            "layout": _find(r"torch layout: ([\w-]+)", out),
            "mode": _find(r"mode after install\(\): ([\w-]+)", out),
            "doctor": _find(r"^result: (.*)$", out) or _last_line(out),
            "races": re.findall(r"^([a-z-]+)\s+(yes|no|n/a)\s", out, re.M),
            "not_covered": re.findall(r"^\s+\S.*?\s(\S+)\s+not covered: ", out, re.M)}


def with_suite(python: Path, version: str, result: dict, doctor_only: bool) -> dict:
    """The whole suite, or (doctor only) the last suite run on record, kept with its date."""
    if not doctor_only:
        rc, out = run(python, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], 3600)
        (RESULTS / f"{version}.tests.txt").write_text(out)
        result["tests_rc"] = rc
        result["tests"] = _find(r"^=*\s*(\d+ (?:passed|failed).*?) in [\d.]+s", out) or _last_line(out)
        result["failed"] = re.findall(r"^FAILED (\S+)", out, re.M)
        return result
    saved = RESULTS / f"{version}.json"
    earlier = json.loads(saved.read_text()) if saved.exists() else {}
    result.update({k: earlier[k] for k in ("tests_rc", "tests", "failed") if k in earlier})
    if "tests" in earlier:  # the table gives the date of the suite run it shows
        result["tests_date"] = earlier.get("tests_date", earlier["date"])
    return result


def _find(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text, re.M)
    return m.group(1).strip() if m else None


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def table() -> str:
    """A wrapped list item per saved result, oldest torch first (a table would need lines of
    300 characters)."""
    import textwrap
    items = []
    saved = [json.loads(p.read_text()) for p in RESULTS.glob("*.json")]
    for r in sorted(saved, key=lambda r: _key(r["torch"])):
        probed = [name for name, affected in r.get("races", []) if affected != "n/a"]
        raced = [name for name, affected in r.get("races", []) if affected == "yes"]
        doctor = r["doctor"] if r["doctor_rc"] == 0 else f"exit {r['doctor_rc']}: {r['doctor']}"
        if r.get("not_covered"):
            doctor += f"; not covered: {', '.join(f'`{n}`' for n in r['not_covered'])}"
        text = (f"**{r['torch_build']}**, Python {r['python']}, {r['layout'] or '?'}. "
                f"Doctor ({r['date']}): {doctor}. Stock had {len(raced)} of the {len(probed)} "
                f"races probed{': ' + ', '.join(raced) if raced else ''}. ")
        if "tests" in r:  # counts of the suite as it was on its date: the suite grows
            counts, ci = r["tests"].replace(" (in .ci/run)", ""), " in .ci/run"
            if counts == r["tests"]:
                ci = ""
            kept = re.search(r" \(suite of ([\d-]+)\)$", counts)  # a doctor-only rerun kept it
            when = kept.group(1) if kept else r.get("tests_date", r["date"])
            counts = counts[:kept.start()] if kept else counts
            text += f"Whole suite on {when}{ci}: {counts}"
            if r.get("failed"):  # by test name: files move, names stay
                text += "; failed: " + ", ".join(
                    f"`{f.rsplit('::', 1)[-1]}`" for f in r["failed"][:3])
            text += "."
        else:
            text += "Whole suite: not run."
        items.append(textwrap.fill(text, 100, initial_indent="- ", subsequent_indent="  ",
                                   break_on_hyphens=False, break_long_words=False))
    return "\n".join(items)


def render(text: str) -> str:
    """docs/versions.md's text with the generated list between the sweep markers."""
    if BEGIN not in text or END not in text:
        sys.exit(f"docs/versions.md has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def write_table() -> None:
    doc = ROOT / "docs" / "versions.md"
    doc.write_text(render(doc.read_text()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=VERSIONS)
    parser.add_argument("--doctor-only", action="store_true")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--ci-log", help="a .ci/run log: take the suite's summary from it")
    parser.add_argument("--doctor-with", action="append", default=[], metavar="PYTHON",
                        help="doctor only, under this interpreter as it is (its torch; this "
                             "tree's fxguard where PYTHONPATH puts it first); installs nothing")
    args = parser.parse_args(argv)
    from_ci = suites_in_ci_log(Path(args.ci_log).read_text()) if args.ci_log else {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for python in args.doctor_with:
        result = doctor_result(python)
        result = with_suite(Path(python), result["torch"], result, doctor_only=True)
        (RESULTS / f"{result['torch']}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"== torch {result['torch_build']}: {result['doctor']}", flush=True)
    if args.doctor_with:
        args.table_only = True
    if not args.table_only:
        for version in args.versions:
            print(f"== torch {version}", flush=True)
            result = sweep_one(version, args.doctor_only)
            if version in from_ci:
                result["tests"] = from_ci[version]
            (RESULTS / f"{version}.json").write_text(json.dumps(result, indent=1) + "\n")
            print(f"   doctor: {result['doctor']}; tests: {result.get('tests', '-')}", flush=True)
    write_table()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
