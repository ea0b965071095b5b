"""Which way of running backwards the record should use, from diag reports.

Reads the diag-*.json reports tools/on_device.sh wrote, prints a line per report
(errors, fairness, rate, writes of triton.cudagraphs=True made without dynamo's
compile_lock), and writes the knobs of the cleanest, fairest run as shell exports,
so the next call on a warm machine can record with them without a round trip.
"""
from __future__ import annotations

import glob
import json
import os
import sys

WAYS = ("DRAFTER_FAIR_BACKWARD", "DRAFTER_BACKWARD_HERE")


def unlocked_true_writes(mode: dict) -> int | None:
    events = mode.get("config_events")
    if not isinstance(events, list) or any(isinstance(e, str) for e in events):
        return None  # not watched
    return sum(1 for _, _, value, owned, _ in events if value == "True" and owned is not True)


def main(folder: str, env_file: str) -> int:
    best = None
    for path in sorted(glob.glob(os.path.join(folder, "diag-*.json"))):
        with open(path) as f:
            report = json.load(f)
        for mode in report.get("modes", {}).values():
            writes = unlocked_true_writes(mode)
            knobs = {k: report["args"][k] for k in WAYS if k in report["args"]}
            clean = "status" not in mode and mode.get("errors") == 0 and not writes
            print(os.path.basename(path), mode.get("mode"), "errors", mode.get("errors"),
                  "fairness", mode.get("fairness"), "steps/s", mode.get("steps_per_s"),
                  "unlocked True writes", writes, "clean" if clean else "NOT clean", knobs or "as torch queues")
            if clean and (best is None or (mode["fairness"] or 0) > best[0]):
                best = (mode["fairness"] or 0, knobs)
    if best is None:
        print("no clean run: nothing picked")
        return 1
    with open(env_file, "w") as f:
        f.writelines(f"export {k}={v}\n" for k, v in best[1].items())
    print("picked", best[1] or "as torch queues", "fairness", best[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
