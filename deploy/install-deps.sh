#!/usr/bin/env bash
# Installs exactly the Debian 12 packages infoflow-kv needs to build, test and run.
# Idempotent: safe to run again; apt skips what is already installed.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
PKGS=(
  cmake ninja-build pkg-config g++ git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  librocksdb-dev libtorch-dev libopenblas0-pthread
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev civetweb libcivetweb-dev prometheus
  nlohmann-json3-dev libxxhash-dev libre2-dev libssl-dev
  python3 python3-grpcio python3-grpc-tools python3-numpy python3-yaml curl
  clang libclang-rt-14-dev gnuplot-nox
  redis-server redis-tools libhiredis-dev libcpp-httplib-dev
  libgloo-dev  # Gloo headers for libtorch's c10d ProcessGroupGloo (engine/dist/)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# libtorch must use OpenBLAS, not the ~50x slower reference BLAS.
if command -v update-alternatives >/dev/null; then
  alt=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}')
  case "$alt" in
    *openblas*) ;;
    *) echo "WARNING: libblas.so.3 points at '$alt', not OpenBLAS; libtorch will be slow" >&2 ;;
  esac
fi
echo "install-deps: all packages present"
