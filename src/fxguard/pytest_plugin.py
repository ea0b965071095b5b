"""pytest plugin (entry point ``pytest11``): ``pytest --fxguard`` installs
fxguard for the session and names the mode in the header.

Without ``--fxguard`` it does nothing: no import of torch, no header line.
Here install() raises on a torch fxguard does not know: the flag was asked for.
"""
from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("fxguard", "fxguard: per-thread torch trace state")
    group.addoption("--fxguard", action="store_true", default=False,
                    help="install fxguard before collecting tests (imports torch)")
    group.addoption("--fxguard-options", default="", metavar="LIST",
                    help="install() options, as in FXGUARD_OPTIONS: block_mask_lock=0,...")


def pytest_configure(config) -> None:
    if not config.getoption("fxguard"):
        return
    import pytest

    import fxguard
    from fxguard.startup import parse_options
    try:
        options = parse_options(config.getoption("fxguard_options"))
    except ValueError as e:
        raise pytest.UsageError(f"--fxguard-options: {e}") from None
    fxguard.install(**options)


def pytest_report_header(config) -> str | None:
    if not config.getoption("fxguard"):
        return None
    import fxguard
    s = fxguard.status()
    return f"fxguard {s['fxguard']}: {s['mode']} (torch {s['torch']}, layout {s['layout']})"
