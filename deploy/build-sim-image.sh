#!/usr/bin/env bash
# Builds a Docker image of the simulated engine, benchfleet-sim, with no
# registry involved: a root filesystem holding the binary and the shared
# libraries it links (as `ldd` lists them), imported with `docker import`.
# The image's entrypoint is the simulator, so it takes an engine's command
# line, like the agent's docker runtime gives it:
#
#   docker run --rm --network host benchfleet-sim:dev vllm serve Qwen/Qwen3.5-9B --port 8000
#
# Usage: deploy/build-sim-image.sh [--release|--debug] [TAG]
#   --release  build and package the optimized binary (the default)
#   --debug    the debug build, quicker to compile (what CI uses)
#   TAG        the image's name (default: benchfleet-sim:dev)
set -euo pipefail

profile=release
tag=benchfleet-sim:dev
for arg in "$@"; do
    case "$arg" in
        --release) profile=release ;;
        --debug) profile=debug ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        -*) echo "build-sim-image.sh: unknown option $arg; expected --release, --debug or a tag" >&2; exit 2 ;;
        *) tag=$arg ;;
    esac
done

cd "$(dirname "$0")/.."
command -v docker >/dev/null || { echo "build-sim-image.sh: docker is not installed" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "build-sim-image.sh: cannot reach the Docker daemon; start dockerd first" >&2; exit 1; }

if [ "$profile" = release ]; then
    cargo build --release -p benchfleet-sim
else
    cargo build -p benchfleet-sim
fi
binary="${CARGO_TARGET_DIR:-target}/$profile/benchfleet-sim"
[ -x "$binary" ] || { echo "build-sim-image.sh: $binary was not built" >&2; exit 1; }

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
install -m 0755 "$binary" "$rootfs/benchfleet-sim"
mkdir -m 1777 "$rootfs/tmp"
# Every absolute path ldd prints (libraries and the dynamic loader), copied
# to the same path in the image; `cp -L` follows the version symlinks.
for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
done

previous=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
tar -C "$rootfs" -c . | docker import \
    --change 'ENTRYPOINT ["/benchfleet-sim"]' \
    --change 'LABEL org.opencontainers.image.title=benchfleet-sim' \
    --message "benchfleet-sim ($profile build)" \
    - "$tag" >/dev/null
# The image this tag named before is of no use now; one a container still
# uses stays.
current=$(docker image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
echo "built $tag from $binary"
