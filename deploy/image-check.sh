#!/usr/bin/env bash
# Builds the CPU image (deploy/docker/Dockerfile) on a machine with no image
# registry and checks it end to end:
#   1. docker.io + debootstrap installed, dockerd running (started if not);
#   2. base image infoflow-base:bookworm: debootstrap bookworm (minbase) from the
#      Debian mirror apt is configured with, then `docker import` (skipped when
#      the image exists);
#   3. docker build --build-arg BASE_IMAGE=infoflow-base:bookworm;
#   4. docker run (default CMD: the shipped models/infoflow-tiny), wait for the
#      HEALTHCHECK (`infoflow stats`), ingest deploy/demo/docs, ask the demo
#      question with the demo template, check the answer contains the code;
#   5. stop and remove the container (and its /data volume).
# Idempotent: run it again and it reuses dockerd, the base image and the build cache.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: deploy/image-check.sh [--rebuild-base] [--skip-build] [--keep] [--help]

  --rebuild-base  debootstrap and import the base image again even if it exists
  --skip-build    do not run docker build (the image must exist)
  --keep          leave the container running at the end (default: stop + remove)

Environment (defaults in brackets):
  IMAGE [infoflow-kv:0.1.0]         image tag to build and run
  BASE_IMAGE [infoflow-base:bookworm] base image made by debootstrap + docker import
  SUITE [bookworm]                  Debian suite to debootstrap
  DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR
                                    [read from apt's config: apt-get indextargets]
  DOCKER [/usr/bin/docker if present, else docker]
                                    client; Debian's 20.10 CLI builds with BuildKit
                                    without the buildx plugin
  DOCKERD_FLAGS []                  flags when this script starts dockerd
  DOCKERD_LOG [/var/log/infoflow-dockerd.log]
  CONTAINER [infoflow-image-check]  container name
  HEALTH_TIMEOUT [300]              seconds to wait for the container to be healthy
  EXPECT [68075]                    string the answers must contain
  METHODS ["infoflow full"]         query methods to check (infoflow at --ratio 0.15)
  NETWORK []                        e.g. "host": docker build/run --network host
EOF
}

REBUILD_BASE=0 SKIP_BUILD=0 KEEP=0
for a in "$@"; do
  case "$a" in
    --rebuild-base) REBUILD_BASE=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --keep) KEEP=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "image-check: unknown argument $a" >&2; usage >&2; exit 2 ;;
  esac
done

IMAGE=${IMAGE:-infoflow-kv:0.1.0}
BASE_IMAGE=${BASE_IMAGE:-infoflow-base:bookworm}
SUITE=${SUITE:-bookworm}
CONTAINER=${CONTAINER:-infoflow-image-check}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-300}
EXPECT=${EXPECT:-68075}
METHODS=${METHODS:-infoflow full}
NETWORK=${NETWORK:-}
DOCKERD_FLAGS=${DOCKERD_FLAGS:-}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/infoflow-dockerd.log}
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi

T0=$SECONDS
step() { printf '\n== [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
info() { printf '   %s\n' "$*"; }
die() { printf 'image-check: FAILED: %s\n' "$*" >&2; exit 1; }
docker() { "$DOCKER" "$@"; }

# ---------------------------------------------------------------- 1. packages, dockerd
step "packages: docker.io debootstrap"
missing=()
for p in docker.io debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  info "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
info "docker client: $DOCKER ($("$DOCKER" --version))"

step "dockerd"
wait_dockerd() {  # $1 = seconds
  for _ in $(seq 1 "$1"); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  return 1
}
if docker info >/dev/null 2>&1; then
  info "already running"
else
  if [ -d /run/systemd/system ] && $SUDO systemctl start docker 2>/dev/null && wait_dockerd 30; then
    info "started with systemctl"
  else
    # No systemd (containers, VMs without an init): start it by hand, detached.
    # shellcheck disable=SC2086
    $SUDO setsid nohup dockerd $DOCKERD_FLAGS >"$DOCKERD_LOG" 2>&1 </dev/null &
    if wait_dockerd 60; then
      info "started: dockerd $DOCKERD_FLAGS (log $DOCKERD_LOG)"
    else
      tail -20 "$DOCKERD_LOG" >&2 || true
      die "dockerd did not start (log $DOCKERD_LOG). Where iptables, the bridge or overlayfs
are unavailable try: DOCKERD_FLAGS='--iptables=false --bridge=none --storage-driver=vfs' NETWORK=host $0"
    fi
  fi
fi
info "$(docker info --format 'server {{.ServerVersion}}, storage {{.Driver}}, cgroup v{{.CgroupVersion}}' 2>/dev/null)"
NET_ARGS=()
[ -n "$NETWORK" ] && NET_ARGS=(--network "$NETWORK")

# ---------------------------------------------------------------- 2. base image
# Debian mirrors from apt's effective configuration (sources.list and
# sources.list.d, one-line or deb822), unless given.
# shellcheck disable=SC2016  # $(SITE) etc. are apt format fields, not shell
apt_site() {  # $1 = suite; prints the first configured site for it
  apt-get indextargets --format '$(SITE) $(RELEASE) $(TARGET_OF)' 2>/dev/null \
    | awk -v s="$1" '$2 == s && $3 == "deb" {print $1; exit}'
}
step "base image $BASE_IMAGE"
if [ "$REBUILD_BASE" = 0 ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  info "exists ($(docker image inspect -f '{{.Created}}' "$BASE_IMAGE")); --rebuild-base to make it again"
else
  MIRROR=${DEBIAN_MIRROR:-$(apt_site "$SUITE")}
  [ -n "$MIRROR" ] || MIRROR=$(apt_site "$SUITE-updates")
  [ -n "$MIRROR" ] || die "no Debian mirror for $SUITE in apt's config; set DEBIAN_MIRROR"
  SECURITY=${DEBIAN_SECURITY_MIRROR:-$(apt_site "$SUITE-security")}
  [ -n "$SECURITY" ] || SECURITY="${MIRROR%/debian}/debian-security"
  info "mirror $MIRROR, security $SECURITY"
  ROOTFS=$(mktemp -d /tmp/infoflow-rootfs.XXXXXX)
  trap '$SUDO rm -rf "$ROOTFS"' EXIT
  KEYRING=()
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] &&
    KEYRING=(--keyring /usr/share/keyrings/debian-archive-keyring.gpg)
  info "debootstrap --variant=minbase $SUITE (log $ROOTFS.log)"
  if ! $SUDO debootstrap --variant=minbase "${KEYRING[@]}" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1; then
    tail -20 "$ROOTFS.log" >&2
    die "debootstrap failed (log $ROOTFS.log)"
  fi
  # apt sources like the official debian:12 image (main + updates + security),
  # on the same mirror; debootstrap writes only "$SUITE main".
  $SUDO rm -f "$ROOTFS/etc/apt/sources.list"
  $SUDO tee "$ROOTFS/etc/apt/sources.list.d/debian.sources" >/dev/null <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  $SUDO rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/var/log/bootstrap.log "$ROOTFS"/debootstrap
  $SUDO tar --numeric-owner --xattrs -C "$ROOTFS" -c . |
    docker import -c 'CMD ["bash"]' -m "debootstrap --variant=minbase $SUITE $MIRROR" - "$BASE_IMAGE" >/dev/null
  $SUDO rm -rf "$ROOTFS" "$ROOTFS.log"
  trap - EXIT
  info "imported $BASE_IMAGE ($(docker image inspect -f '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
fi

# ---------------------------------------------------------------- 3. build
if [ "$SKIP_BUILD" = 1 ]; then
  step "build skipped (--skip-build)"
  docker image inspect "$IMAGE" >/dev/null 2>&1 || die "image $IMAGE does not exist"
else
  step "docker build -f deploy/docker/Dockerfile --build-arg BASE_IMAGE=$BASE_IMAGE -t $IMAGE ."
  tb=$SECONDS
  # BuildKit: reads deploy/docker/Dockerfile.dockerignore (the legacy builder does not).
  DOCKER_BUILDKIT=1 docker build --progress=plain "${NET_ARGS[@]}" \
    -f deploy/docker/Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" . ||
    die "docker build failed"
  info "built in $((SECONDS - tb)) s"
fi
SIZE=$(docker image inspect -f '{{.Size}}' "$IMAGE")
info "image $IMAGE: $(awk -v s="$SIZE" 'BEGIN{printf "%.0f MB", s/1e6}') ($SIZE bytes)"

# ---------------------------------------------------------------- 4. run + check
step "docker run $IMAGE (default CMD)"
docker rm -f -v "$CONTAINER" >/dev/null 2>&1 || true
cleanup() {
  rc=$?
  if [ "$rc" != 0 ]; then
    echo "--- docker logs $CONTAINER (last 40 lines)" >&2
    docker logs --tail 40 "$CONTAINER" >&2 2>&1 || true
  fi
  if [ "$KEEP" = 1 ] && [ "$rc" = 0 ]; then
    info "container $CONTAINER left running (--keep)"
  else
    docker rm -f -v "$CONTAINER" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
# No published ports (the check runs the CLI inside the container with docker
# exec); the demo chunks are mounted read-only.
docker run -d --name "$CONTAINER" "${NET_ARGS[@]}" \
  -v "$PWD/deploy/demo/docs:/demo/docs:ro" "$IMAGE" >/dev/null
info "cmd: $(docker inspect -f '{{join .Config.Entrypoint " "}} {{join .Config.Cmd " "}}' "$CONTAINER")"

step "waiting for HEALTHCHECK (infoflow stats) to report healthy (up to ${HEALTH_TIMEOUT}s)"
th=$SECONDS
while :; do
  state=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$CONTAINER")
  case "$state" in
    "running healthy") break ;;
    running*) ;;
    *) die "container is $state" ;;
  esac
  [ $((SECONDS - th)) -lt "$HEALTH_TIMEOUT" ] || die "not healthy after ${HEALTH_TIMEOUT}s ($state)"
  sleep 2
done
info "healthy after $((SECONDS - th)) s"
docker inspect -f '{{range .State.Health.Log}}exit {{.ExitCode}}: {{.Output}}{{end}}' "$CONTAINER" | sed 's/^/   | /'

ADDR=127.0.0.1:50051
step "infoflow stats"
docker exec "$CONTAINER" infoflow stats --server "$ADDR" | sed 's/^/   | /'

step "infoflow ingest /demo/docs"
docker exec "$CONTAINER" infoflow ingest --server "$ADDR" /demo/docs | sed 's/^/   | /'

# Same question, template and chunks as deploy/run-demo.sh.
Q="What is the secret code of Arthur Tanaka?"
TEMPLATE=$'\nQuestion: {question}\nAnswer:'
CHUNKS=()
for f in deploy/demo/docs/*.txt; do CHUNKS+=(--chunk-file "/demo/docs/$(basename "$f")"); done
REPORT=$(mktemp /tmp/infoflow-image-check.XXXXXX)
failed=0
for m in $METHODS; do
  extra=()
  [ "$m" = infoflow ] && extra=(--ratio 0.15)
  step "infoflow query --method $m ${extra[*]}: $Q"
  answer=$(docker exec "$CONTAINER" infoflow query --server "$ADDR" --question "$Q" --method "$m" "${extra[@]}" \
    --template "$TEMPLATE" "${CHUNKS[@]}" --max-new-tokens 8 --report 2>"$REPORT") ||
    { cat "$REPORT" >&2; die "query --method $m failed"; }
  sed 's/^/   | /' "$REPORT"
  info "answer: '$(printf '%s' "$answer" | tr '\n' ' ')'"
  if printf '%s' "$answer" | grep -q -- "$EXPECT"; then
    info "OK: contains $EXPECT"
  else
    info "WRONG: does not contain $EXPECT"
    failed=1
  fi
done
rm -f "$REPORT"
[ "$failed" = 0 ] || die "an answer does not contain $EXPECT"

step "done: $IMAGE built from $BASE_IMAGE, healthy, ingest + query OK (total $((SECONDS - T0)) s)"
