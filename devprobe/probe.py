"""One-off device probes (not committed)."""
import sys, threading, time, traceback
sys.path.insert(0, sys.argv[1] + "/tests")
import torch
import fxguard
from guarded import fresh_function

which = sys.argv[2]
if which == "rng":
    fxguard.install(cuda_graphs_per_thread=True)
    import torch._inductor.cudagraph_trees as trees
    # undo the replay lock so stock behaviour shows
    rg = trees.CUDAGraphNode.run_graph
    swapped = rg.__code__
    rg.__code__ = fxguard.get_original(rg, "__code__")
    HOLD = {"f": None}
    @torch.library.custom_op("probe::held", mutates_args=())
    def held(x: torch.Tensor) -> torch.Tensor:
        h = HOLD["f"]
        if h and torch.cuda.is_current_stream_capturing():
            HOLD["f"] = None; h()
        return x.clone()
    @held.register_fake
    def _(x): return torch.empty_like(x)
    f = torch.compile(fresh_function("def f(x):\n    return held(x) * 2\n", namespace={"held": held}), mode="reduce-overhead")
    g = torch.compile(fresh_function("def g(x):\n    return torch.nn.functional.dropout(x, 0.5, True) * 3\n", name="g", namespace={"torch": torch}), mode="reduce-overhead")
    res, ready, go, done = {}, threading.Event(), threading.Event(), threading.Event()
    def other():
        x = torch.ones(1024, device="cuda")
        with torch.no_grad():
            for _ in range(3): g(x)
        ready.set(); go.wait()
        for name, fn in (("replay with dropout", lambda: g(x).sum().item()),
                         ("eager randn", lambda: torch.randn(4, device="cuda").sum().item()),
                         ("eager dropout", lambda: torch.nn.functional.dropout(x, 0.5, True).sum().item())):
            try: fn(); res[name] = "ok"
            except Exception as e: res[name] = f"{type(e).__name__}: {str(e)[:200]}"
        done.set()
    t = threading.Thread(target=other, daemon=True); t.start(); ready.wait(300)
    def in_capture():
        go.set(); done.wait(60)
    x = torch.ones(4, device="cuda")
    with torch.no_grad():
        f(x); HOLD["f"] = in_capture; f(x)
    t.join(60)
    print("RNG PROBE (torch", torch.__version__, "):", res, flush=True)
elif which == "bwd":
    calls = []
    from fxguard.torch_support import cudagraphs as cg
    o = cg.marking_per_call
    def spy(compiled_graph, unmarked, boxed):
        calls.append((compiled_graph.fx_kwargs.get("is_backward"), compiled_graph.current_callable is not unmarked))
        return o(compiled_graph, unmarked, boxed)
    cg.marking_per_call = spy
    fxguard.install(cuda_graphs_per_thread=True)
    import torch._inductor.output_code as oc
    orig = oc.maybe_handle_backward_generation
    class CpuInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x * 2
        @staticmethod
        def backward(ctx, grad): return (grad.cpu() * 2).to(grad.device)
    import torch._inductor.cudagraph_utils as cu
    logged = []
    origlog = cu.log_cudagraph_skip_and_bump_counter
    def log(msg):
        logged.append(msg[:150]); return origlog(msg)
    cu.log_cudagraph_skip_and_bump_counter = log
    import torch._inductor.codecache  # noqa
    for trial, patch in (("partition off", dict(graph_partition=False)),):
        torch._dynamo.reset()
        f = torch.compile(fresh_function("def f(x):\n    return CpuInBackward.apply(x) + 1\n", namespace={"CpuInBackward": CpuInBackward}), mode="reduce-overhead")
        with torch._inductor.config.patch(**patch):
            x = torch.ones(8, device="cuda", requires_grad=True)
            for _ in range(3):
                f(x).sum().backward()
        import torch._inductor.cudagraph_trees as trees
        m = trees.get_manager(0, create_if_none_exists=False)
        from torch._dynamo.utils import counters
        print("BWD PROBE", trial, "calls", calls, "skips", logged, dict(counters["inductor"]), "pending", m.running_forwards_with_pending_backwards if m else None, flush=True)
