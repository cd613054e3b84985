"""What memslim.compile does for transformers' models before Dynamo sees them.

What: `join_loss_graph(model)`: transformers' `loss_function` property logs a warning
through `logger.warning_once` whenever the model's `loss_type` is unset, and Dynamo breaks
the graph there, between the logits and the loss (transformers 5.24, GPT-2 from a config:
`torch._dynamo.explain`: 2 graphs, "step_unsupported"), so no graph holds the loss head
whole and fuse-loss-head cannot take it. Setting `loss_type` to the loss the property picks
anyway ("ForCausalLM") removes the warning and the break (1 graph); nothing else changes.
Returns a note record saying so, or None where there is nothing to do (not a transformers
model, a loss_type or a loss_function of the user's own).
Why here: torch.compile(backend="memslim") cannot reach the model; memslim.compile can.
"""

from __future__ import annotations

from typing import Optional

from .records import Decision, note


def join_loss_graph(model) -> Optional[Decision]:
    if (
        "_loss_function" in getattr(model, "__dict__", {})
        or getattr(model, "loss_type", 1) is not None
    ):
        return None  # not transformers', or its loss is chosen already
    try:
        from transformers import PreTrainedModel
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:
        return None
    if not isinstance(model, PreTrainedModel) or "ForCausalLM" not in LOSS_MAPPING:
        return None
    model.loss_type = "ForCausalLM"
    return note(
        "fuse-loss-head",
        "set loss_type = 'ForCausalLM' on the model (the loss transformers picks when it is "
        "unset; its warning when unset breaks Dynamo's graph between the logits and the loss)",
    )
