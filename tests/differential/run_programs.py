"""Child process of the differential suite: run programs, write their digests.

    python run_programs.py OUT.json [PROGRAM ...]

Idle daemon threads stay parked on an Event the whole time, as a user's
logger or data loader threads would: two started before ``import torch``
(and so before FXGUARD=1 installs fxguard), one more after the first
program's compile.  Each program starts from a seeded torch and ``random``
and a reset dynamo; its digest holds what it computed, the next draws of
every generator after it, dynamo's counters, and the warnings and WARNING
log records it raised, with addresses and paths normalised.  With
FXGUARD_TEST_BUSY_HELPER=1 a thread computes without pause beside them
(tests/races/test_rng_not_rewound.py).
"""
import hashlib
import json
import logging
import os
import random
import re
import sys
import threading
import time
import warnings

parked = threading.Event()


def park(name: str) -> None:
    threading.Thread(target=parked.wait, name=name, daemon=True).start()


park("idle-before-torch-1")
park("idle-before-torch-2")

import torch  # noqa: E402 - after the first idle threads, on purpose
import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from programs import GPU, PICKED_BY_TIMING, PROGRAMS, Unsupported  # noqa: E402

ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
PATH = re.compile(r"(?<![\w:/.])/(?:[\w.+~-]+/)+([\w.+-]+)")  # a file's name only
DURATION = re.compile(r"\d+(?:\.\d+)?(?= ?(?:s|ms|seconds)\b)")  # durations in messages


def normal(text: str) -> str:
    return DURATION.sub("<t>", PATH.sub(r"\1", ADDRESS.sub("0x?", str(text))))


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    head = f"{t.dtype}{tuple(t.shape)}".encode()
    return head + bytes(t.reshape(-1).view(torch.uint8).tolist())  # tiny: no numpy needed


def outputs(results) -> dict:
    """Exact-bytes hash of the tensors and the graph code a program returned,
    with a short preview to read in a failure message."""
    tensors = [r for r in results if isinstance(r, torch.Tensor)]
    texts = [normal(r) for r in results if isinstance(r, str)]
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(tensor_bytes(t))
    preview = tensors[0].detach().cpu().flatten()[:3].tolist() if tensors else []
    return {"tensors": f"{digest.hexdigest()[:16]} {preview}",
            "graphs": hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]}


def next_draws() -> dict:
    """What each generator draws next (it shows a restore that was skipped or made)."""
    draws = {"torch_cpu": torch.rand(3, dtype=torch.float64).tolist(),
             "python_random": [random.random() for _ in range(3)]}
    if torch.cuda.is_available():
        draws["torch_cuda"] = torch.rand(3, dtype=torch.float64, device="cuda").tolist()
    return draws


def counted(picked_by_timing: tuple) -> dict:
    """Dynamo's counters (frames, graphs, cache hits...; not those naming the
    kernels autotuning picked), recompile reasons and graph-break reasons."""
    from torch._dynamo import utils
    reasons = getattr(utils, "guard_failures", {})
    breaks = getattr(utils, "graph_break_reasons", [])
    kept = {group: {normal(k): v for k, v in sorted(c.items(), key=str)
                    if not str(k).startswith(picked_by_timing)}
            for group, c in sorted(counters.items())}
    return {"counters": {group: c for group, c in kept.items() if c},
            "recompiles": sorted(f"{getattr(code, 'co_name', code)}: {normal(r)}"
                                 for code, rs in reasons.items() for r in rs),
            "graph_breaks": [normal(getattr(b, "reason", b)) for b in breaks]}


def loggers() -> list:
    """The root and every logger that does not pass records on (torch's own)."""
    named = logging.Logger.manager.loggerDict.values()
    return [logging.getLogger()] + [
        lg for lg in named if isinstance(lg, logging.Logger) and not lg.propagate]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(f"{record.name} {record.levelname}: {normal(record.getMessage())}")


def run(name: str) -> dict:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)  # every device's generator
    random.seed(0)
    records = Records()
    listened = loggers()
    for logger in listened:
        logger.addHandler(records)
    start = time.perf_counter()
    digest: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            digest.update(outputs(PROGRAMS[name]()))
        except Unsupported as e:
            return {"unsupported": str(e)}
        except Exception as e:  # noqa: BLE001 - an error is part of the digest
            digest["error"] = f"{type(e).__name__}: {normal(e)}"
        finally:
            for logger in listened:
                logger.removeHandler(records)
    digest.update(next_draws())
    digest.update(counted(PICKED_BY_TIMING[name]))
    digest["warnings"] = [f"{w.category.__name__}: {normal(w.message)} "
                          f"({os.path.basename(w.filename)}:{w.lineno})" for w in caught]
    digest["log"] = records.seen
    digest["seconds"] = round(time.perf_counter() - start, 2)  # reported, never compared
    return digest


def busy_helper() -> threading.Thread:
    """A thread that keeps computing (GIL-released matmuls), drawing nothing,
    until ``parked`` is set: FXGUARD_TEST_BUSY_HELPER=1 starts one before the
    first program."""
    a = torch.ones(256, 256)

    def work() -> None:
        while not parked.is_set():
            a @ a
    thread = threading.Thread(target=work, name="busy-helper", daemon=True)
    thread.start()
    return thread


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:] or list(PROGRAMS)
    busy = busy_helper() if os.environ.get("FXGUARD_TEST_BUSY_HELPER") == "1" else None
    digests = {}
    for name in names:
        if name in GPU and not torch.cuda.is_available():
            digests[name] = {"unsupported": "no CUDA"}
            continue
        digests[name] = run(name)
        if not any(t.name == "idle-after-compile" for t in threading.enumerate()):
            park("idle-after-compile")
    fxguard = sys.modules.get("fxguard")
    result = {"fxguard_installed": bool(fxguard and fxguard.is_installed()),
              "torch": torch.__version__, "programs": digests}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    if busy is not None:  # a thread in torch while the interpreter exits aborts it
        parked.set()
        busy.join(60)


if __name__ == "__main__":
    main()
