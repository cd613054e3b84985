#!/usr/bin/env bash
# Sets up everything memslim needs on a fresh Debian machine and builds it: Debian packages,
# the .venv (torch 2.14.1, a CUDA build, from this machine's disk), the CMake/ninja build
# (CUDA kernels included when nvcc exists), `import memslim` and .venv/bin/memslim-opt.
# One line per phase with its time; the tools' own output goes to build/setup-logs/ and is
# printed only when a phase fails. Idempotent: a second run only rebuilds what changed.
# The gtest binaries are built by the tests themselves (ctest's gtest_binaries entry).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
for a in "$@"; do
  echo "setup: unknown argument $a (scripts/setup.sh takes none)" >&2; exit 2
done
# Disk first: a fresh .venv is about 5.5 GiB (torch's CUDA wheel), the build about 0.7 GiB; pip
# running out of space half way leaves a broken .venv, so say so before starting.
free_gib() { df -Pk "$ROOT" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
need_gib=2
[ -x .venv/bin/python ] || need_gib=7
if [ "$(free_gib)" -lt "$need_gib" ]; then
  echo "setup: $(free_gib) GiB free under $ROOT; setting up needs about $need_gib GiB (a fresh .venv is ~5.5 GiB)" >&2
  exit 1
fi
LOGS=$ROOT/build/setup-logs
mkdir -p "$LOGS"
T0=$(date +%s%N)
secs() { local d=$(( ($(date +%s%N) - $1) / 100000000 )); echo "$((d / 10)).$((d % 10))"; }
phase() {  # phase NAME LOGFILE COMMAND...: runs it quietly, prints its time or its log
  local name=$1 log=$LOGS/$2 t
  shift 2
  t=$(date +%s%N)
  if "$@" >"$log" 2>&1; then
    printf 'setup: %-36s %6s s\n' "$name" "$(secs "$t")"
  else
    echo "setup: $name FAILED; its output ($log):" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

# 1. Debian packages: the build's (cmake, ninja, ccache) and the tests' (GoogleTest, FileCheck
#    and lit from llvm-14-tools). Installed alongside pip on a fresh machine: configuring
#    without them and again with them would rebuild everything (ccache as the launcher).
need=()
for p in cmake ninja-build ccache libgtest-dev llvm-14-tools clang-format-14; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
apt_install() {
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}

# 2. Python environment: pip reads torch 2.14.1's CUDA wheel from this machine's disk, one call
#    for all of requirements.txt; the Debian packages install meanwhile. --no-compile: Python
#    writes the bytecode of what is imported when it is first imported (pip compiling all of
#    torch's took 28 of its 65 s). (pip beside the build instead made the CPU-bound build
#    slower by more than it saved.) transformers and accelerate (the training-stack tests):
#    ~20 s of it (measured 2026-11-29).
venv_install() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --no-compile --disable-pip-version-check -r requirements.txt
}
if [ ! -x .venv/bin/ruff ] || ! .venv/bin/python -c "import torch, torchvision, pytest, numpy, expecttest, matplotlib, scikit_build_core, transformers, accelerate; assert torch.__version__.startswith('2.14.1') and transformers.__version__ == '5.24.0'" 2>/dev/null; then
  if [ ${#need[@]} -gt 0 ]; then
    apt_install "${need[@]}" >"$LOGS/apt.log" 2>&1 &
    APT=$!
  fi
  phase "Python packages (.venv)" pip.log venv_install
  if [ -n "${APT:-}" ]; then
    wait "$APT" || { echo "setup: apt-get install ${need[*]} FAILED:" >&2; tail -20 "$LOGS/apt.log" >&2; exit 1; }
    echo "setup: Debian packages (${need[*]}) installed alongside"
  fi
elif [ ${#need[@]} -gt 0 ]; then
  phase "Debian packages (${need[*]})" apt.log apt_install "${need[@]}"
fi

# 3. Build. nvcc lives in /usr/local/cuda/bin on this machine kind.
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
configure() {
  local prefix
  prefix=$(.venv/bin/python -c "import torch; print(torch.utils.cmake_prefix_path)")
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DPython3_EXECUTABLE="$ROOT/.venv/bin/python"
}
if [ ! -f build/build.ninja ]; then
  phase "configure (CMake)" configure.log configure
fi
phase "build (libraries, _C, memslim-opt)" build.log cmake --build build

# 4. `import memslim` from the venv: the package lives in python/.
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$ROOT/python" > "$SITE/memslim-dev.pth"
ln -sf "$ROOT/build/bin/memslim-opt" .venv/bin/memslim-opt
.venv/bin/python -c "import memslim" 2>"$LOGS/import.log" || { cat "$LOGS/import.log" >&2; exit 1; }
echo "setup: ok in $(secs "$T0") s (import memslim works; .venv/bin/memslim-opt)"
