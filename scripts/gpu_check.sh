#!/usr/bin/env bash
# What: the GPU check (issue 47, docs/gpu_check.md). On a machine with CUDA it builds only
# what the GPU needs (the runtime library with its CUDA kernels for this GPU's
# architecture, and memslim._C; no gtest, no memslim-opt) against that machine's python3
# torch, into build-gpu/, then runs bench/gpu_check.py: every op's CUDA path against aten,
# opcheck, op speed, three models' training step; one table, and $OUT/gpu_check.md when
# $OUT is set. With --dry-run, or where no GPU is found, nothing is built: the GPU steps
# are listed with their estimated times and the rest runs on the CPU against an existing
# build (MEMSLIM_BUILD_DIR, else build/). Exit 0 when no check failed, 1 when one did, 2 on
# bad arguments.
# Why: a GPU is lent for minutes now and then, with no network: the check must be ready,
# build from the working tree alone and fit its time (build <= 4 min, checks <= 4 min).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
usage() {
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'
  echo "usage: scripts/gpu_check.sh [--dry-run] [--skip-build] [--build-dir DIR] [--parts 1,2,3,4]"
  echo "       [--budget-s S] [--smoke-models] [--verbose]   (env: PYTHON, OUT, GPU_CHECK_COMMIT, JOBS)"
}
DRY=0
SKIP_BUILD=0
BUILD=${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}
PYARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --build-dir)
      [ $# -ge 2 ] || { echo "gpu_check: --build-dir needs a directory" >&2; exit 2; }
      BUILD=$2
      shift ;;
    --parts)
      [[ $# -ge 2 && $2 =~ ^[1-4](,[1-4])*$ ]] ||
        { echo "gpu_check: --parts takes a list of 1, 2, 3, 4 such as 1,3" >&2; exit 2; }
      PYARGS+=(--parts "$2")
      shift ;;
    --budget-s)
      [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] ||
        { echo "gpu_check: --budget-s takes whole seconds such as 120" >&2; exit 2; }
      PYARGS+=(--budget-s "$2")
      shift ;;
    --smoke-models | --verbose) PYARGS+=("$1") ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see scripts/gpu_check.sh --help)" >&2; exit 2 ;;
  esac
  shift
done

# The interpreter: $PYTHON, else this checkout's .venv, else python3 (the GPU machine's);
# one probe per candidate (importing torch takes seconds): versions and GPU capability.
PROBE='import sys, torch
c = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else ()
print("".join(map(str, c)), sys.version.split()[0], torch.__version__)'
PY=""
for c in ${PYTHON:-"$ROOT/.venv/bin/python" python3}; do
  if INFO=$("$c" -c "$PROBE" 2>/dev/null); then PY=$c; break; fi
done
if [ -z "$PY" ]; then
  echo "gpu_check: no python with torch found (set PYTHON)" >&2
  exit 2
fi
read -r GPU PYV TORCHV <<<"$(echo "$INFO" | tail -n 1 | sed 's/^ /- /')"
[ "$GPU" = "-" ] && GPU=""
if [ -z "$GPU" ] && [ $DRY -eq 0 ]; then
  echo "gpu_check: no GPU found: dry run"
  DRY=1
fi
echo "gpu_check: python $PYV, torch $TORCHV, $(nproc) cores, GPU capability ${GPU:-none}"

BUILD_ROW=""
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
if [ $DRY -eq 1 ]; then
  echo "gpu_check: build skipped (dry run): would configure $BUILD with -DMEMSLIM_BUILD_TESTS=OFF" \
    "and the GPU's architecture, then ninja memslim_runtime memslim_C"
  BUILD=${MEMSLIM_BUILD_DIR:-$ROOT/build}
  PYARGS+=(--dry-run)
elif [ $SKIP_BUILD -eq 0 ]; then
  # sm_XY of this GPU, SASS only (no PTX JIT at the first call); ccache when installed
  # (CMakeLists.txt sets it as the launcher); unity batches (the default).
  ARCH=$GPU  # "90": capability (9, 0)
  mkdir -p "$BUILD"
  LOG=$BUILD/gpu-check-build.log
  T0=$(date +%s)
  echo "gpu_check: building into $BUILD (sm_$ARCH, -j${JOBS:-$(nproc)}); log: $LOG"
  if cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
      -DPython3_EXECUTABLE="$(command -v "$PY")" -DMEMSLIM_BUILD_TESTS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTORCH_CUDA_ARCH_LIST="${ARCH:0:1}.${ARCH:1}" \
      >"$LOG" 2>&1 &&
    cmake --build "$BUILD" --target memslim_runtime memslim_C -j "${JOBS:-$(nproc)}" >>"$LOG" 2>&1; then
    SECS=$(($(date +%s) - T0))
    BUILD_ROW="ok;$SECS;runtime (CUDA sm_$ARCH) + _C in $SECS s"
    grep -q "CUDA kernels ON" "$LOG" || BUILD_ROW="FAIL;$SECS;built without CUDA kernels (nvcc not found?)"
    echo "gpu_check: build done in $SECS s"
  else
    SECS=$(($(date +%s) - T0))
    echo "gpu_check: build FAILED after $SECS s; the end of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    BUILD_ROW="FAIL;$SECS;$(grep -m1 -E 'error|Error' "$LOG" | cut -c1-150 | tr '|;' '/,')"
  fi
fi
[ -n "$BUILD_ROW" ] && PYARGS+=(--build "$BUILD_ROW")
# A compiler whose libstdc++ is linked in statically (the GPU machine's /opt/gcc g++ 13.3)
# leaves a copy of its stream and locale code in the passes library beside the libstdc++.so
# that torch loads: the two mix and `ostream << n` segfaulted in the passes (2026-11-30).
# The system's libstdc++ preloaded binds every call to one copy (measured: the crash gone).
if nm -DC --defined-only "$BUILD/lib/libmemslim_passes.so" 2>/dev/null | grep -q "std::codecvt<"; then
  LIBSTD=$(ldconfig -p 2>/dev/null | grep -m1 'libstdc++.so.6 ' | awk '{print $NF}')
  echo "gpu_check: the build carries its own libstdc++ code (compiler $(grep -m1 'CMAKE_CXX_COMPILER:' \
    "$BUILD/CMakeCache.txt" | cut -d= -f2)): preloading ${LIBSTD:-nothing found}"
  [ -n "$LIBSTD" ] && export LD_PRELOAD=$LIBSTD${LD_PRELOAD:+:$LD_PRELOAD}
fi
export MEMSLIM_BUILD_DIR=$BUILD
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$BUILD/inductor-cache}
exec "$PY" "$ROOT/bench/gpu_check.py" "${PYARGS[@]}"
