"""The fuzz judge's FX leg: torch.export of the program -> memslim.fx.optimize, against eager.

What: `run_fx` (the `fx` stage; MEMSLIM_FUZZ_FX=0 skips it): what torch.export cannot
take, or where the unrewritten exported program already misses the bars, is a limitation
of the leg; a mismatch is judged with the same rounding twins as the TorchScript leg.
Why: one module per stage of runner.py's judge; its shared helpers are runner_common.py.
"""

from __future__ import annotations

import math
import os
from typing import Optional


from runner_common import (
    Reference,
    call,
    compare,
    first_line,
    fp32_twin_ok,
    fp64_twin_same,
    trainable,
)


def run_fx(prog, inputs, R: "Reference", res: Optional[dict] = None):
    """The FX front end's leg: torch.export.export of a fresh module, memslim.fx.optimize, the
    rewritten program's module against eager (the same bars). What torch.export itself cannot
    take, or where the unrewritten exported program already misses the bars, is a
    limitation of this leg, not a memslim failure. Random programs run too: the exported
    module draws its random numbers in eager's order (the base check proves it per
    program), and so must the rewritten one (memslim::activation_dropout draws its mask as
    aten::dropout does); MEMSLIM_FUZZ_FX_RANDOM=0 leaves them to the other legs."""
    import torch
    import memslim.fx

    if R.rand and os.environ.get("MEMSLIM_FUZZ_FX_RANDOM", "1") == "0":
        return ("limitation", "fx", "random program")
    try:
        m3, ins3 = prog.make()
        ep = torch.export.export(m3, tuple(ins3))
        base_mod = ep.module()
        base = call(base_mod, inputs, trainable(base_mod))
    except Exception as e:  # noqa: BLE001
        return ("limitation", "fx-export", first_line(e))
    if compare(R, base, 0) is not None:
        return ("limitation", "fx-export", "the exported program itself misses the bars")
    try:
        memslim.fx.optimize(ep)
        if res is not None:
            res["fx_rewrites"] = sum(d.verdict == "rewrote" for d in memslim.fx.report(ep))
        mod = ep.module()
    except Exception as e:  # noqa: BLE001
        return ("exception", "fx", first_line(e))
    try:
        got = call(mod, inputs, trainable(mod))
    except Exception as e:  # noqa: BLE001
        return ("exception", "fx-run", first_line(e))
    w = compare(R, got, 0)
    if w is None:
        return ("ok", "", "")
    detail = "%s rel %.3g > bar %.3g %s" % (w["tensor"], w["rel"], w.get("bar", 0), w["why"])
    # The same rounding rules as the TorchScript leg, with the twins through this front end.
    if R.dtype == "bfloat16" and math.isfinite(w["rel"]) and fp32_twin_ok(prog, inputs, "fx"):
        return (
            "bf16-rounding",
            "fx",
            detail + "; the fp32 twin of this program (same values) "
            "passes the fp32 bars through memslim.fx.optimize",
        )
    if R.dtype == "float32" and fp64_twin_same(prog, inputs, got, R, "fx"):
        return (
            "fp32-rounding",
            "fx",
            detail + "; the fp64 twin through memslim.fx.optimize "
            "matches fp64 eager within 1e-9, and the fp32 error is within 4 x eager's own "
            "against fp64",
        )
    return ("wrong", "fx", detail)
