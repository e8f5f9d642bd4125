#!/usr/bin/env bash
# GPU run 5: where std::filesystem binds; libstdc++ right after the objects.
set -uo pipefail
OUT=$1; SECONDS=0
export PATH=/usr/local/cuda/bin:$PATH
PREFIX=/tmp/infoflow-deps; BUILD=/tmp/build-gpu
mkdir -p $PREFIX; for f in .gpu-deps/*.deb; do dpkg -x $f $PREFIX; done
Torch_DIR=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch
TL=$(dirname $(dirname $Torch_DIR))/../lib
echo "g++: $(command -v g++); so: $(g++ -print-file-name=libstdc++.so); a: $(g++ -print-file-name=libstdc++.a)"
echo "libtorch.so exports filesystem symbols: $(nm -DC --defined-only $TL/libtorch.so 2>/dev/null | grep -c 'std::filesystem')"
nm -DC --defined-only $TL/libtorch.so 2>/dev/null | grep 'std::filesystem' | head -5
TORCH_CUDA_ARCH_LIST=9.0 cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFOFLOW_ENGINE_ONLY=ON \
  -DINFOFLOW_CUDA=ON -DTorch_DIR=$Torch_DIR -DCMAKE_PREFIX_PATH=$PREFIX/usr > $OUT/d5_build.txt 2>&1
cmake --build $BUILD -j16 --target engine_tests >> $OUT/d5_build.txt 2>&1 || { tail -30 $OUT/d5_build.txt; exit 1; }
T=$BUILD/tests/engine/engine_tests
grep -E "libtorch [0-9]" $OUT/d5_build.txt; echo "== [$SECONDS s] built"; readelf -d $T | grep NEEDED | head -4; ldd $T | grep stdc
nm -C $T | grep 'filesystem::remove_all' | head -3
export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu
timeout 100 $T --gtest_filter='Cuda*' > $OUT/d5_gpu_tests.txt 2>&1; tail -2 $OUT/d5_gpu_tests.txt
echo "== [$SECONDS s] all engine_tests"
timeout 200 $T --gtest_brief=1 > $OUT/d5_all.txt 2>&1; echo "rc $?"; tail -12 $OUT/d5_all.txt
echo "== [$SECONDS s] done"
