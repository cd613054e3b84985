"""memslim-opt input fuzzing, IR side: the lit-test corpus and the IR text mutations.

What: `lit_cases` (the `# -----` cases and split-file parts of lit-tests/*.ir), the token
vocabularies (TYPES, OPS, CONSTS) and the mutators of IR_MUTATORS (line drops / duplicates /
swaps, token swaps, op, type, shape, constant and name changes, indentation, truncation,
random bytes), each `(rng, text, pool) -> text or bytes`; `signature_specs` reads
--input-shapes off a graph's signature.
Why: bench/fuzz_opt_inputs.py over the size rule; its inputs, by kind (this module and
_fuzz_opt_archives.py), apart from running and checking memslim-opt.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional, Tuple


ROOT = Path(__file__).resolve().parents[1]

TOKEN_RE = re.compile(
    r"%[A-Za-z0-9_.]+|[A-Za-z_][A-Za-z0-9_]*::[A-Za-z0-9_.]+|[A-Za-z_][A-Za-z0-9_]*"
    r"|-?\d+\.?\d*(?:e-?\d+)?|\"[^\"\n]*\"|->|[()\[\]{},:=<>?*]"
)
TYPES = [
    "Tensor",
    "int",
    "float",
    "bool",
    "str",
    "NoneType",
    "int[]",
    "float[]",
    "Tensor[]",
    "(Tensor, Tensor)",
    "Tensor?",
    "Optional[Tensor]",
    "Dict(str, Tensor)",
    "Device",
    "number",
    "Float(8, 16, strides=[16, 1], requires_grad=1, device=cpu)",
    "Double(8, 16, strides=[16, 1], requires_grad=1, device=cpu)",
    "Long(8, 16, strides=[16, 1], requires_grad=0, device=cpu)",
    "Bool(8, 16, strides=[16, 1], requires_grad=0, device=cpu)",
    "Half(8, 16, strides=[16, 1], requires_grad=1, device=cpu)",
    "BFloat16(4, strides=[1], requires_grad=1, device=cpu)",
    "Float(requires_grad=1, device=cpu)",
    "Float(8, 16, device=cpu)",
    "Float(8, 16, strides=[16, 1], requires_grad=1, device=cuda:0)",
    "Float(8, 16, strides=[16, 1], requires_grad=1, device=meta)",
    "QUInt8(8, strides=[1], requires_grad=0, device=cpu)",
    "ComplexFloat(8, strides=[1], requires_grad=1, device=cpu)",
    "Float(*, *, requires_grad=1, device=cpu)",
    "__torch__.Foo",
    "Future[int]",
    "Any",
]
OPS = [
    "aten::relu",
    "aten::gelu",
    "aten::silu",
    "aten::mish",
    "aten::sigmoid",
    "aten::tanh",
    "aten::mul",
    "aten::add",
    "aten::add_",
    "aten::linear",
    "aten::dropout",
    "aten::view",
    "aten::size",
    "aten::cat",
    "aten::softplus",
    "aten::erf",
    "aten::relu_",
    "aten::silu_",
    "aten::frobnicate",
    "aten::rand_like",
    "aten::warn",
    "aten::slice",
    "aten::select",
    "aten::copy_",
    "prim::Constant",
    "prim::If",
    "prim::Loop",
    "prim::ListConstruct",
    "prim::ListUnpack",
    "prim::TupleConstruct",
    "prim::TupleUnpack",
    "prim::TupleIndex",
    "prim::DictConstruct",
    "prim::GetAttr",
    "prim::SetAttr",
    "prim::CallMethod",
    "prim::CallFunction",
    "prim::Print",
    "prim::RaiseException",
    "prim::Uninitialized",
    "prim::unchecked_cast",
    "prim::Enter",
    "prim::Exit",
    "prim::fork",
    "prim::DifferentiableGraph",
    "prim::FusionGroup",
    "prim::profile",
    "prim::TypeCheck",
    "prim::BailOut",
    "prim::ConstantChunk",
    "prim::BroadcastSizes",
    "prim::AutogradZero",
    "prim::isinstance",
    "prim::tolist",
    "prim::PythonOp",
    "prim::Closure",
    "prim::awaitable",
    "prim::NumToTensor",
    "prim::device",
    "prim::dtype",
    "aten::wait",
    "memslim::gelu",
    "memslim::silu",
    "memslim::recompute_region",
    "memslim::activation_dropout",
    "memslim::_record_type",
    "memslim::nope",
    "foo::bar",
]
CONSTS = [
    "0",
    "1",
    "-1",
    "0.5",
    "1e308",
    "-1e308",
    "inf",
    "nan",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    '"none"',
    '"tanh"',
    '""',
    '"x\\n\\"y"',
    "[1, 2]",
    "[]",
    "[0.5]",
    '["a"]',
    "1j",
    "<Tensor>",
    "Tensor",
    "int",
]


def lit_cases() -> List[Tuple[str, str]]:
    """(name, IR text) of every case: lit files split at '# -----' and at
    split-file markers '#--- name'; comment lines dropped."""
    out = []
    for f in sorted((ROOT / "lit-tests").glob("*.ir")):
        parts: List[Tuple[str, List[str]]] = [(f.stem, [])]
        for line in f.read_text().splitlines():
            if line.startswith("# -----"):
                parts.append((f"{f.stem}#{len(parts)}", []))
            elif line.startswith("#--- "):
                parts.append((f"{f.stem}/{line[5:].strip()}", []))
            elif not line.lstrip().startswith("#"):
                parts[-1][1].append(line)
        for name, lines in parts:
            text = "\n".join(lines).strip("\n") + "\n"
            if "graph(" in text:
                out.append((name, text))
    return out


def _tokens(text):
    return [(m.start(), m.end()) for m in TOKEN_RE.finditer(text)]


def m_drop_lines(rng, text, pool):
    lines = text.splitlines(True)
    for _ in range(rng.randint(1, 3)):
        if len(lines) > 1:
            del lines[rng.randrange(len(lines))]
    return "".join(lines)


def m_dup_swap_lines(rng, text, pool):
    lines = text.splitlines(True)
    if len(lines) < 2:
        return text
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    if rng.random() < 0.5:
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


def m_token_swap(rng, text, pool):
    toks = _tokens(text)
    if not toks:
        return text
    for _ in range(rng.randint(1, 3)):
        toks = _tokens(text)
        a, b = toks[rng.randrange(len(toks))]
        if rng.random() < 0.6:
            new = rng.choice(pool)
        else:
            c, d = toks[rng.randrange(len(toks))]
            new = text[c:d]
        text = text[:a] + new + text[b:]
    return text


def m_op_change(rng, text, pool):
    ops = list(re.finditer(r"\b[a-z]+::[A-Za-z0-9_.]+", text))
    if not ops:
        return text
    m = rng.choice(ops)
    return text[: m.start()] + rng.choice(OPS) + text[m.end() :]


def m_type_change(rng, text, pool):
    spots = list(re.finditer(r"(?<=: )(?:[A-Z][A-Za-z0-9]*\([^)]*\)|\w+(?:\[\])?\??)", text))
    if not spots:
        return text
    m = rng.choice(spots)
    return text[: m.start()] + rng.choice(TYPES) + text[m.end() :]


def m_shape_change(rng, text, pool):
    spots = list(re.finditer(r"[A-Z][A-Za-z0-9]*\(([^)]*)\)", text))
    spots = [m for m in spots if re.match(r"\s*\d|\s*strides|\s*requires|\s*device", m.group(1))]
    if not spots:
        return text
    m = rng.choice(spots)

    def num():
        return str(rng.choice([0, 1, 2, 3, 7, 8, 16, 17, 64, 1000, -1, 2**31, 2**40, 2**62]))

    inner = m.group(1)
    r = rng.random()
    if r < 0.4:  # one number changed
        nums = list(re.finditer(r"-?\d+", inner))
        if nums:
            k = rng.choice(nums)
            inner = inner[: k.start()] + num() + inner[k.end() :]
    elif r < 0.6:  # a dimension added or removed
        dims = [num() for _ in range(rng.randint(0, 4))]
        inner = ", ".join(dims + [p.strip() for p in inner.split(",") if "=" in p])
    elif r < 0.8:  # strides of another rank
        inner = re.sub(
            r"strides=\[[^\]]*\]",
            "strides=[" + ", ".join(num() for _ in range(rng.randint(0, 3))) + "]",
            inner,
        )
    else:  # flags
        inner = (
            inner.replace("requires_grad=1", "requires_grad=0")
            if rng.random() < 0.5
            else inner.replace(
                "device=cpu",
                rng.choice(["device=cuda", "device=meta", "device=xla:0", "device=cpu:5"]),
            )
        )
    return text[: m.start(1)] + inner + text[m.end(1) :]


def m_const_change(rng, text, pool):
    spots = list(re.finditer(r"value=([^\]]*)\]", text))
    if not spots:
        return text
    m = rng.choice(spots)
    return text[: m.start(1)] + rng.choice(CONSTS) + text[m.end(1) :]


def m_name_change(rng, text, pool):
    names = sorted(set(re.findall(r"%[A-Za-z0-9_.]+", text)))
    if not names:
        return text
    a = rng.choice(names)
    b = rng.choice(names + ["%undefined", "%0", "%x.1"])
    spots = [m for m in re.finditer(re.escape(a) + r"\b", text)]
    m = rng.choice(spots)
    return text[: m.start()] + b + text[m.end() :]


def m_indent(rng, text, pool):
    lines = text.splitlines(True)
    if not lines:  # an earlier mutation left nothing (the long run died here)
        return "\t"
    i = rng.randrange(len(lines))
    lines[i] = (
        (" " * rng.choice([0, 1, 3, 4, 6, 8]) + lines[i].lstrip(" "))
        if rng.random() < 0.8
        else "\t" + lines[i]
    )
    return "".join(lines)


def m_truncate(rng, text, pool):
    return text[: rng.randrange(len(text) + 1)]


def m_random_bytes(rng, text, pool):
    data = bytearray(text.encode())
    for _ in range(rng.randint(1, 8)):
        b = rng.choice(
            [
                0,
                0xFF,
                0x80,
                0xC3,
                ord("\n"),
                ord("%"),
                ord("("),
                ord(")"),
                ord(":"),
                ord("="),
                ord('"'),
                ord("["),
                ord("#"),
                rng.randrange(256),
            ]
        )
        pos = rng.randrange(len(data) + 1)
        if rng.random() < 0.5 and pos < len(data):
            data[pos] = b
        else:
            data.insert(pos, b)
    return bytes(data)


IR_MUTATORS = {
    "drop-lines": m_drop_lines,
    "dup-swap-lines": m_dup_swap_lines,
    "token-swap": m_token_swap,
    "op-change": m_op_change,
    "type-change": m_type_change,
    "shape-change": m_shape_change,
    "const-change": m_const_change,
    "name-change": m_name_change,
    "indent": m_indent,
    "truncate": m_truncate,
    "random-bytes": m_random_bytes,
}


def signature_specs(text: str, rng) -> Optional[str]:
    """--input-shapes read off the signature: typed tensors keep their shape."""
    m = re.search(r"graph\((.*?)\):", text, re.S)
    if not m:
        return None
    specs = []
    for part in re.split(r",\s*(?=%)", m.group(1)):
        t = part.split(":", 1)[1].strip() if ":" in part else "Tensor"
        dims = re.match(r"[A-Z][A-Za-z0-9]*\(([\d, ]*)", t)
        if t in ("float", "number"):
            specs.append(rng.choice(["0.5", "0", "2"]))
        elif t == "int":
            specs.append(rng.choice(["1", "0", "3"]))
        elif t == "bool":
            specs.append(rng.choice(["true", "false"]))
        elif t.endswith("?") or t.startswith("Optional"):
            specs.append("none")
        elif dims and dims.group(1).strip():
            specs.append("x".join(d.strip() for d in dims.group(1).split(",") if d.strip()))
        elif dims:
            specs.append("scalar")
        else:
            specs.append(rng.choice(["8x16", "16x16", "8x16"]))
    return ",".join(specs)
