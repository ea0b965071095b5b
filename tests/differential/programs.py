"""Single-thread programs the differential suite runs stock and under fxguard.

Each program is a plain function that builds tiny tensors after the runner has
seeded torch and ``random``, does one kind of compile or trace, and returns
what it computed (tensors, numbers, graph code).  Models are tiny: the suite
runs in CI on a 2-core machine for every supported torch.  A program that
needs a torch feature this torch lacks raises ``Unsupported``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

PROGRAMS: dict = {}
GPU = set()  # programs that need CUDA
# Counters (name prefixes) that tell which kernel autotuning picked: that
# depends on timing, so stock picks differently from run to run.
PICKED_BY_TIMING: dict = {}


class Unsupported(Exception):
    """This torch lacks what the program needs."""


def program(gpu: bool = False, picked_by_timing: tuple = ()):
    def add(fn):
        PROGRAMS[fn.__name__] = fn
        if gpu:
            GPU.add(fn.__name__)
        PICKED_BY_TIMING[fn.__name__] = picked_by_timing
        return fn
    return add


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, 1)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.outer(self.drop(torch.relu(self.inner(x))))


@program()
def training_dropout_checkpoint_recompile():
    """Inductor training: dropout inside an activation-checkpointed block, then a
    new batch size (a recompile; static, as torch 2.11 fails to compile this
    graph with dynamic shapes, stock: "Node mm_1 was invalid, but is output")."""
    from torch.utils.checkpoint import checkpoint
    block = Block()

    def step(x):
        return checkpoint(block, x, use_reentrant=False).square().mean()
    compiled = torch.compile(step, dynamic=False)
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    losses = []
    for batch in (4, 6):
        loss = compiled(torch.randn(batch, 8))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses + [p.detach() for p in block.parameters()]


@program(picked_by_timing=("extern_calls", "cpp_", "select_algorithm_weight_prune"))
def max_autotune_cpu_freezing():
    """The review's repro: max-autotune on CPU with freezing benchmarks on
    random inputs it draws at compile time and sets the generator back.  The
    weights and input are small integers so every gemm backend autotuning may
    pick sums them exactly: the output does not depend on which one won (the
    counters that tell which one did are not compared)."""
    import torch._inductor.config as inductor_config
    model = nn.Linear(16, 16)
    with torch.no_grad():
        model.weight.copy_(torch.randint(-3, 4, (16, 16)).float())
        model.bias.copy_(torch.randint(-3, 4, (16,)).float())
    x = torch.randint(-3, 4, (8, 16)).float()
    with inductor_config.patch(freezing=True, max_autotune_gemm_backends="CPP,ATEN"), \
            torch.no_grad():
        compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
        return [compiled(x), compiled(x + 1)]


@program()
def export_dynamic():
    """torch.export with a dynamic batch, run and decomposed."""
    from torch.export import Dim, export
    model = Block().eval()
    x = torch.randn(4, 8)
    exported = export(model, (x,), dynamic_shapes={"x": {0: Dim("batch", min=2, max=64)}})
    decomposed = exported.run_decompositions()
    module = exported.module()
    return [module(x), module(torch.randn(9, 8)), str(exported.graph_module.code),
            str(decomposed.graph_module.code)]


@program()
def export_non_strict_math_pow_and_max():
    """Non-strict export of a forward that calls math.pow and max (the export
    swaps both while it traces), with a dynamic size; then math.pow as before."""
    import math

    from torch.export import Dim, export
    pow_before = math.pow

    class Scale(nn.Module):
        def forward(self, x):
            return x * math.pow(x.shape[0], 0.5) + max(x.shape[0], 3)

    x = torch.randn(4, 8)
    exported = export(Scale(), (x,), dynamic_shapes={"x": {0: Dim("n", min=2, max=64)}},
                      strict=False)
    return [exported.module()(x), exported.module()(torch.randn(9, 8)),
            str(exported.graph_module.code), str(math.pow is pow_before)]


@program()
def make_fx_symbolic():
    """make_fx in symbolic mode of a function with a random op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        return torch.nn.functional.dropout(torch.tanh(x @ w), 0.5, training=True).sum(0)
    x, w = torch.randn(5, 3), torch.randn(3, 3)
    traced = make_fx(f, tracing_mode="symbolic")(x, w)
    return [traced(x, w), traced(torch.randn(7, 3), w), traced.code]


@program()
def aot_function_graphs():
    """AOT autograd directly: forward and backward graphs through a recording compiler."""
    from functorch.compile import aot_function
    codes = []

    def record(gm, _inputs):
        codes.append(gm.code)
        return gm

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sin().sum()
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    out = aot_function(f, fw_compiler=record, bw_compiler=record)(x, w)
    out.backward()
    return [out.detach(), w.grad] + codes


@program()
def aot_eager_backend_dropout():
    """The aot_eager backend training a dropout model (random ops in the AOT graph)."""
    block = Block()
    compiled = torch.compile(block, backend="aot_eager")
    out = compiled(torch.randn(6, 8)).sum()
    out.backward()
    return [out.detach()] + [p.grad for p in block.parameters()]


@program()
def flex_attention_block_mask():
    """flex attention with a causal block mask from create_block_mask, compiled
    (aot_eager: inductor's CPU flex template costs seconds to build)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        raise Unsupported(str(e)) from e

    def causal(b, h, q, kv):
        return q >= kv
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    mask = create_block_mask(causal, B=None, H=None, Q_LEN=128, KV_LEN=128, device="cpu")
    compiled = torch.compile(flex_attention, backend="aot_eager")
    return [compiled(q, k, v, block_mask=mask), mask.to_dense()]


@program()
def compiled_optimizer_step():
    """A compiled Adam step on a tiny model."""
    model = nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    @torch.compile
    def step():
        opt.step()
    for _ in range(2):
        model(torch.randn(3, 4)).square().sum().backward()
        step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()] + \
        [s for state in opt.state.values() for s in state.values()]


@program()
def symbolic_trace_module():
    """torch.fx.symbolic_trace of a module, its code and its outputs."""
    block = Block()
    traced = torch.fx.symbolic_trace(block)
    x = torch.randn(3, 8)
    return [traced(x), block(x), traced.code]


@program()
def graph_breaks():
    """A compiled function with graph breaks (an explicit one and a data-dependent
    .item()), random ops on both sides of them."""
    def f(x):
        y = torch.sin(x) + torch.rand_like(x)
        torch._dynamo.graph_break()
        if y.sum().item() > 0:
            y = y * 2
        return torch.nn.functional.dropout(y, 0.5) + torch.randn_like(y)
    compiled = torch.compile(f, backend="aot_eager")
    return [compiled(torch.randn(4)), compiled(torch.randn(4)), compiled(torch.randn(5))]


@program()
def random_ops_inductor_dynamic():
    """Random ops inside an inductor graph (inductor's own seeds), then a new
    length: a recompile with a dynamic size."""
    @torch.compile
    def f(x):
        return torch.rand_like(x) + torch.nn.functional.dropout(x, 0.5) + torch.randn(x.shape[0])
    return [f(torch.ones(3)), f(torch.ones(3)), f(torch.ones(5)), f(torch.ones(6))]


@program(gpu=True)
def cuda_graphs_training():
    """CUDA graphs: a reduce-overhead training step with dropout."""
    block = Block().cuda()
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    compiled = torch.compile(block, mode="reduce-overhead")
    losses = []
    for _ in range(4):
        loss = compiled(torch.randn(4, 8, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    return losses + [p.detach() for p in block.parameters()]


@program()
def verify_correctness_random():
    """dynamo's verify_correctness runs the captured graph eagerly and then the
    backend's, compares them, and sets the parameters and generators back
    (checkpoint_params): the draws it made for checking are not the program's.
    The graph draws a little noise that stays within the comparison's tolerance."""
    import torch._dynamo.config as dynamo_config
    linear = nn.Linear(8, 2)

    def f(x):
        return linear(x) + 1e-9 * torch.rand(2)
    with dynamo_config.patch(verify_correctness=True):
        compiled = torch.compile(f, backend="aot_eager")
        return [compiled(torch.randn(5, 8)), compiled(torch.randn(5, 8))]


@program(picked_by_timing=("extern_calls", "cpp_", "select_algorithm_weight_prune"))
def max_autotune_int4_weight_only():
    """The review's finding 3 (2026-12-07): max-autotune on the CPU with an int4
    weight-only matmul draws its example weight (``input_gen_fns``, a
    ``torch.randint``) outside inductor's inner windows, at compile time.  The
    output is integer sums, whichever kernel autotuning picks; the draws after
    it (the digest's next draws) must be stock's."""
    import torch._inductor.config as inductor_config
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        raise Unsupported("no _weight_int4pack_mm_for_cpu")
    if not torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX")):
        # inductor's int4 CPP template (the one that draws) needs AVX512
        raise Unsupported(f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    n, k, group = 64, 64, 32
    w = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w, 1)
    scales_and_zeros = torch.zeros(k // group, n, 2)
    scales_and_zeros[..., 0] = 1.0

    class Int4(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("packed", packed)
            self.register_buffer("scales_and_zeros", scales_and_zeros)

        def forward(self, x):
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, self.packed, group, self.scales_and_zeros)
    x = torch.randint(-3, 4, (8, k)).float()
    with inductor_config.patch(freezing=True, max_autotune_gemm_backends="CPP,ATEN"), \
            torch.no_grad():
        compiled = torch.compile(Int4(), mode="max-autotune-no-cudagraphs")
        return [compiled(x), compiled(x + 1)]
