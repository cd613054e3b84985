"""The tree's size rules: no source file over 800 lines, no function over 120.

What: walks the tracked C++ / CUDA / Python sources (generated tables and test data excluded)
and prints `file:line: ...` for each file over MAX_FILE lines and each function over MAX_FUNC
lines. Python functions come from the ast; C++ functions from brace matching over the
clang-formatted text (a definition is a line that opens a brace after a parameter list, outside
any other function). Exit 1 when something is over, unless it is listed in ALLOWED with the
reason it still is (the list a restructuring shrinks; an entry that is no longer over fails,
so the list cannot go stale).
Why: a file a newcomer can read in one sitting, a function one can hold in mind.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

MAX_FILE, MAX_FUNC = 800, 120
ROOT = Path(__file__).resolve().parent.parent
EXCLUDE = re.compile(
    r"^(test/fuzz/corpus/|test/python/data/|kernels/include/memslim/kernels/"
    r"(inverse_fits|derivative_tables)\.h$)"
)
# "path" (a file) or "path:function": over the limits today, with why.
ALLOWED: dict[str, str] = {}

_CPP_HEADER = re.compile(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(->\s*[\w:<>,\s*&]+)?\{\s*$")
_NOT_FUNC = re.compile(r"^\s*(if|for|while|switch|catch|namespace|struct|class|enum|union|do)\b")


def _strip(line: str) -> str:
    """A C++ line without its string / char literals and // comment (braces in them)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//", 1)[0]


def cpp_functions(text: str):
    """(name, first line, line count) of each function definition of a C++ file."""
    lines = text.split("\n")
    depth, in_func, start, name, base = 0, False, 0, "", 0
    in_block_comment = False
    for i, raw in enumerate(lines, 1):
        line = raw
        if in_block_comment:
            if "*/" not in line:
                continue
            line, in_block_comment = line.split("*/", 1)[1], False
        if "/*" in line and "*/" not in line.split("/*", 1)[1]:
            line, in_block_comment = line.split("/*", 1)[0], True
        code = _strip(line)
        if not in_func and _CPP_HEADER.search(code) and not _NOT_FUNC.match(code):
            # The header may span lines: its name is the word before the first "(" of the
            # statement, searched back to the previous line ending a statement or block.
            j, head = i - 1, code
            while (
                "(" not in head.split(")")[0]
                and j > 0
                and not re.search(r"[;{}]\s*$", lines[j - 1])
            ):
                head = _strip(lines[j - 1]) + " " + head
                j -= 1
            m = re.search(r"([~\w:]+)\s*\(", head)
            in_func, start, base = True, i, depth
            name = m.group(1) if m else "?"
        depth += code.count("{") - code.count("}")
        if in_func and depth <= base:
            yield name, start, i - start + 1
            in_func = False


def py_functions(text: str):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node.name, first, node.end_lineno - first + 1


def main() -> int:
    files = subprocess.run(
        ["git", "ls-files", "*.cpp", "*.h", "*.cu", "*.cuh", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    over, seen = [], set()
    for f in files:
        if EXCLUDE.match(f) or not (ROOT / f).exists():
            continue
        text = (ROOT / f).read_text()
        n = text.count("\n")
        if n > MAX_FILE:
            over.append((f, f"{f}:1: {n} lines (at most {MAX_FILE})"))
        funcs = py_functions(text) if f.endswith(".py") else cpp_functions(text)
        for name, line, length in funcs:
            if length > MAX_FUNC:
                over.append(
                    (f"{f}:{name}", f"{f}:{line}: {name} is {length} lines (at most {MAX_FUNC})")
                )
    bad = 0
    for key, msg in over:
        seen.add(key)
        if key not in ALLOWED:
            print(msg)
            bad += 1
    for key in sorted(set(ALLOWED) - seen):
        print(f"check_sizes: {key} is within the limits now: remove it from ALLOWED")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
