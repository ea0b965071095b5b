"""Whether a graph inductor made draws random numbers, read from its output code
(the CUDA-graph rows give a graph that draws nothing no state of its own): every op
of aten's random family reads as drawing, on the CPU's inductor as on a GPU's,
since the decision rests on torch's own tag (``nondeterministic_seeded``) and
inductor's kernels, not on op names."""
import pytest
import torch

from fxguard.torch_support import graph_draws


def compiled(fn, *args):
    """The callable inductor made for fn (what a tree records), after one call."""
    torch._dynamo.reset()
    torch.compile(fn)(*args)
    entry = torch._dynamo.eval_frame._debug_get_cache_entry_list(fn.__code__)[0]
    name = next(n for n in entry.code.co_names if n.startswith("__compiled_fn"))
    return fn.__globals__[name]


X = torch.rand(8, 8)
DRAWING = {
    "dropout": lambda x: torch.nn.functional.dropout(x, 0.5),
    "poisson": lambda x: torch.poisson(x),
    "gamma": lambda x: torch._standard_gamma(x + 1),
    "binomial": lambda x: torch.binomial(x * 10, x),
    "dirichlet": lambda x: torch._sample_dirichlet(x + 1),
    "multinomial": lambda x: torch.multinomial(x, 2),
    "normal_": lambda x: x.clone().normal_(),
    "randperm": lambda x: torch.randperm(8) + x[0].long(),
}
NOT_DRAWING = {"pointwise": lambda x: x.cos() + 1, "matmul": lambda x: x @ x}


@pytest.mark.parametrize("name", DRAWING)
def test_every_random_op_reads_as_drawing(name):
    assert graph_draws.draws(compiled(DRAWING[name], X))


@pytest.mark.parametrize("name", NOT_DRAWING)
def test_kernels_and_deterministic_ops_read_as_drawing_nothing(name):
    assert graph_draws.output_code(compiled(NOT_DRAWING[name], X)) is not None
    assert not graph_draws.draws(compiled(NOT_DRAWING[name], X))


def test_what_cannot_be_read_draws():
    assert graph_draws.draws(lambda: None)

    def call(args):
        return unknown_helper(args)  # noqa: F821 - a name fxguard does not know
    assert graph_draws.draws(call)
