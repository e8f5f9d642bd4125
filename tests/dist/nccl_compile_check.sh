#!/usr/bin/env bash
# Compiles engine/dist/sp_group.cc's NCCL path (ProcessGroupNCCL, the CUDA
# builds' data plane) against this machine's libtorch 1.13 headers and CUDA
# and NCCL headers, without linking: Debian's libtorch has no CUDA library,
# so the CPU build never compiles that path. Full semantic check
# (-fsyntax-only), with the one header a CUDA libtorch build generates
# (c10/cuda/impl/cuda_cmake_macros.h) supplied here.
#   nccl_compile_check.sh BUILD_DIR [CUDA_HOME]
# Exit 77 (ctest: skipped) when there are no CUDA/NCCL headers.
set -euo pipefail
BUILD=${1:?usage: nccl_compile_check.sh BUILD_DIR [CUDA_HOME]}
CUDA=${2:-${CUDA_HOME:-/usr/local/cuda}}
if [ ! -f "$CUDA/include/cuda_runtime_api.h" ] || [ ! -f "$CUDA/include/nccl.h" ]; then
  echo "nccl_compile_check: no CUDA/NCCL headers under $CUDA: skipped"
  exit 77
fi
CMD=$(python3 - "$BUILD/compile_commands.json" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1])):
    if e["file"].endswith("engine/dist/sp_group.cc"):
        print(e["command"])
        break
PY
)
[ -n "$CMD" ] || { echo "nccl_compile_check: sp_group.cc not in $BUILD/compile_commands.json" >&2; exit 1; }
STUB=$(mktemp -d)
trap 'rm -rf "$STUB"' EXIT
mkdir -p "$STUB/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$STUB/c10/cuda/impl/cuda_cmake_macros.h"
CMD=$(echo "$CMD" | sed 's/ -o [^ ]*/ -fsyntax-only/')
cd "$BUILD"
eval "$CMD -DINFOFLOW_WITH_NCCL=1 -DUSE_C10D_NCCL=1 -I$STUB -I$CUDA/include"
echo "nccl_compile_check: engine/dist/sp_group.cc compiles with ProcessGroupNCCL ($CUDA)"
