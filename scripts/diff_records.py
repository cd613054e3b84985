"""Diffs two outputs of scripts/dump_records.py, block by (model / way) block.

What: prints how many blocks each output has, how many both have, how many are identical and
how many record lines were compared, then a unified diff of every block that differs.
Several "before" files may be given comma-separated (a later one's block replaces an
earlier one's: a rerun of some models). Exit 1 when a compared block differs.
Why: the proof that a restructuring changed no decision is this diff being empty.

    .venv/bin/python scripts/diff_records.py before.txt after.txt
    .venv/bin/python scripts/diff_records.py before.txt,before_rerun.txt after.txt
"""

from __future__ import annotations

import difflib
import sys


def blocks(path: str) -> dict:
    out, cur = {}, None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("=== "):
                cur = line[4:]
                out[cur] = []
            elif cur is not None:
                out[cur].append(line)
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: diff_records.py BEFORE[,BEFORE2...] AFTER", file=sys.stderr)
        return 2
    before: dict = {}
    for path in sys.argv[1].split(","):
        before.update(blocks(path))
    after = blocks(sys.argv[2])
    common = [k for k in before if k in after]
    differ = [k for k in common if before[k] != after[k]]
    failed = [k for k in common if any(ln.startswith("FAILED") for ln in before[k])]
    print(
        f"blocks: before {len(before)}, after {len(after)}, compared {len(common)}, "
        f"identical {len(common) - len(differ)}; record lines compared "
        f"{sum(len(before[k]) for k in common)}; blocks that failed in both {len(failed)}"
    )
    for k in differ:
        print(f"differs: {k}")
        for d in difflib.unified_diff(before[k], after[k], lineterm="", n=0):
            print("    " + d)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
