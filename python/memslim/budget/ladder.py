"""Walking memslim's ladders to a memory budget: the compile way's planner.

What: _meet_budget, memory_budget under torch.compile measured on Inductor's own partition
(budget.measure's dry runs): the target, and where the unmodified graph misses it the five
ways in order of the work they add (Inductor's fused re-runs and the light end of the
pieces ladder, torch's knapsack (budget.knapsack), the rest of the pieces ladder, the
pipeline's rewrites, the whole-block ladder), each ladder walked by bisection over its
steps; the records say what was taken, BudgetError the smallest reachable figure.
The ladders themselves are the C++ core's (core/recompute_blocks.h, fx.BlockLadder tags
their steps): this module only measures steps and chooses one.
Why its own module: the choice among the ways is the planner; the backend only hands it
the graph, the ladders and the pipeline's apply().
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from . import BudgetError, budget_note, knapsack, partitioner, plan_cache, target_bytes
from .knapsack import FUSED_RECOMPUTE, TORCH_KNAPSACK
from .measure import Partition, _forget_fx_sources, _partitioned_saved_bytes, shared_joints


@shared_joints()  # a graph's dry runs share its joint trace where only options differ
def _meet_budget(
    aten,
    fakes,
    apply,
    ladder,
    plain,
    budget,
    skip,
    decisions,
    share=None,
    outcome=None,
    cache_key=None,
    value=None,
):
    """memory_budget under torch.compile, measured on Inductor's own partition (a dry
    run, budget.measure; parameters excluded): the target is `budget` of what the partitioner
    keeps for the unmodified graph (a fraction in (0, 1]; as torch's
    activation_memory_budget, a fraction of what plain torch.compile keeps) or `budget`
    bytes. Nothing is rewritten when the unmodified graph meets it. Else the partitioner
    runs with FUSED_RECOMPUTE (dry runs and compile alike), and the ways below are tried
    in order of the work they add; the first that meets the target is taken:
    1. Fused re-runs: the fewer bytes of (a) the unmodified graph under FUSED_RECOMPUTE
       (torch's own first plan under a budget) and (b) that plus the light end of
       `plain`, the pieces ladder over the unmodified graph (core/recompute_blocks.h,
       ApplyAs::Tags: each convolution or matrix product alone, each stretch of norms
       and activations between, priced as recompute tags): its last step that re-runs
       no convolution or matrix product, taken whole. Inductor fuses such re-runs into
       the backward's kernels (they read the kept input where the backward read the
       saved output: no kernel added), so the planner takes all of them at once, as
       torch's partitioner takes its most aggressive min-cut of fusible ops once that
       meets the budget (before 2026-11-27, bisected from step 0: resnet50_frac kept 0.31
       of eager at 0.5, torch.compile 0.10). (b) is measured first; (a) only where (b)
       meets the target or there is no light end (a dry run less).
    2. Torch's own knapsack (_torch_knapsack): what torch.compile does with
       activation_memory_budget at the user's fraction, taken where its measured
       bytes meet the target (so memslim never keeps more than torch.compile at the
       same budget where torch's plan meets the target), else at the largest smaller
       fraction whose plan meets it. Its solver picks the re-runs (matrix products
       too) at the least estimated time, where the ladder below is greedy per byte:
       resnet50 at 0.25 kept 58.6-58.7 MB both, torch's at x1.06 of eager's step, the
       ladder's at x1.32 (2026-11-27). Below the user's fraction: _cheaper_ladder_step.
    3. The rest of `plain` (steps re-running convolutions and matrix products, the
       cheapest per byte first): the first step meeting the target.
    4. The pipeline's rewrites alone (memslim's own ops decompose into aten in the
       joint graph and keep about what Inductor keeps without them, which is why the
       ladders over the unmodified graph come first).
    5. `ladder`, the whole-block ladder (ApplyAs::Op's prices) over the graph the
       pipeline left: slower per byte, but it reaches further (the pieces' greedy stops
       once the kept bytes are the whole predicted backward peak).
    A later way is taken only where the earlier cannot reach the target, so its bytes
    are below everything the earlier reaches: a smaller budget never keeps more. Way 2
    is the exception, its probes depend on the fraction: there the bytes are monotone
    where torch's knapsack keeps fewer bytes at a smaller fraction (its own size
    estimate is monotone; the measured storages are what bench/memory_budget.py checks;
    a smaller budget's fraction is at most a larger one's). On a
    ladder: the first step whose measured bytes meet the target, found by bisection
    over the steps (each probe is one dry-run partition), then back while the step
    before also meets it. Where measured bytes fall along a ladder, a smaller budget
    takes a later step (a recomputed dropout keeps the generator's state, 5 KB on the
    CPU, so on tiny graphs they can rise by that much along it). Returns whether the
    graph was rewritten and the partitioner options to compile it with; raises
    BudgetError naming the smallest reachable figure (its `reachable`: those bytes).
    share: the graph's target as a function of its unmodified bytes (a model's target
    shared among its graphs, budget.model), where `budget` is the model's. outcome: a dict
    given the graph's figures: "before", "target" and "kept" (the measured bytes of the
    plan taken). cache_key: the graph's key in the plan cache (plan_cache.key; None: no
    cache): a plan found there is replayed without a dry run, one made is stored.
    value: what a plan is judged by against the target, a function of its dry run
    (budget.measure.Partition); None: its saved bytes. A step-peak target
    (budget.model.StepPeak) judges the graph's share of the step's predicted peak,
    which is not monotone along a ladder (re-runs add working memory in backward):
    there the walk finds the ladder's least value first (_Probes.walk)."""
    outcome = {} if outcome is None else outcome

    entry = plan_cache.lookup(cache_key) if cache_key else None
    partitioner.replay_only(entry is not None)  # (NeedsPlanning in the replay-only pass)
    before = (
        Partition.of(entry["before"], entry.get("profile"))
        if entry
        else _partitioned_saved_bytes(aten, fakes, skip)
    )
    target = share(before) if share is not None else target_bytes(budget, before)
    outcome.update(before=before, target=target)
    if share is not None and not (budget <= 1 and target == target_bytes(budget, before)):
        # The graph's share, in bytes, is its budget (where it is the model's fraction of
        # the graph's own bytes, the fraction stays: torch's knapsack is tried at it).
        budget = max(target, 2)
    sub = plan_cache.sub_key(budget, target)
    if entry and sub in entry.get("plans", {}):
        return _replay(entry["plans"][sub], aten, apply, ladder, plain, decisions, outcome)
    partitioner.replay_only(False)
    first = len(decisions)
    try:
        rewrote, options = _plan(
            aten,
            fakes,
            apply,
            ladder,
            plain,
            budget,
            skip,
            decisions,
            outcome,
            before,
            target,
            value,
        )
    except BudgetError as e:
        if cache_key:
            plan = {"error": str(e), "reachable": e.reachable, "notes": _notes(decisions[first:])}
            plan_cache.store(cache_key, before, sub, plan)
        raise
    if cache_key:
        plan = dict(outcome, rewrote=rewrote, options=options, notes=_notes(decisions[first:]))
        plan["uuid"] = partitioner.plan_key()  # the partitioner key it compiles under
        if isinstance(outcome.get("kept"), Partition):
            plan["profile"] = outcome["kept"].profile()
        plan_cache.store(cache_key, before, sub, plan)
    return rewrote, options


def _notes(records):
    return [[d.text, d.bytes_before, d.bytes_after] for d in records if d.pass_ == "memory-budget"]


def _replay(plan, aten, apply, ladder, plain, decisions, outcome):
    """A plan from the plan cache, applied as _plan took it: the same tags, the same
    partitioner options, the same notes (and one saying where it came from)."""
    for text, b, a in plan["notes"]:
        decisions.append(budget_note(text, b, a))
    if "error" in plan:
        decisions.append(budget_note("the plan cache holds this target's error"))
        raise _error(plan["reachable"], plan["error"])
    decisions.append(budget_note("plan replayed from the plan cache (no dry run)"))
    partitioner.replayed(plan)
    way, step = plan.get("way"), plan.get("step")
    if way == "plain":
        plain.tag(step)
    elif way in ("pipeline", "ladder"):
        apply()
        if way == "ladder":
            ladder.tag(step)
    outcome.update({k: v for k, v in plan.items() if k in ("way", "step")})
    if "kept" in plan:
        outcome["kept"] = Partition.of(plan["kept"], plan.get("profile"))
    return plan["rewrote"], dict(plan["options"])


def _plan(
    aten, fakes, apply, ladder, plain, budget, skip, decisions, outcome, before, target, value
):
    """_meet_budget's planning: the target met as it is, or the ways (dry runs)."""
    value = value or int

    def note(text, before=None, after=None):
        decisions.append(budget_note(text, before, after))
        if text.startswith(head) and after is not None:
            outcome["kept"] = after  # the notes of a plan taken start with the head

    head = (
        f"budget {target:,} B of the {before:,} B Inductor's partitioner keeps for the "
        "unmodified graph (parameters excluded)"
        if value is int
        else f"the graph's share of the step's peak {target:,} B (unmodified: "
        f"{value(before):,} B, saving {before:,} B for backward)"
    )
    if value(before) <= target:
        outcome["way"] = "as-is"
        note(head + ": met as it is, nothing rewritten", before, before)
        return False, {}
    from torch._functorch import config as functorch_config

    options = dict(FUSED_RECOMPUTE)  # way 2 sets torch.compile's own
    # Probes tag and retag `aten` (each a recompile) and dry-run it: of the sources FX
    # keeps, only aten's last one is still used.
    probes = _Probes(aten, fakes, skip, note, before, target, head, outcome, value)
    with functorch_config.patch(**FUSED_RECOMPUTE), _forget_fx_sources(aten):
        return _meet_budget_fused(probes, apply, ladder, plain, budget, decisions, options), options


# Way 3's and way 1's ladder: the pieces ladder over the graph as Dynamo gave it.
_UNMODIFIED = "on the unmodified graph (the pipeline's rewrites left out)"


class _Probes:
    """One budget's probes of ladder steps: each step tagged on `aten` and dry-run once
    (its measured bytes cached per ladder), the records of the step taken, and `reached`,
    the smallest bytes each way reached (for BudgetError)."""

    def __init__(self, aten, fakes, skip, note, before, target, head, outcome, value=int):
        self.aten, self.fakes, self.skip, self.note = aten, fakes, skip, note
        self.before, self.target, self.head = before, target, head
        self.outcome = outcome  # "way" and "step" of the plan taken (plan_cache replays them)
        self.value = value  # what a dry run is judged by (int: its saved bytes)
        self.reached = []  # (value, how) of each way's smallest

    def fits(self, measured) -> bool:
        return self.value(measured) <= self.target

    @staticmethod
    def usable(lad) -> bool:
        return lad is not None and not lad.why and len(lad.steps) >= 2

    def measure(self, lad, k, measured):
        if k not in measured:
            lad.tag(k)
            measured[k] = _partitioned_saved_bytes(self.aten, self.fakes, self.skip)
        return measured[k]

    def take(self, lad, k, measured, what):
        note = self.note
        lad.tag(k)
        self.outcome["step"] = k
        step = lad.steps[k]
        peak, flops, runs = step.peak, step.flops, step.runs
        note(
            self.head + f": {what}; ladder step {k} of {len(lad.steps) - 1}: "
            f"{len(runs) - lad.skipped} recomputed run(s) ({lad.segments} blocks), measured "
            f"{measured[k]:,} B; predicted backward peak {peak:,} B (from "
            f"{lad.steps[0].peak:,} B), added forward work {flops / 1e9:.3g} GFLOP; steps "
            "measured: " + ", ".join(f"{j}: {b:,} B" for j, b in sorted(measured.items())),
            self.before,
            measured[k],
        )
        for j in range(1, k + 1):
            note(
                f"step {j}: {lad.steps[j].move} -> predicted {lad.steps[j].kept:,} B, peak "
                f"{lad.steps[j].peak:,} B"
                + ("" if lad.steps[j].light else " (re-runs a convolution or matrix product)")
            )
        if lad.skipped:
            note(f"{lad.skipped} run(s) left out: they overlap the model's own checkpointing")

    def walk(self, lad, lo, measured, what, take=True):
        """The step of `lad` after `lo` to tag (None: it cannot reach the target; then
        the smallest it reaches is in `reached`); measured[lo] is known and over the
        target. take: tag it and note it as the plan taken (False: the caller weighs
        it against another way first)."""
        last = len(lad.steps) - 1
        if lo >= last:
            lad.tag(0)
            return None
        best = last if self.value is int else self.least(lad, lo, measured)
        if not self.fits(self.measure(lad, best, measured)):
            lad.tag(0)
            self.reached.append((self.value(measured[best]), what))
            return None
        hi = best  # measured[lo] misses the target, measured[hi] meets it
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(self.measure(lad, mid, measured)):
                hi = mid
            else:
                lo = mid
        # Measured bytes need not fall at every step (a recomputed dropout keeps the
        # generator's state): the earliest step meeting the target next to the one found.
        while hi > 1 and self.fits(self.measure(lad, hi - 1, measured)):
            hi -= 1
        if take:
            self.take(lad, hi, measured, what)
        return hi

    def least(self, lad, lo, measured) -> int:
        """The step after `lo` with the least value, the values taken as falling and then
        rising along the ladder (a step-peak's: saved bytes fall, the backward's re-runs
        add working memory): a ternary search, about 2 log3(steps) dry runs."""
        a, b = lo + 1, len(lad.steps) - 1

        def v(k):
            return self.value(self.measure(lad, k, measured))

        while b - a > 2:
            m1, m2 = a + (b - a) // 3, b - (b - a) // 3
            if v(m1) <= v(m2):
                b = m2
            else:
                a = m1
        return min(range(a, b + 1), key=lambda k: (v(k), k))


def _meet_budget_fused(probes, apply, ladder, plain, budget, decisions, options) -> bool:
    """_meet_budget's ways, under FUSED_RECOMPUTE; whether the graph was rewritten. Way
    2 sets `options` to torch.compile's own (TORCH_KNAPSACK and the fraction)."""
    outcome = probes.outcome
    measured = {}  # `plain`'s steps measured; step 0: the partitioner alone
    light = _light_end(probes, plain, measured)
    fused = None
    if light == 0 or probes.fits(measured[light]):
        # The partitioner alone, no tag: way 1's plan that rewrites nothing. Where the
        # light end (the partitioner's fused re-runs and memslim's norm and activation
        # re-runs besides) misses the target, it is not measured: it kept more than
        # the light end wherever both were measured (the records before 2026-11-29's
        # change), and a dry run less is a step of first compile less (issue 48: at
        # most three per graph).
        if plain is not None:
            plain.tag(0)
        measured[0] = fused = _partitioned_saved_bytes(probes.aten, probes.fakes, probes.skip)
        probes.reached.append(
            (probes.value(fused), "Inductor's partitioner re-running every fusible op")
        )
        met = _fused_re_runs(probes, plain, light, measured)
        if met is not None:
            outcome["way"] = "plain" if met else "fused"
            return met
    if plain is not None:
        plain.tag(0)  # the light end's tags off for torch's knapsack
    knap = _torchs_knapsack(probes, budget)
    if knap is not None:
        if knap.frac != knap.user and probes.usable(plain):
            # torch's plan at the user's fraction misses the target and a smaller one
            # meets it: its knapsack may have fallen off a cliff (GPT-2 small at 0.5: 190.9
            # MB at 0.5, 14.4 MB at 0.09375 for a 152 MB target, 1.25x torch's step), so
            # the pieces ladder's first step meeting the target is weighed against it.
            if _cheaper_ladder_step(probes, plain, light, measured, knap):
                outcome["way"] = "plain"
                return True
        _take_knapsack(probes, knap, options, fused, measured[light])
        outcome["way"] = "knapsack"
        return False
    if probes.usable(plain) and probes.walk(plain, light, measured, _UNMODIFIED) is not None:
        outcome["way"] = "plain"
        return True
    return _with_pipeline(probes, apply, ladder, plain, decisions, budget, fused)


def _light_end(probes, plain, measured) -> int:
    """The light end of the pieces ladder `plain`: its last step that re-runs no
    convolution or matrix product (0: none, or no usable ladder), measured."""
    light = 0
    if probes.usable(plain):
        light = max(k for k, step in enumerate(plain.steps) if step.light)
        if light >= 1:
            probes.reached.append(
                (
                    probes.value(probes.measure(plain, light, measured)),
                    "re-running norms and activations",
                )
            )
    return light


def _fused_re_runs(probes, plain, light, measured):
    """Way 1: the fewer bytes of the partitioner's fused re-runs alone and those plus the
    light end of `plain`, taken where they meet the target; whether the graph was
    rewritten, None where way 1 does not meet it."""
    fused = measured[0]
    best = min((light, 0), key=lambda k: (probes.value(measured[k]), k))
    if not probes.fits(measured[best]):
        return None
    if best == 0:
        if plain is not None:
            plain.tag(0)  # the light end's tags, measured above, off again
        probes.note(
            probes.head + f": met by Inductor's partitioner re-running every fusible op "
            f"(keeps {fused:,} B; the light end of memslim's pieces ladder: "
            f"{measured[light]:,} B)",
            probes.before,
            fused,
        )
        return False
    probes.take(
        plain,
        light,
        measured,
        _UNMODIFIED + ", every re-run that holds no "
        "convolution or matrix product (Inductor fuses them into the backward's "
        f"kernels), taken whole (the partitioner alone: {fused:,} B)",
    )
    return True


class _Knapsack(NamedTuple):
    """Way 2's plan: torch's knapsack at `frac` keeps `got` (a Partition); `user` is the
    fraction torch.compile itself gets, where its plan keeps `at_user`."""

    frac: float
    got: Partition
    at_user: int
    user: float


def _torchs_knapsack(probes, budget) -> Optional[_Knapsack]:
    """Way 2: torch's own knapsack (knapsack._torch_knapsack) where its plan meets the
    target; None where no fraction tried meets it."""
    aten, before, target, note = probes.aten, probes.before, probes.target, probes.note
    # Torch's knapsack may re-run a random op in backward, which draws again unless
    # Inductor's own seeds replay it (not under fallback_random: aten's generator moved
    # on; fuzz seed 930027, w0 0.63 off): graphs drawing random numbers skip way 2 (the
    # ladders' recompute tags keep the generator's state).
    seeded = next((n for n in aten.graph.nodes if knapsack._draws_random_numbers(n)), None)
    user = budget if budget <= 1 else target / before  # the fraction torch.compile gets
    if probes.value is not int:
        # A share of the step's peak: the saved bytes it leaves with the unmodified
        # graph's working memory, as a fraction (torch's knapsack takes one in [0, 1]).
        implied = target - (probes.value(before) - before)
        user = min(1.0, max(1.0 / knapsack.KNAPSACK_GRID, implied / max(before, 1)))
    frac, got, at_user = (
        (None, None, None)
        if seeded is not None
        else knapsack._torch_knapsack(
            aten, probes.fakes, probes.skip, user, before, target, note, probes.fits
        )
    )
    if seeded is not None:
        note(
            f"torch's knapsack (way 2) not tried: the graph draws random numbers "
            f"({seeded.target}), which its plan may draw again in backward"
        )
    if frac is None:
        if got is not None:
            probes.reached.append((probes.value(got), "torch's activation_memory_budget knapsack"))
        return None
    return _Knapsack(frac, got, at_user, user)


def _take_knapsack(probes, knap, options, fused, light_bytes) -> None:
    """Way 2 taken: `options` become torch.compile's own at the knapsack's fraction."""
    frac, got = knap.frac, knap.got
    options.update(TORCH_KNAPSACK, activation_memory_budget=frac)
    lower = (
        ""
        if frac == knap.user
        else (
            f", the largest fraction found whose plan meets the target (at {knap.user:.3g}, "
            f"torch.compile's own plan keeps {knap.at_user:,} B)"
        )
    )
    probes.note(
        probes.head + f": met by torch's own activation_memory_budget knapsack at {frac:.6g}"
        f"{lower} (keeps {got:,} B; "
        + ("" if fused is None else f"the partitioner alone: {fused:,} B, ")
        + f"with memslim's norm and activation re-runs: {light_bytes:,} B)",
        probes.before,
        got,
    )


def _gflop(p) -> str:
    return f"{getattr(p, 'flops', 0) / 1e9:.3g} GFLOP"


def _cheaper_ladder_step(probes, plain, light, measured, knap) -> bool:
    """Least added work between way 2 below the user's fraction and way 3: the pieces
    ladder's first step meeting the target (probes.walk, its dry runs) is taken where its
    partition runs fewer matrix-product and convolution flops (Partition.flops, forward
    and backward) than torch's knapsack's; whether it was. Ties go to the knapsack, which
    picks its re-runs by estimated time where the ladder is greedy per byte. A smaller
    target never keeps more where, on the probed points, the knapsack's bytes do not
    rise and its flops do not fall as its fraction falls (way 2's premise) and the
    ladder's flops do not fall along its steps: the plan a larger target took, if it
    meets the smaller, is then the smaller's knapsack or ladder step and wins again."""
    k = probes.walk(plain, light, measured, "", take=False)
    if k is None or not measured[k].flops < knap.got.flops:
        if k is not None:
            probes.note(
                f"the pieces ladder's step {k} meets the target too (keeps {measured[k]:,} B, "
                f"{_gflop(measured[k])}; torch's knapsack at {knap.frac:.6g}: "
                f"{_gflop(knap.got)}): not taken, it runs no fewer flops"
            )
        plain.tag(0)
        return False
    base = getattr(probes.before, "flops", 0)
    added = f"; added {(measured[k].flops - base) / 1e9:.3g} GFLOP" if base else ""
    probes.take(
        plain,
        k,
        measured,
        _UNMODIFIED + f", the least added work: its partition runs {_gflop(measured[k])}"
        f"{added}, where torch's knapsack at {knap.frac:.6g}, the largest fraction found "
        f"whose plan meets the target (at {knap.user:.3g} torch.compile's own keeps "
        f"{knap.at_user:,} B), keeps {knap.got:,} B and runs {_gflop(knap.got)}",
    )
    return True


def _with_pipeline(probes, apply, ladder, plain, decisions, budget, fused) -> bool:
    """Ways 4 and 5: the pipeline's rewrites alone, then the whole-block ladder over the
    graph they leave; True where one meets the target, else BudgetError."""
    before, head = probes.before, probes.head
    piped = fused
    if any(d.verdict == "rewrote" for d in decisions):
        apply()
        piped = _partitioned_saved_bytes(probes.aten, probes.fakes, probes.skip)
        probes.reached.append((probes.value(piped), "with the pipeline's rewrites"))
    elif piped is None:  # the partitioner alone, not measured by way 1 (no tag is on)
        piped = _partitioned_saved_bytes(probes.aten, probes.fakes, probes.skip)
    if probes.fits(piped):
        probes.outcome["way"] = "pipeline"
        probes.note(head + f": met by the pipeline's rewrites (keeps {piped:,} B)", before, piped)
        return True
    if (
        probes.usable(ladder)
        and probes.walk(ladder, 0, {0: piped}, f"the pipeline's rewrites keep {piped:,} B")
        is not None
    ):
        probes.outcome["way"] = "ladder"
        return True
    raise _unreachable(probes, ladder if ladder is not None else plain, budget)


def _unreachable(probes, lad, budget) -> BudgetError:
    """The error naming the smallest figure any way reached."""
    before, target = probes.before, probes.target
    if not probes.reached:
        why = lad.why if lad is not None and lad.why else "no block to recompute"
        return _error(
            probes.value(before),
            f"memory_budget {budget:g} ({target:,} B of the unmodified partition's {before:,} B) "
            f"cannot be met: {why} ({lad.segments if lad is not None else 0} blocks found"
            + (f"; refused: {'; '.join(lad.refused[:3])}" if lad and lad.refused else "")
            + ")",
        )
    best, how = min(probes.reached)
    return _error(
        best,
        f"memory_budget {budget:g} ({target:,} B of the unmodified partition's {before:,} B) "
        f"cannot be met: the smallest reachable is {best:,} B ({best / before:.3f} of the "
        f"unmodified; {how}, the whole ladder of "
        f"{lad.segments if lad is not None else 0} blocks without raising the "
        "predicted backward peak)",
    )


def _error(reachable: int, text: str) -> BudgetError:
    e = BudgetError(text)
    e.reachable = reachable  # the smallest bytes a plan of the graph keeps
    return e
