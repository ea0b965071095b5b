"""Who holds the GIL, per thread and phase, in milliseconds: a benchmark's meter.

``_gil_meter.c``, built here on first use with the C compiler and this Python's
headers (into benchmarks/out/, ignored), reads the GIL from a native thread that
never takes it.  Threads register, then name their phase by index; the meter
sums, per registered thread and phase, the time that thread held the GIL, and
apart the time other threads held it (the autograd worker, compile threads)
and the time it was free.  Its own CPU is reported (a sixth of a core at a 20 µs
nap on an H100 machine's CPU, 2026-12-07).  CPython 3.11-3.13 with the GIL.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "_gil_meter.c")
SLOTS, PHASES = 64, 16


def _built() -> str:
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + sys.version.encode()).hexdigest()[:12]
    out = os.path.join(HERE, "out", f"gil_meter-{digest}.so")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        part = f"{out}.{os.getpid()}"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                        f"-I{sysconfig.get_paths()['include']}", SOURCE, "-o", part, "-lpthread"], check=True)
        os.replace(part, out)
    return out


class GilMeter:
    """One per process: ``register()`` in each thread to follow, ``phase(slot, k)``
    as it moves, ``start()``/``stop()`` around the window (stop returns the sums)."""

    def __init__(self, phase_names: tuple[str, ...]) -> None:
        if len(phase_names) >= PHASES:
            raise ValueError(f"at most {PHASES - 1} phases")
        if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
            raise RuntimeError("the GIL meter needs a build with the GIL")
        path = _built()
        self._lib = ctypes.CDLL(path)           # start/stop: the GIL released meanwhile
        self._register = ctypes.PyDLL(path).meter_register  # the GIL held: reads this thread's state
        self._phases = (ctypes.c_int * SLOTS).in_dll(self._lib, "meter_phase")
        self._held = ((ctypes.c_longlong * PHASES) * SLOTS).in_dll(self._lib, "meter_held_ns")
        self.names = phase_names

    def register(self) -> int:
        slot = self._register()
        if slot < 0:
            raise RuntimeError(f"the GIL meter follows {SLOTS} threads at most")
        return slot

    def phase(self, slot: int, k: int) -> None:
        self._phases[slot] = k

    def start(self, nap_ns: int = 5000) -> None:
        if self._lib.meter_start(ctypes.c_long(nap_ns)) != 0:
            raise RuntimeError("the GIL meter did not start")

    def stop(self) -> dict:
        """Seconds: per slot, each named phase's and "unnamed" (a registered thread
        outside a named phase); "other threads"; "free"; the meter's reads and CPU."""
        self._lib.meter_stop()

        def value(name: str) -> float:
            kind = ctypes.c_int if name == "meter_slots_used" else ctypes.c_longlong
            return kind.in_dll(self._lib, name).value
        slots = [{name: self._held[s][k] / 1e9 for k, name in enumerate(self.names)}
                 | {"unnamed": self._held[s][PHASES - 1] / 1e9} for s in range(int(value("meter_slots_used")))]
        return {"held_s": slots, "other_threads_s": value("meter_other_ns") / 1e9,
                "free_s": value("meter_free_ns") / 1e9, "reads": int(value("meter_reads")),
                "meter_cpu_s": value("meter_cpu_ns") / 1e9}
