"""Graph code generation one thread at a time (always on).

Graph.python_code points every node's _repr_fn at its own namespace for the
length of the call and puts back what it found: two threads generating one
graph's code at once (the first calls of a fresh lazy GraphModule, which
compile once hands to every waiting thread together) name nodes from each
other's namespaces (UnboundLocalError in the generated forward, seen on 3.13t
with the GIL off) and leave the nodes' repr pointing at a finished namespace.
Code generation is short and holds no other lock.
"""
from __future__ import annotations

from .. import _core
from ..machinery.wrapped import Swap, Wrapped
from .shared_bodies import LOCKED

ROWS = (
    Wrapped("graph codegen lock",
            (Swap("torch.fx.graph.Graph.python_code", LOCKED, (("lock", _core.RLock),),
                  params=("self",)),)),
)
