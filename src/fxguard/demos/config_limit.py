"""Config that does not follow threads (torch >= 2.12), shown on the installed torch."""
from __future__ import annotations

import threading


def recompile_limit_in_thread(limit: int = 20, shapes: int = 20) -> dict:
    """The calling thread sets torch._dynamo.config.recompile_limit = ``limit``;
    a thread it starts compiles one function for ``shapes`` static shapes.

    Stock torch 2.12+: the thread reads the default limit (8), compiles 8
    graphs and runs the rest uncompiled.  Resets dynamo first.
    """
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    graphs: list[int] = []
    seen: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(1)
        return gm.forward

    def body() -> None:
        seen.append(torch._dynamo.config.recompile_limit)
        compiled = torch.compile(lambda x: x * 2 + 1, backend=counting, dynamic=False)
        for n in range(1, shapes + 1):
            compiled(torch.ones(n))

    errors: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as e:  # reported below
            errors.append(e)

    with torch._dynamo.config.patch(recompile_limit=limit):
        thread = threading.Thread(target=run, name="compiles-in-thread", daemon=True)
        thread.start()
    thread.join(120)
    torch._dynamo.reset()
    if errors:
        raise errors[0]
    if thread.is_alive():
        raise TimeoutError("the compiling thread did not finish")
    n = len(graphs)
    return {"graphs": n, "shapes": shapes, "limit_seen": seen[0], "lost": n < shapes,
            "detail": f"thread: {n} of {shapes} graphs (read limit {seen[0]})"}
