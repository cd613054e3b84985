#!/usr/bin/env bash
# Sets up everything memslim needs on a fresh Debian machine and builds it:
# Debian packages, the .venv (torch 2.14.1 CUDA build from local disk), the
# CMake/ninja build (CUDA kernels included when nvcc exists), `import memslim`
# in the venv. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# 1. Debian packages (FileCheck/lit come with llvm-14-tools).
need=()
for p in cmake ninja-build ccache libgtest-dev llvm-14-tools; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. Python environment.
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import torch, torchvision, pytest, numpy, expecttest, scikit_build_core; assert torch.__version__.startswith('2.14.1')" 2>/dev/null; then
  echo "setup: installing Python packages (requirements.txt)"
  .venv/bin/pip install -q -r requirements.txt
fi

# 3. Build. nvcc lives in /usr/local/cuda/bin on this machine kind.
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
TORCH_PREFIX=$(.venv/bin/python -c "import torch; print(torch.utils.cmake_prefix_path)")
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DPython3_EXECUTABLE="$ROOT/.venv/bin/python" \
    > /tmp/memslim-configure.$$.log 2>&1 || { cat /tmp/memslim-configure.$$.log; exit 1; }
fi
cmake --build build

# 4. `import memslim` from the venv: the package lives in python/.
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$ROOT/python" > "$SITE/memslim-dev.pth"
ln -sf "$ROOT/build/bin/memslim-opt" .venv/bin/memslim-opt
.venv/bin/python -c "import memslim" && echo "setup: ok"
