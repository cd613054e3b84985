"""The fuzz judge's compile leg: memslim.compile(memory_budget=...) against eager.

What: `run_compile_budget` (the `compile-budget` stage, MEMSLIM_FUZZ_COMPILE_BUDGET=B or
=none; off by default: two Inductor compiles per program), its bar widened by a plain
torch.compile's own drift.
Why: one module per stage of runner.py's judge; its shared helpers are runner_common.py.
"""

from __future__ import annotations

from typing import Optional


from runner_common import Reference, call, compare, first_line, rel_err, trainable


def run_compile_budget(
    prog, inputs, R: "Reference", budget: Optional[float], res: Optional[dict] = None
):
    """memslim.compile(memory_budget=budget)'s leg (MEMSLIM_FUZZ_COMPILE_BUDGET=B, or =none
    for memslim.compile without a budget: the pipeline alone, kept where Inductor's
    partition keeps fewer bytes; off by
    default: two Inductor compiles per program, ~10-30 s on the CPU). Reference: eager,
    with the bar widened by a plain torch.compile of the same program's own drift from
    eager (Inductor rounds differently by itself), or plain torch.compile's call within
    the base bar. Both compiles use fallback_random (Inductor draws with aten's generator,
    in eager's order), so a dropout that a ladder step re-runs in backward must replay
    the forward's mask. The plain compile runs with memslim's Inductor guards (the bar is
    Inductor's rounding, not its bugs). An unreachable budget (BudgetError) is the backend's answer, not
    a failure: "ok", with res["budget"] saying so; what the plain compile cannot take is a
    limitation of this leg."""
    import torch
    import memslim
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fallback_random=True):
        try:
            torch._dynamo.reset()
            m2, _ = prog.make()
            # With memslim's Inductor guards (memslim.inductor_guards): the bar widens by
            # Inductor's rounding, not by an Inductor bug memslim's backend avoids (torch
            # 2.14.1's add+mm->addmm drops add's alpha: plain torch.compile's error would
            # have let any memslim error of that size pass).
            from memslim import inductor_guards

            with inductor_config.patch(inductor_guards.config_patches()):
                base = call(torch.compile(m2), inputs, trainable(m2))
        except Exception as e:  # noqa: BLE001
            return ("limitation", "compile", first_line(e))
        torch._dynamo.reset()
        m3, _ = prog.make()
        records = []
        try:
            c = (
                memslim.compile(m3, memory_budget=budget, strict=True)
                if budget is not None
                else memslim.compile(m3, strict=True)
            )
            got = call(c, inputs, trainable(m3))
            records = memslim.report(c)
        except Exception as e:  # noqa: BLE001
            text = first_line(e)
            if "BudgetError" in str(e):  # inside Dynamo's BackendCompilerFailed
                if res is not None:
                    res["budget"] = "unreachable"
                return ("ok", "", "")
            return ("exception", "compile-budget", text)
        finally:
            torch._dynamo.reset()
    if res is not None:
        notes = [d.text for d in records if d.pass_ == "memory-budget"]
        kept = any(d.pass_ == "inductor-partition" and "rewrites kept" in d.text for d in records)
        # Coupling chains the backend split out and ran through the TorchScript pass.
        res["chains"] = sum(
            d.pass_ == "invertible-couplings" and "-> memslim::coupling_chain" in d.text
            for d in records
        )
        res["budget"] = (
            "rewrites kept"
            if kept
            else "ladder"
            if any("ladder step" in t for t in notes)
            else "pipeline"
            if any("pipeline" in t for t in notes)
            else "met"
            if notes
            else "no graph"
        )
    drift = {k: rel_err(R.eager[k], base[k])[0] for k in R.eager if k in base}
    Rc = Reference(R.dtype, R.eager, drift, [base], R.rand, R.truth, R.sens)
    w = compare(Rc, got, 0)
    if w is None:
        return ("ok", "", "")
    return (
        "wrong",
        "compile-budget",
        "%s rel %.3g > bar %.3g %s" % (w["tensor"], w["rel"], w.get("bar", 0), w["why"]),
    )
