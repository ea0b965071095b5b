"""Install on import: right after ``import torch``, install() imports no torch
module; each row whose module comes later is applied when that module is
imported, before the import returns, and ends as a one-step install would.

Each case runs in a fresh interpreter: the suite's own process has imported
the compiler long ago."""
import json
import subprocess
import sys
import textwrap

import pytest

from guarded import child_env

pytestmark = pytest.mark.slow  # minutes: `pytest --full` (CI) runs it

pytest.importorskip("torch")

# Modules whose rows wait after a bare `import torch` (every supported torch).
LATER = ("torch._dynamo", "torch.export._trace", "torch.nn.attention.flex_attention",
         "torch._functorch.config", "torch._inductor.compile_fx", "torch._inductor.cudagraph_trees",
         # the RNG row's draw sites in modules compile_fx does not import
         "torch._inductor.fx_passes.pad_mm", "torch._inductor.fx_passes.node_runtime_estimation",
         "torch._inductor.fx_passes.overlap_scheduling",
         "torch._inductor.codegen.cuda_combined_scheduling")

OUTCOMES = """
def outcomes():
    return {(p["what"], p["where"]): p["outcome"] for p in fxguard.status()["patch_points"]}
"""


def _run(body: str) -> dict:
    """Run body in a fresh interpreter; it prints one JSON line last."""
    code = "import json, sys, threading\nimport torch, fxguard\n" + OUTCOMES + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_install_right_after_import_torch_imports_no_torch_module():
    got = _run("""
        before = set(sys.modules)
        fxguard.install()
        new = sorted(m for m in set(sys.modules) - before if m.startswith("torch"))
        waiting = sorted(k[1] for k, v in outcomes().items() if v == "waiting")
        print(json.dumps({"new": new, "waiting": waiting, "for": fxguard.status()["waiting"]}))
    """)
    assert got["new"] == []
    where = "torch.nn.attention.flex_attention.create_block_mask"
    assert where in got["waiting"] and where in got["for"]["torch.nn.attention.flex_attention"]
    assert sorted(w for wheres in got["for"].values() for w in wheres) == got["waiting"]


def test_rows_applied_on_import_end_as_a_one_step_install():
    imports = "".join(f"import {m}\n" for m in LATER)
    show = "print(json.dumps(sorted(map(list, outcomes().items()))))\n"
    one_step = _run(imports + "fxguard.install()\n" + show)
    on_import = _run("fxguard.install()\n" + imports + show)
    assert not [r for r in one_step if r[1] == "waiting"]
    assert on_import == one_step


def test_a_row_is_in_place_before_the_import_that_brings_its_module_returns():
    got = _run("""
        fxguard.install()
        key = ("block-mask lock", "torch.nn.attention.flex_attention.create_block_mask")
        seen = {}

        def importer():
            from torch.nn.attention.flex_attention import create_block_mask
            seen["after import"] = outcomes()[key]
            seen["swapped"] = create_block_mask.__code__ is not \
                fxguard.get_original(create_block_mask, "__code__")

        t = threading.Thread(target=importer)
        t.start()
        t.join()
        f = torch.compile(lambda x: x + 1, backend="eager")
        results = []

        def call():
            results.append(f(torch.ones(2)).tolist())

        threads = [threading.Thread(target=call) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(json.dumps({**seen, "results": results}))
    """)
    assert got["after import"] == "patched" and got["swapped"]
    assert got["results"] == [[2.0, 2.0]] * 2


def test_threads_keep_their_per_thread_values_when_later_rows_add_slots():
    """torch.export._trace brings three per-thread globals (new slots): a value
    a thread set before keeps, in that thread only."""
    got = _run("""
        fxguard.install()
        import torch.fx.traceback as tb
        inside, imported, out = threading.Event(), threading.Event(), {}

        def keeps_preserving():
            with tb.preserve_node_meta():
                inside.set()
                imported.wait()
                out["thread"] = tb.has_preserved_node_meta()
                import torch.export._trace as trace
                out["thread_new"] = trace._EXPORT_FLAGS

        t = threading.Thread(target=keeps_preserving)
        t.start()
        inside.wait()
        import torch.export._trace
        imported.set()
        t.join()
        out["main"] = tb.has_preserved_node_meta()
        out["row"] = outcomes()[("per-thread global", "torch.export._trace._EXPORT_FLAGS")]
        print(json.dumps(out))
    """)
    assert got == {"thread": True, "thread_new": None, "main": False, "row": "patched"}


def test_uninstall_while_rows_wait_leaves_later_imports_stock():
    got = _run("""
        from fxguard.machinery import originals
        fxguard.install()
        fxguard.uninstall()
        watching = [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "Watcher"]
        import torch._dynamo
        print(json.dumps({"watching": watching, "applied": len(originals.applied()),
                          "installed": fxguard.is_installed()}))
    """)
    assert got == {"watching": [], "applied": 0, "installed": False}


def test_a_failure_on_import_stands_the_rows_down_and_the_import_goes_on():
    got = _run("""
        from fxguard import _core
        from fxguard.machinery import originals
        fxguard.install()
        before = len(originals.applied())

        def broken(*args):
            raise MemoryError("no room")

        _core._extend_layout = broken
        rng = ("compile keeps others' random numbers", "torch.random.set_rng_state")
        waited = rng[1] in fxguard.status()["waiting"]["torch._dynamo"] and outcomes()[rng]
        import torch._dynamo
        rows = outcomes()
        print(json.dumps({"kept": len(originals.applied()) == before, "waited": waited,
                          "waiting now": fxguard.status()["waiting"],
                          "rng": rows[rng],
                          "dynamo": "torch._dynamo" in sys.modules}))
    """)
    assert got["kept"] and got["dynamo"]
    # waited for torch._dynamo; its import failed to apply it: stood down, waits no more
    assert got["waited"] == "waiting" and got["rng"] == "not covered"
    assert "torch._dynamo" not in got["waiting now"]
