"""Where CUDA-graph drafters spend a step: cuda_graph_drafters.py --probe.

Counts, per thread, what each CUDA-graph tree call became (warm-up, recording,
replay, the compiled code run directly), device syncs, time waiting for the
capture lock, samples every thread's innermost frames, and how often a thread
that wakes finds the GIL taken (its wait for it past a threshold).  For diagnosis:
its own wrapping costs time, so a probed run's figures are not recorded.
"""
from __future__ import annotations

import collections
import sys
import threading
import time

PATHS = ("run_eager", "record_function", "execute_node")


class Probe:
    def __init__(self) -> None:
        import torch
        from torch._inductor import cudagraph_trees as trees
        self.torch, self.trees = torch, trees
        self.counts: collections.Counter = collections.Counter()
        self.seconds: collections.Counter = collections.Counter()
        self.stacks: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self._lock = threading.Lock()
        self._inside = threading.local()
        self._sampling = threading.Event()
        self.reasons: list[str] = []
        self._wrap_manager()
        self._wrap_sync()
        self._time_capture_lock()

    def _add(self, key: tuple, seconds: float) -> None:
        with self._lock:
            self.counts[key] += 1
            self.seconds[key] += seconds

    def _wrap_manager(self) -> None:
        manager = self.trees.CUDAGraphTreeManager
        probe = self
        init = manager.__init__

        def made(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self._probe_maker = threading.current_thread().name  # whose tree it is
        manager.__init__ = made
        for name in PATHS:
            inner = getattr(manager, name)

            def path(self, *args, __inner=inner, __name=name, **kwargs):
                where = "none" if self.current_node is None else type(self.current_node).__name__
                probe._inside.path = f"{__name} after {where}"
                return __inner(self, *args, **kwargs)
            setattr(manager, name, path)
        run = manager._run

        def outer_run(self, *args, **kwargs):
            if getattr(probe._inside, "depth", 0):  # _run calls itself once after ending a path
                return run(self, *args, **kwargs)
            probe._inside.path, probe._inside.depth = "model_directly", 1
            t = time.perf_counter()
            try:
                return run(self, *args, **kwargs)
            finally:
                probe._inside.depth = 0
                probe._add(("tree", threading.current_thread().name, "in tree of",
                            getattr(self, "_probe_maker", "?"), self.mode.name,
                            probe._inside.path), time.perf_counter() - t)
        manager._run = outer_run
        check = self.trees.CUDAGraphNode.check_invariants

        def checked(self, *args, **kwargs):
            status, log = check(self, *args, **kwargs)
            probe._add(("check", threading.current_thread().name, status.name), 0.0)
            if status.name != "SUCCESS" and len(probe.reasons) < 20:  # the first few, in full
                try:
                    probe.reasons.append(str(log())[:600])
                except Exception as e:  # the reason's own logger may want other arguments
                    probe.reasons.append(f"{status.name}: {e!r}")
            return status, log
        self.trees.CUDAGraphNode.check_invariants = checked

    def _wrap_sync(self) -> None:
        cuda = self.torch.cuda
        sync, probe = cuda.synchronize, self

        def synchronize(*args, **kwargs):
            t = time.perf_counter()
            try:
                return sync(*args, **kwargs)
            finally:
                probe._add(("sync", threading.current_thread().name), time.perf_counter() - t)
        cuda.synchronize = synchronize

    def _time_capture_lock(self) -> None:
        try:
            from fxguard.torch_support.cudagraphs import capture_locks
        except ImportError:
            return
        probe = self

        class TimedRLock:
            def __init__(self) -> None:
                self._lock = threading.RLock()

            def acquire(self, blocking=True, timeout=-1):
                t = time.perf_counter()
                got = self._lock.acquire(blocking, timeout)
                probe._add(("capture_lock_wait", threading.current_thread().name), time.perf_counter() - t)
                return got

            def release(self):
                self._lock.release()

            def __enter__(self):
                return self.acquire()

            def __exit__(self, *exc):
                self.release()
        for device in (None, 0):
            capture_locks._locks.setdefault(device, TimedRLock())

    def start_sampling(self, every: float = 0.005) -> None:
        names = {}

        def sample() -> None:
            me = threading.get_ident()
            while not self._sampling.wait(every):
                for t in threading.enumerate():
                    names[t.ident] = t.name
                for ident, frame in sys._current_frames().items():
                    if ident == me:
                        continue
                    parts = []
                    while frame is not None and len(parts) < 4:
                        code = frame.f_code
                        parts.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}:{frame.f_lineno}")
                        frame = frame.f_back
                    self.stacks[names.get(ident, str(ident))][" < ".join(parts)] += 1
        threading.Thread(target=sample, daemon=True, name="probe-sampler").start()

    def start_gil_watch(self, nap: float = 0.0005, late: float = 0.0003) -> None:
        """A thread that naps and counts the wakes whose GIL came late: at wakes spread
        over the window, the share of them is about the share of time the GIL is held."""
        self.gil = {"wakes": 0, "late": 0, "late_s": 0.0}

        def watch() -> None:
            while not self._sampling.is_set():
                t = time.perf_counter()
                time.sleep(nap)
                over = time.perf_counter() - t - nap
                self.gil["wakes"] += 1
                if over > late:
                    self.gil["late"] += 1
                    self.gil["late_s"] += over
        threading.Thread(target=watch, daemon=True, name="probe-gil-watch").start()

    def snapshot(self) -> tuple:
        with self._lock:
            return collections.Counter(self.counts), collections.Counter(self.seconds)

    def report(self, before: tuple, after: tuple) -> dict:
        self._sampling.set()
        counts, seconds = after[0] - before[0], after[1] - before[1]
        rows = sorted(counts)
        return {
            "calls": {" ".join(k): [counts[k], round(seconds[k], 3)] for k in rows},
            "reasons": self.reasons[:20],
            "gil": {**self.gil, "late_s": round(self.gil["late_s"], 3),
                    "share_of_wakes_late": round(self.gil["late"] / max(self.gil["wakes"], 1), 3)}
                   if hasattr(self, "gil") else None,
            "stack_samples": {name: c.most_common(8) for name, c in self.stacks.items()},
            "cudagraph_counters": {k: dict(v) for k, v in self.torch._dynamo.utils.counters.items()
                                   if k in ("inductor", "stats") and v},
        }


def unlocked_true_writes(mode: dict) -> int | None:
    """Writes of triton.cudagraphs=True without dynamo's compile_lock held
    (DRAFTER_WATCH_CONFIG=1's config_events); None where not watched."""
    events = mode.get("config_events")
    if not isinstance(events, list) or any(isinstance(e, str) for e in events):
        return None
    return sum(1 for _, _, value, owned, _ in events if value == "True" and owned is not True)


def summary(mode: dict) -> str:
    """One line of a probed mode: rate, fairness, CPU, the GIL, the phases."""
    if "steps_in_window" not in mode:
        return f"{mode.get('mode')}: {mode.get('status')} {str(mode.get('detail', ''))[-300:]}"
    gil = (mode.get("probe") or {}).get("gil") or {}
    phases = " ".join(f"{k}={v['wall']}/{v['cpu']}" for k, v in mode.get("phase_ms_per_step", {}).items())
    calls = (mode.get("probe") or {}).get("calls", {})
    records = sum(n for k, (n, _) in calls.items() if "record_function" in k)
    return (f"{mode['mode']}: {mode.get('steps_per_s')} steps/s {mode['steps_in_window']} "
            f"fair {mode.get('fairness')} cpu {mode['cpu_s_per_step']} proc {mode.get('process_cpu_s_per_step')} "
            f"gil_late {gil.get('share_of_wakes_late')} records {records} errors {mode['errors']} "
            f"{mode['error_kinds']} graphs {mode['graphs']} | ms wall/cpu {phases}"
            + (f" | unlocked cudagraphs=True writes {unlocked_true_writes(mode)}"
               if "config_events" in mode else "")
            + (f"\nfirst error:\n{mode['first_error'][-3000:]}" if mode.get("first_error") else ""))


if __name__ == "__main__":
    import json
    for path in sys.argv[1:]:
        with open(path) as f:
            report = json.load(f)
        print(path, report.get("args"))
        for mode in report.get("modes", {}).values():
            print(summary(mode))
        print(report.get("ratios"))
