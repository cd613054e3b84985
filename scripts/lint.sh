#!/usr/bin/env bash
# What: the tree's style checks, as .ci/run runs them: ruff (lint and format, pyproject.toml)
# over the Python files, clang-format (.clang-format) over the C++ / CUDA files but the two
# generated tables, and the size rules (scripts/check_sizes.py: no source file over 800 lines,
# no function over 120). Exit 1 on any violation, each printed as file:line.
# `scripts/lint.sh --fix` rewrites what the formatters can (then review the diff).
set -uo pipefail
cd "$(dirname "$0")/.."
RUFF=.venv/bin/ruff
CLANG_FORMAT=$(command -v clang-format-14 || command -v clang-format || true)
fail=0
if [ ! -x "$RUFF" ] || [ -z "$CLANG_FORMAT" ]; then
  echo "lint: needs .venv/bin/ruff (requirements.txt) and clang-format-14 (scripts/setup.sh)" >&2
  exit 1
fi
cxx_files() {
  git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | grep -vE 'kernels/(inverse_fits|derivative_tables)\.h$'
}
if [ "${1:-}" = "--fix" ]; then
  "$RUFF" format . && "$RUFF" check --fix .
  cxx_files | xargs "$CLANG_FORMAT" -i
  exit 0
fi
"$RUFF" check --output-format concise . || fail=1
"$RUFF" format --check . >/tmp/memslim-ruff-format.$$ 2>&1 || {
  grep -v "^[0-9]* files\? \(would be reformatted\|already formatted\)" /tmp/memslim-ruff-format.$$
  fail=1
}
rm -f /tmp/memslim-ruff-format.$$
cxx_files | xargs "$CLANG_FORMAT" --dry-run --Werror 2>&1 | grep "error:" || true
cxx_files | xargs "$CLANG_FORMAT" --dry-run --Werror >/dev/null 2>&1 || fail=1
.venv/bin/python scripts/check_sizes.py || fail=1
if [ "$fail" -ne 0 ]; then
  echo "lint: FAILED (scripts/lint.sh --fix formats; sizes are fixed by hand)" >&2
  exit 1
fi
echo "lint: ok (ruff, clang-format, sizes)"
