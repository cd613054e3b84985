"""The fuzzer generator's vocabularies: the shapes, dtypes and op templates it draws from.

What: widths and dtypes, aten / in-place / module / hand-written activations, pointwise
unary and binary templates (with what each saves for backward) and in-place write
templates, each a `{x}` / `{y}` / `{k}` template string. gen.py's Gen and its statement
mixins (gen_layers.py, gen_blocks.py) pick from them.
Why: the op vocabulary grows independently of the generator's logic; kept apart so a new
op is one line here. The order of each list is part of the generated programs (rng.choice
indexes it): append, do not reorder, or the same seed generates another program.
"""

WIDTHS = (8, 16, 24)
DTYPES = (("float32", 0.72), ("float64", 0.16), ("bfloat16", 0.12))

# aten activations: (feature, template). `{x}` is the operand.
ACTS = [
    ("gelu", "F.gelu({x})"),
    ("gelu_tanh", "F.gelu({x}, approximate='tanh')"),
    ("silu", "F.silu({x})"),
    ("mish", "F.mish({x})"),
    ("softplus", "F.softplus({x})"),
    ("softplus", "F.softplus({x}, beta=2.0, threshold=5.0)"),
    ("elu", "F.elu({x})"),
    ("elu", "F.elu({x}, alpha=0.5)"),
    ("celu", "F.celu({x}, alpha=1.5)"),
    ("selu", "F.selu({x})"),
    ("leaky_relu", "F.leaky_relu({x}, 0.2)"),
    ("hardswish", "F.hardswish({x})"),
    ("hardsigmoid", "F.hardsigmoid({x})"),
    ("sigmoid", "torch.sigmoid({x})"),
    ("sigmoid", "{x}.sigmoid()"),
    ("tanh", "torch.tanh({x})"),
    ("relu", "F.relu({x})"),
    ("relu", "torch.relu({x})"),
    ("relu", "{x}.relu()"),
    ("relu6", "F.relu6({x})"),
]
# In-place activations: (feature, template, is_statement_form).
INPLACE_ACTS = [
    ("silu_", "F.silu({x}, inplace=True)"),
    ("relu_", "F.relu({x}, inplace=True)"),
    ("relu_", "{x}.relu_()"),
    ("relu_", "torch.relu_({x})"),
    ("sigmoid_", "torch.sigmoid_({x})"),
    ("sigmoid_", "{x}.sigmoid_()"),
    ("tanh_", "torch.tanh_({x})"),
    ("tanh_", "{x}.tanh_()"),
    ("elu_", "F.elu({x}, inplace=True)"),
    ("celu_", "F.celu({x}, alpha=0.5, inplace=True)"),
    ("selu_", "F.selu({x}, inplace=True)"),
    ("leaky_relu_", "F.leaky_relu({x}, 0.1, inplace=True)"),
    ("hardswish_", "F.hardswish({x}, inplace=True)"),
    ("hardsigmoid_", "F.hardsigmoid({x}, inplace=True)"),
    ("mish_", "F.mish({x}, inplace=True)"),
    ("relu6_", "F.relu6({x}, inplace=True)"),
]
MODULE_ACTS = [
    ("gelu", "torch.nn.GELU()", False),
    ("gelu_tanh", "torch.nn.GELU(approximate='tanh')", False),
    ("silu", "torch.nn.SiLU()", False),
    ("silu_", "torch.nn.SiLU(inplace=True)", True),
    ("relu_", "torch.nn.ReLU(inplace=True)", True),
    ("mish", "torch.nn.Mish()", False),
    ("hardswish", "torch.nn.Hardswish()", False),
    ("leaky_relu_", "torch.nn.LeakyReLU(0.1, inplace=True)", True),
    ("elu", "torch.nn.ELU()", False),
    ("sigmoid", "torch.nn.Sigmoid()", False),
    ("tanh", "torch.nn.Tanh()", False),
    ("softplus", "torch.nn.Softplus()", False),
]
# Hand-written activations (one expression in {x}).
HAND = [
    ("hand_silu", "{x} * torch.sigmoid({x})"),
    ("hand_silu", "torch.sigmoid({x}) * {x}"),
    ("hand_silu", "{x} / (1.0 + torch.exp(-{x}))"),
    ("hand_gelu", "0.5 * {x} * (1.0 + torch.erf({x} / math.sqrt(2.0)))"),
    ("hand_gelu", "{x} * 0.5 * (1.0 + torch.erf({x} * 0.7071067811865476))"),
    ("hand_gelu", "{x} * (torch.erf({x} / 1.4142135623730951) + 1.0) * 0.5"),
    (
        "hand_gelu_tanh",
        "0.5 * {x} * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * ({x} + 0.044715 * torch.pow({x}, 3.0))))",
    ),
    (
        "hand_gelu_tanh",
        "0.5 * {x} * (1.0 + torch.tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))",
    ),
    ("hand_mish", "{x} * torch.tanh(F.softplus({x}))"),
    ("hand_mish", "torch.tanh(F.softplus({x})) * {x}"),
    ("hand_hardswish", "{x} * F.relu6({x} + 3.0) / 6.0"),
    ("hand_hardswish", "{x} * torch.clamp({x} + 3.0, 0.0, 6.0) / 6.0"),
    ("hand_hardswish", "{x} * (F.relu6({x} + 3.0) / 6.0)"),
    ("hand_hardswish", "{x} * F.hardsigmoid({x})"),
    ("hand_quick_gelu", "{x} * torch.sigmoid(1.702 * {x})"),
]
# Pointwise ops: (template, saves its operand(s) for backward, saves its output).
UNARY = [
    ("torch.tanh({x})", 0, 1),
    ("torch.exp(-{x}.abs())", 1, 0),
    ("{x}.abs()", 1, 0),
    ("-{x}", 0, 0),
    ("{x} * {x}", 1, 0),
    ("torch.sqrt({x}.abs() + 1.0)", 1, 0),
    ("torch.log1p({x}.abs())", 1, 0),
    ("torch.clamp({x}, -2.0, 2.0)", 1, 0),
    ("{x}.pow(2)", 1, 0),
    ("torch.sin({x})", 1, 0),
    ("torch.cos({x})", 1, 0),
    ("torch.rsqrt({x} * {x} + 1.0)", 1, 0),
    ("torch.where({x} > 0, {x}, {x} * 0.1)", 1, 0),
    ("{x} * 1.5", 0, 0),
    ("{x} + 0.5", 0, 0),
    ("1.0 - {x}", 0, 0),
    ("{x} / 2.0", 0, 0),
    ("torch.erf({x})", 1, 0),
    ("torch.exp({x}.clamp(max=3.0))", 1, 1),
    ("{x} * 2.0 - 1.0", 0, 0),
]
BINARY = [
    ("{x} + {y}", 0),
    ("{x} - {y}", 0),
    ("{x} * {y}", 1),
    ("{x} / ({y}.abs() + 1.0)", 1),
    ("torch.maximum({x}, {y})", 1),
    ("torch.where({x} > {y}, {x}, {y} * 0.5)", 1),
    ("{x} * 0.5 + {y} * 0.25", 0),
    ("{x} * torch.sigmoid({y})", 1),
]
OUTPUT_SAVERS = {"sigmoid", "tanh", "relu"}  # aten activations whose backward reads their output
INPLACE_WRITES = [
    "{x}.add_(1.0)",
    "{x}.mul_(2.0)",
    "{x}.mul_(0.5)",
    "{x}.sub_(0.25)",
    "{x}.div_(2.0)",
    "{x}.clamp_(-3.0, 3.0)",
    "{x}.masked_fill_({x} > 2.0, 2.0)",
]
INPLACE_SLICE_WRITES = [
    "{x}[:, :{k}].add_(1.0)",
    "{x}[:, :{k}].mul_(2.0)",
    "{x}[:, {k}:].mul_(0.5)",
    "F.relu({x}[:, :{k}], inplace=True)",
    "{x}[0].add_(1.0)",
]
INPLACE_BINARY_WRITES = [
    "{x}.add_({y})",
    "{x}.add_({y}, alpha=0.5)",
    "{x}.mul_({y})",
    "{x}.copy_({y})",
    "{x}.addcmul_({y}, {y}, value=0.1)",
]
