#!/usr/bin/env bash
# Builds a Docker image of the simulated engine, benchfleet-sim, with no
# registry involved: a root filesystem holding the binary and the shared
# libraries it links (as `ldd` lists them), imported with `docker import`
# (build-images.sh's import_image). The image's entrypoint is the simulator,
# so it takes an engine's command line, like the agent's docker runtime
# gives it:
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
# shellcheck source=deploy/build-images.sh
source deploy/build-images.sh
need_docker build-sim-image.sh
cargo_build "$profile" -p benchfleet-sim
import_image "$tag" benchfleet-sim "$profile" -- "${CARGO_TARGET_DIR:-target}/$profile/benchfleet-sim"
