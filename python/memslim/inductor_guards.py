"""Guards against Inductor passes that change a program's result, for memslim's backend.

What: a post-grad graph pass (Inductor's post_grad_custom_pre_pass slot, run on the
forward and backward graphs before Inductor's own pattern passes) that rewrites the graphs
Inductor would get wrong into equal ones it gets right; config_patches() puts it in the
slot, after any pass the user set, for every graph memslim's backend hands to compile_fx.

Why: memslim's promise is eager's results, and a split or a rewrite can hand Inductor a
graph that plain torch.compile never built. Found by the differential fuzzer (seed 930021,
2026-11-28): torch 2.14.1's post-grad pattern add(mm(a, b), c) -> addmm(c, a, b) ignores
add's `alpha`, so torch.compile computes `torch.add(x @ w, x, alpha=0.5)` as x @ w + x (plain
torch.compile too: 1.06 off on a 4x8 case). The coupling-chain split made a piece whose
output was such an add, and the outputs came out 0.106 off; the whole graph had escaped the
pattern. The rewrite moves alpha onto the other operand, add(p, q, alpha=k) ->
add(p, mul(q, k)), only where p or q is an mm: Inductor itself lowers a non-unit alpha as
that mul (on GPU as an fma, which is why other adds are left as they are), and the
pattern then fuses mm + (k * c) into an addmm correctly or does not match.
"""

import contextlib

import torch

aten = torch.ops.aten

# The matrix products whose add-with-alpha Inductor's addmm pattern mis-fuses (measured on
# torch 2.14.1: add(mm, c, alpha) and add(c, mm, alpha) wrong; bmm, linear, sub, rsub and
# addmm's own alpha/beta right).
_FUSED_INTO_ADDMM = (aten.mm.default,)


def scale_add_alpha(graph: torch.fx.Graph) -> int:
    """Rewrites each aten.add.Tensor with a non-unit alpha that reads an mm into
    add(p, mul(q, alpha)); returns how many it rewrote."""
    from torch._guards import detect_fake_mode

    count = 0
    for node in list(graph.find_nodes(op="call_function", target=aten.add.Tensor)):
        alpha = node.kwargs.get("alpha", 1)
        if len(node.args) != 2 or (isinstance(alpha, (int, float)) and alpha == 1):
            continue
        p, q = node.args
        if not isinstance(q, torch.fx.Node) or not any(
            isinstance(a, torch.fx.Node) and a.target in _FUSED_INTO_ADDMM for a in (p, q)
        ):
            continue
        with graph.inserting_before(node):
            scaled = graph.call_function(aten.mul.Tensor, (q, alpha))
        val = q.meta.get("val")
        if isinstance(val, torch.Tensor):
            mode = detect_fake_mode([val])
            with mode if mode is not None else contextlib.nullcontext():
                scaled.meta["val"] = aten.mul.Tensor(val, alpha)
        for key in ("stack_trace", "recompute", "ac_graph_id", "original_aten"):
            if key in node.meta:
                scaled.meta[key] = node.meta[key]
        node.args = (p, scaled)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}
        count += 1
    return count


def _pass():
    """The CustomGraphPass (built on call: importing memslim does not import Inductor)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class ScaleAddAlpha(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            scale_add_alpha(graph)

        def uuid(self):
            return ("memslim-scale-add-alpha", 1)

    return ScaleAddAlpha()


def config_patches() -> dict:
    """compile_fx's config_patches that put memslim's guards after the user's post-grad
    pre-passes. As compile_fx's argument, not a config.patch around the call: compile_fx
    applies its patches to the backward's compile too, which AOTAutograd runs lazily at
    the first backward, after the call has returned."""
    from torch._inductor import config

    user = config.post_grad_custom_pre_pass
    user = list(user) if isinstance(user, (list, tuple)) else ([user] if user else [])
    return {"post_grad_custom_pre_pass": pass_slot([*user, _pass()])}


def pass_slot(passes: list):
    """The value for one of Inductor's custom-pass slots running `passes` in order: the
    list itself on torch 2.14, one chaining CustomGraphPass before (the slots take one
    callable there)."""
    return passes if _torch_version() >= (2, 14) else _chain(passes)


def _torch_version() -> tuple:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def _chain(passes):
    """One CustomGraphPass running `passes` in order (torch 2.11's post_grad_custom_pre_pass
    calls its value: a list there raised "'list' object is not callable")."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Chain(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            for p in passes:
                p(graph)

        def uuid(self):
            return ("memslim-chain", *(getattr(p, "uuid", lambda: repr(p))() for p in passes))

    return Chain()
