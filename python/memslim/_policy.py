"""The cost policy's keywords, generated from the C++ table (passes/core/policy.cpp).

What: `policy_keywords`, a decorator that gives an entry point every policy option as a
keyword-only argument, with the table's defaults, checks (ValueError naming the keyword and
what it expects) and help: the wrapped function receives them as one dict, `policy=`.
Why: the entry points (memslim.optimize, memslim.fx.optimize, memslim.compile) used to list
the options by hand and drifted apart (memslim.compile lacked the coupling options); the
table is memslim-opt's flags too, so every way in takes every option.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import textwrap

from . import _C


def options():
    """[(name, value help, help, default)] in the table's order."""
    defaults = _C.policy_defaults()
    return [(n, v, h, defaults[n]) for n, v, h in _C.policy_options()]


def check(entry: str, values: dict) -> dict:
    """`values` as the C++ table checks them; numbers.Integral / numbers.Real (numpy
    scalars) become int / float; bools stay bools (refused where a number is meant)."""
    out = {}
    for name, v in values.items():
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            v = int(v)
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            v = float(v)
        out[name] = v
    try:
        _C.check_policy(out)
    except ValueError as e:
        raise ValueError(str(e).replace("memslim.optimize:", f"{entry}:", 1)) from None
    return out


def policy_keywords(entry: str, **overrides):
    """Decorates `fn(..., policy: dict)`: the result takes every option as a keyword
    (default: the table's, or `overrides`' for this entry point) and calls fn with the
    checked dict. The signature and the docstring's policy part come from the table."""
    table = options()

    def wrap(fn):
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name != "policy"]
        defaults = {n: overrides.get(n, d) for n, _, _, d in table}
        for n, _, _, _ in table:
            params.append(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=defaults[n]))

        @functools.wraps(fn)
        def call(*args, **kwargs):
            policy = {n: kwargs.pop(n, defaults[n]) for n, _, _, _ in table}
            return fn(*args, policy=check(entry, policy), **kwargs)

        call.__signature__ = sig.replace(parameters=params)
        lines = [f"{n}={defaults[n]!r}: {h}" for n, _, h, _ in table]
        doc = "Policy keywords (passes/core/policy.cpp's table):\n" + "\n".join(
            textwrap.fill(ln, 88, subsequent_indent="    ") for ln in lines
        )
        call.__doc__ = (inspect.cleandoc(fn.__doc__ or "") + "\n\n" + doc).strip()
        return call

    return wrap
