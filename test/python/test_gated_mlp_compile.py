"""fuse-gated-mlp under torch.compile(backend="memslim"): the GLU form.

What: an MLP whose g and u are the two halves of one projection (chunk) through the
backend: the record names the form, gradients as eager's (fp32 within 1e-5), saved bytes
below plain torch.compile's (Inductor recomputes silu itself; measured 22,176 B against
Inductor's 25,536 and eager's 32,256).
Why: the backend's pre-dispatch graph keeps aten.chunk with getitems; the pass must see
the halves there as in torch.export's graph.
"""

import torch

import memslim
from test_gated_mlp import GLUStack


def test_compile_glu_chunk_form():
    torch.manual_seed(0)
    model = GLUStack("chunk")
    x = torch.randn(3, 7, 32)
    model(x).square().mean().backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    eager_bytes = memslim.saved_bytes(model, x)
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="memslim")
    compiled(x).square().mean().backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[k], rtol=1e-5, atol=1e-5)
    ours = memslim.saved_bytes(compiled, x)
    assert ours < eager_bytes, (ours, eager_bytes)
    gated = [str(d) for d in memslim.report(compiled) if "fuse-gated-mlp" in str(d)]
    assert sum("rewrote" in r and "the two halves of" in r for r in gated) == 2, gated
    torch._dynamo.reset()
    inductor = memslim.saved_bytes(torch.compile(GLUStack("chunk")), x)
    assert ours < inductor, (ours, inductor)
