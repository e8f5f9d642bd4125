#!/usr/bin/env bash
# Builds everything and runs every test (the command README.md and .ci/run use).
# Fresh Debian 12 machine as root: installs the packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
# Release, no ccache, -j2: fits the 2-core CI box (two torch TUs need ~3.5 GB).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFOFLOW_BUILD_TESTS=ON
cmake --build build -j2
ctest --test-dir build --output-on-failure -j2 --timeout 900
