"""Where torch's compiler draws random numbers: the RNG row's contract.

``DRAW_SITES``: compile-time functions that draw real numbers inside a
compile's save/restore windows; the RNG row runs each with the compiling
thread's private generators (rng.py).  ``broken_draw_sites()`` says which of
them this torch lacks or changed (the row then stands down).

``CLASSIFIED``: every call in torch's compiler source (``_dynamo``,
``_inductor``, ``_functorch``, ``_higher_order_ops``) that draws, or runs a
generated benchmark harness that draws (``mod.get_args()``), found on torch
2.11.0, 2.13.0, 2.14.1 and 2.15.0 by ``draw_calls()``, with why it is covered
or why it is not a compile-time draw.  tests/torch_support/test_rng_sites.py
fails on a call of the installed torch that this table does not list.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DrawSite:
    where: str                # 'pkg.mod.Class.function'
    draws: tuple[str, ...]    # names its code (or code nested in it) must still use
    since: tuple[int, int] = (0, 0)  # the first torch (major, minor) that has it


def _torch_version() -> tuple[int, int]:
    import torch
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def draw_sites() -> tuple[DrawSite, ...]:
    """The DRAW_SITES this torch should have."""
    version = _torch_version()
    return tuple(site for site in DRAW_SITES if version >= site.since)


DRAW_SITES = (
    # autotuning's example inputs: its own draws, input_gen_fns (the int4
    # weight-only example weight, custom ops' generators), generate_example_value
    DrawSite("torch._inductor.select_algorithm.AlgorithmSelectorCache.get_inputs",
             ("input_gen_fns", "randn")),
    DrawSite("torch._inductor.select_algorithm.AlgorithmSelectorCache.generate_example_value",
             ("rand_strided",)),
    DrawSite("torch._inductor.fx_passes.pad_mm._should_pad", ("randn", "randn_like")),
    DrawSite("torch._inductor.kernel.custom_op._default_input_gen_fn", ("randn",)),
    DrawSite("torch._inductor.codecache.AotCodeCompiler.compile", ("randint",)),
    DrawSite("torch._inductor.autotune_process.TensorMeta.to_tensor", ("rand_strided",)),
    DrawSite("torch._inductor.fx_passes.node_runtime_estimation."
             "_benchmark_collective_with_cuda_events_impl", ("rand_strided",)),
    DrawSite("torch._inductor.fx_passes.overlap_scheduling.benchmark_node_with_cache_key",
             ("rand_strided",)),
    # generated benchmark harnesses: get_args() draws with rand_strided
    DrawSite("torch._inductor.codegen.triton.TritonScheduling.benchmark_codegened_module",
             ("get_args",)),
    DrawSite("torch._inductor.codegen.triton.TritonScheduling.benchmark_combo_kernel",
             ("get_args",)),
    DrawSite("torch._inductor.codegen.cuda_combined_scheduling.CUDACombinedScheduling."
             "_benchmark_nvgemm_module", ("get_args",), since=(2, 14)),
)


def _source_path(where: str) -> tuple[str, str]:
    """(the file under torch that defines ``where``, its qualname there): read
    from the source, so that checking a site imports nothing."""
    import torch
    parts = where.split(".")[1:]
    root = os.path.dirname(torch.__file__)
    for split in range(len(parts) - 1, 0, -1):
        path = os.path.join(root, *parts[:split]) + ".py"
        if os.path.exists(path):
            return path, ".".join(parts[split:])
    return os.path.join(root, *parts[:-1]) + ".py", parts[-1]


def _block(text: str, qualname: str) -> str | None:
    """The source of ``qualname`` (each part a class or def inside the one
    before), or None where the file has no such nesting."""
    start, indent = 0, -1
    for part in qualname.split("."):
        pattern = re.compile(
            rf"^([ \t]*)(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(part)}\b", re.M)
        for match in pattern.finditer(text, start):
            if len(match.group(1)) > indent:
                break
        else:
            return None
        start, indent = match.end(), len(match.group(1))
    # the block ends at the next def, class or decorator indented no deeper
    # (strings and signatures may reach the margin inside it)
    end = re.compile(rf"^[ \t]{{0,{indent}}}(?:(?:async[ \t]+)?(?:def|class)\b|@)", re.M).search(
        text, start)
    return text[start:end.start() if end else len(text)]


_checked: dict[tuple, list[str]] = {}  # (the sites, their files' size and mtime): the answer


def broken_draw_sites() -> list[str]:
    """The DRAW_SITES this torch lacks, or whose code no longer draws as
    listed, read from torch's source files (nothing is imported).  Each row
    that waits for a module asks again: the answer is kept while no file
    changed (one stat each)."""
    sites = draw_sites()
    paths = sorted({_source_path(site.where)[0] for site in sites})
    key = (repr(sites),) + tuple((p, *_stamp(p)) for p in paths)
    if key not in _checked:
        _checked.clear()
        _checked[key] = _broken(sites)
    return list(_checked[key])


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


def _broken(sites: tuple[DrawSite, ...]) -> list[str]:
    broken = []
    for site in sites:
        path, qualname = _source_path(site.where)
        try:
            with open(path, encoding="utf-8") as f:
                block = _block(f.read(), qualname)
        except OSError:
            block = None
        if block is None:
            broken.append(f"{site.where} missing")
            continue
        lost = [name for name in site.draws if not re.search(rf"\b{name}\b", block)]
        if lost:
            broken.append(f"{site.where} no longer uses {', '.join(lost)}")
    return broken


# -- every draw call in torch's compiler source, classified --------------------------

DRAW_NAMES = frozenset((
    "rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson",
    "rand_like", "randn_like", "randint_like", "normal_", "uniform_", "random_", "bernoulli_",
    "exponential_", "cauchy_", "log_normal_", "geometric_", "rand_strided"))
PACKAGES = ("_dynamo", "_inductor", "_functorch", "_higher_order_ops")

COVERED = "covered: runs inside a DRAW_SITES function, with the private generator"
WRAPPED = "covered: a DRAW_SITES function"
RUNTIME = "runtime: not inside a compile's windows"
TRACED = "traced into a graph (pattern, decomposition or lowering), never run on real tensors"
DEBUG = "debug or repro tool, not part of a compile"
KERNEL = "kernel-language helper (triton/halide), runs inside kernels"

CLASSIFIED: dict[tuple[str, str], str] = {
    ("_inductor/select_algorithm.py", "AlgorithmSelectorCache.get_inputs"): WRAPPED,
    ("_inductor/select_algorithm.py", "AlgorithmSelectorCache.generate_example_value"): WRAPPED,
    ("_inductor/fx_passes/pad_mm.py", "_should_pad"): WRAPPED,
    ("_inductor/fx_passes/pad_mm.py", "_should_pad.<locals>.realize_tensor"): COVERED,
    ("_inductor/kernel/custom_op.py", "_default_input_gen_fn"): WRAPPED,
    ("_inductor/kernel/custom_op.py", "_create_range_input_gen_fn.<locals>.constrained_gen_fn"):
        COVERED + " (an input_gen_fn: get_inputs calls it)",
    ("_inductor/quantized_lowerings.py",
     "register_woq_mm_ops.<locals>.int4pack_mm_cpu.<locals>.get_example_weight"):
        COVERED + " (an input_gen_fn: get_inputs calls it)",
    ("_inductor/codecache.py", "AotCodeCompiler.compile"): WRAPPED,
    ("_inductor/autotune_process.py", "TensorMeta.to_tensor"): WRAPPED,
    ("_inductor/fx_passes/node_runtime_estimation.py",
     "_benchmark_collective_with_cuda_events_impl.<locals>.to_real"): COVERED,
    ("_inductor/fx_passes/overlap_scheduling.py", "benchmark_node_with_cache_key.<locals>.to_real"):
        COVERED,
    ("_inductor/codegen/triton.py", "TritonScheduling.benchmark_codegened_module"): WRAPPED,
    ("_inductor/codegen/triton.py", "TritonScheduling.benchmark_combo_kernel"): WRAPPED,
    ("_inductor/codegen/cuda_combined_scheduling.py",
     "CUDACombinedScheduling._benchmark_nvgemm_module"): WRAPPED,
    ("_dynamo/testing.py", "rand_strided"): "the helper itself: its callers are classified",
    ("_dynamo/testing.py", "standard_test"): "test helper, not part of a compile",
    ("_dynamo/debug_utils.py", "InputReader.storage"): DEBUG + " (minifier inputs)",
    ("_functorch/compilers.py", "get_inputs"): DEBUG + " (functorch's repro compilers)",
    ("_inductor/debug.py", "load_args_and_run_compile_fx_inner.<locals>.handle_tensor"): DEBUG,
    ("_inductor/wrapper_benchmark.py", "benchmark_all_kernels"):
        DEBUG + " (a compiled module's own benchmark entry point)",
    ("_inductor/graph.py", "GraphLowering._compile_to_module_lines"):
        "uncovered: only with config.profile_bandwidth_output (a profiling switch)",
    ("_inductor/fx_passes/misc_patterns.py", "_misc_patterns_init"):
        "uncovered: a CUDA pattern's example input (once per process, first compile; "
        "pattern registration traces, so no mode may be pushed there)",
    ("_functorch/_aot_autograd/runtime_wrappers.py", "initialize_rng_states"):
        RUNTIME + " (graph-safe RNG states are seeded at a compiled graph's first call)",
    ("_inductor/inductor_prims.py", "<lambda>"): RUNTIME + " (inductor prims' eager kernels)",
    ("_inductor/lowering.py", "bernoulli_p"): TRACED + " (inductor's own bernoulli_ lowering)",
    ("_inductor/lowering.py", "philox_rand.<locals>.inner_fn"): TRACED + " (ops.rand IR)",
    ("_inductor/fx_passes/replace_random.py", "replace_randint.<locals>.replacement"): TRACED,
    ("_inductor/decomposition.py", "normal"): TRACED,
    ("_inductor/decomposition.py", "uniform"): TRACED,
    ("_inductor/runtime/halide_helpers.py", "rand"): KERNEL,
    ("_inductor/runtime/triton_helpers.py", "rand4x"): KERNEL,
    ("_inductor/runtime/triton_helpers.py", "randn4x"): KERNEL,
    ("_inductor/kernel/vendored_templates/cutedsl/kernels/cutedsl_grouped_gemm.py",
     "create_tensor_and_stride"): DEBUG + " (the vendored kernel's own example script)",
}
# Pattern functions inside _misc_patterns_init (their names vary by torch): traced.
TRACED_PREFIXES = (
    ("_inductor/fx_passes/misc_patterns.py", "_misc_patterns_init.<locals>.randperm_"),)


def classify(path: str, qualname: str) -> str | None:
    """Why the draw call at (path, qualname) is covered or is no compile-time
    draw; None: nobody classified it."""
    if (path, qualname) in CLASSIFIED:
        return CLASSIFIED[path, qualname]
    if any(path == p and qualname.startswith(q) for p, q in TRACED_PREFIXES):
        return TRACED
    return None


def draw_calls(torch_dir: str) -> list[tuple[str, str, int, str]]:
    """(path under torch, enclosing qualname, line, called name) of every call in
    torch's compiler packages that draws random numbers or runs a generated
    benchmark harness (``<module>.get_args()``); Python's ``random`` and numpy's
    are not torch's generators and are left out."""
    found = []
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(torch_dir, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    found += _calls_in(path, os.path.relpath(path, torch_dir).replace(os.sep, "/"))
    return found


def _calls_in(path: str, rel: str) -> list[tuple[str, str, int, str]]:
    with open(path, encoding="utf-8") as f:
        try:
            tree = ast.parse(f.read())
        except SyntaxError:
            return []
    found = []

    def walk(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, scope + [child.name])
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, scope + [child.name, "<locals>"])
            elif isinstance(child, ast.Lambda):
                walk(child, scope + ["<lambda>", "<locals>"])
            else:
                if isinstance(child, ast.Call) and _draws(child):
                    qual = scope[:-1] if scope and scope[-1] == "<locals>" else scope
                    called = getattr(child.func, "attr", getattr(child.func, "id", "?"))
                    found.append((rel, ".".join(qual) or "<module>", child.lineno, called))
                walk(child, scope)
    walk(tree, [])
    return found


def _draws(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in DRAW_NAMES
    if not isinstance(func, ast.Attribute):
        return False
    base = func.value
    if isinstance(base, ast.Name) and base.id in ("random", "np", "numpy", "self"):
        return False  # Python's or numpy's generators; self.rand(...): a method of its own
    if isinstance(base, ast.Attribute) and base.attr == "random":
        return False  # np.random.*
    # a harness's get_args() takes nothing (typing.get_args(tp) takes a type)
    return func.attr in DRAW_NAMES or (func.attr == "get_args" and not call.args)
