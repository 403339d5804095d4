#!/usr/bin/env bash
# Builds benchfleet's Docker images with no registry and no base image: each
# is a root filesystem holding the binaries in /usr/local/bin and the shared
# libraries they link (as `ldd` lists them), imported with `docker import`.
# Each image is named after the binary it runs (its entrypoint):
#
#   benchfleet-controller:TAG  the controller, as user 65532:65532, its data
#                              directory /var/lib/benchfleet (that user's);
#                              the CLI beside it (for a health check, and
#                              `docker exec` on the store)
#   benchfleet-agent:TAG       the agent, as root (the Docker socket and the
#                              GPUs), with benchfleet-loadgen and
#                              benchfleet-sim beside it, where it finds them,
#                              and this host's CA roots (its HTTP clients
#                              verify https:// against them)
#   benchfleet:TAG             the CLI, as user 65532:65532 with
#                              BENCHFLEET_DATA_DIR=/var/lib/benchfleet, to
#                              make the controller's PKI and tokens
#
# Usage: deploy/build-images.sh [--release|--debug] [--bin-dir DIR] [TAG]
#   --release      build and package the optimized binaries (the default)
#   --debug        the debug build, quicker to compile (what CI uses); its
#                  debug info is stripped from the images
#   --bin-dir DIR  package the binaries already built in DIR, compiling
#                  nothing (with --debug, their debug info is stripped)
#   TAG            the images' tag (default: dev)
#
# deploy/build-sim-image.sh builds the simulator's image with the same
# functions (sourced from here).
set -euo pipefail

# Runs cargo for PROFILE (release or debug) with the given arguments.
cargo_build() {
    local profile=$1
    shift
    if [ "$profile" = release ]; then
        cargo build --release "$@"
    else
        cargo build "$@"
    fi
}

# Fails unless a Docker daemon answers.
need_docker() {
    local me=$1
    command -v docker >/dev/null || { echo "$me: docker is not installed" >&2; exit 1; }
    docker info >/dev/null 2>&1 || { echo "$me: cannot reach the Docker daemon; start dockerd first" >&2; exit 1; }
}

# Temporary files of the images being built, removed when the script exits.
build_images_tmp=()
trap 'rm -rf "${build_images_tmp[@]}"' EXIT

# import_image TAG ENTRYPOINT PROFILE [--user UID:GID] [--dir PATH]... [--ca-roots] [--env K=V]... [--change C]... -- BINARY...
#
# Makes an image named TAG whose root filesystem holds each BINARY in
# /usr/local/bin (its debug info removed when PROFILE is debug), the shared
# libraries they link at the paths ldd gives, /tmp, and a minimal /etc
# (passwd and group naming root and nonroot (65532), nsswitch.conf reading
# files first). ENTRYPOINT is the binary the image runs. --user runs it as
# UID:GID; each --dir is a directory of the image owned by that user (mode
# 0700), the last one the working directory. --ca-roots copies this host's
# CA bundle (HTTP clients that verify https:// with the system's roots need
# one to be built at all). The image this tag named before is removed unless
# a container uses it.
import_image() {
    local tag=$1 entrypoint=$2 profile=$3
    shift 3
    local user="" workdir="" dirs=() changes=() ca_roots=no
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --user) user=$2; shift 2 ;;
            --dir) dirs+=("$2"); workdir=$2; shift 2 ;;
            --ca-roots) ca_roots=yes; shift ;;
            --env) changes+=("ENV $2"); shift 2 ;;
            --change) changes+=("$2"); shift 2 ;;
            --) shift; break ;;
            *) echo "import_image: unknown argument $1" >&2; return 2 ;;
        esac
    done
    [ "$#" -gt 0 ] || { echo "import_image: no binary for $tag" >&2; return 2; }

    local rootfs
    rootfs=$(mktemp -d)
    build_images_tmp+=("$rootfs" "$rootfs.tar")
    mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/root"
    mkdir -m 1777 "$rootfs/tmp"
    chmod 0700 "$rootfs/root"
    local binary lib
    for binary in "$@"; do
        [ -x "$binary" ] || { echo "import_image: $binary: no such executable (build it first)" >&2; return 1; }
        if [ "$profile" = debug ] && command -v strip >/dev/null; then
            strip --strip-debug -o "$rootfs/usr/local/bin/$(basename "$binary")" "$binary"
            chmod 0755 "$rootfs/usr/local/bin/$(basename "$binary")"
        else
            install -m 0755 "$binary" "$rootfs/usr/local/bin/"
        fi
        # Every absolute path ldd prints (libraries and the dynamic loader),
        # copied to the same path in the image; `cp -L` follows the version
        # symlinks.
        for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
            mkdir -p "$rootfs$(dirname "$lib")"
            cp -L "$lib" "$rootfs$lib"
        done
    done
    if [ "$ca_roots" = yes ]; then
        local bundle=/etc/ssl/certs/ca-certificates.crt
        [ -f "$bundle" ] || { echo "import_image: $tag needs the system's CA roots: $bundle is missing (install ca-certificates)" >&2; return 1; }
        mkdir -p "$rootfs/etc/ssl/certs"
        cp -L "$bundle" "$rootfs$bundle"
    fi
    printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/var/lib/benchfleet:/usr/sbin/nologin\n' \
        >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
    # glibc's default without this file asks DNS before /etc/hosts.
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"

    # Everything belongs to root but the user's own directories, which a
    # second pass appends with that owner (no root needed to build).
    local tarball="$rootfs.tar" dir excludes=()
    for dir in "${dirs[@]}"; do
        mkdir -p "$rootfs$dir"
        chmod 0700 "$rootfs$dir"
        excludes+=(--exclude="./${dir#/}")
    done
    tar -C "$rootfs" --numeric-owner --owner=0 --group=0 "${excludes[@]}" -cf "$tarball" .
    if [ "${#dirs[@]}" -gt 0 ]; then
        local owner=${user:-0:0} paths=()
        for dir in "${dirs[@]}"; do paths+=("./${dir#/}"); done
        tar -C "$rootfs" --numeric-owner --owner="${owner%%:*}" --group="${owner##*:}" --no-recursion \
            -rf "$tarball" "${paths[@]}"
    fi

    local args=(
        --change "ENTRYPOINT [\"/usr/local/bin/$entrypoint\"]"
        --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin'
        --change "LABEL org.opencontainers.image.title=$entrypoint"
    )
    [ -z "$user" ] || args+=(--change "USER $user")
    [ -z "$workdir" ] || args+=(--change "WORKDIR $workdir")
    local change
    for change in "${changes[@]}"; do args+=(--change "$change"); done

    local previous current
    previous=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    docker import "${args[@]}" --message "$entrypoint ($profile build)" "$tarball" "$tag" >/dev/null
    rm -rf "$rootfs" "$tarball"
    # The image this tag named before is of no use now; one a container
    # still uses stays.
    current=$(docker image inspect --format '{{.Id}}' "$tag")
    if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
        docker image rm "$previous" >/dev/null 2>&1 || true
    fi
    echo "built $tag from $*"
}

main() {
    local profile=release tag=dev bin_dir=""
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --release) profile=release ;;
            --debug) profile=debug ;;
            --bin-dir)
                [ "$#" -gt 1 ] || { echo "build-images.sh: --bin-dir needs a directory" >&2; exit 2; }
                bin_dir=$2
                shift
                ;;
            -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
            -*) echo "build-images.sh: unknown option $1; expected --release, --debug, --bin-dir DIR or a tag" >&2; exit 2 ;;
            *) tag=$1 ;;
        esac
        shift
    done
    case "$tag" in
        *:*|*/*) echo "build-images.sh: $tag: give the tag alone (dev, not benchfleet:dev)" >&2; exit 2 ;;
    esac

    if [ -n "$bin_dir" ]; then
        [ -d "$bin_dir" ] || { echo "build-images.sh: --bin-dir $bin_dir: no such directory" >&2; exit 1; }
        bin_dir=$(cd "$bin_dir" && pwd)
    fi
    cd "$(dirname "$0")/.."
    need_docker build-images.sh
    if [ -z "$bin_dir" ]; then
        cargo_build "$profile" --workspace --bins
        bin_dir="${CARGO_TARGET_DIR:-target}/$profile"
    fi

    import_image "benchfleet-controller:$tag" benchfleet-controller "$profile" \
        --user 65532:65532 --dir /var/lib/benchfleet \
        --env BENCHFLEET_DATA_DIR=/var/lib/benchfleet \
        --change 'EXPOSE 7070 7071' \
        -- "$bin_dir/benchfleet-controller" "$bin_dir/benchfleet"
    import_image "benchfleet-agent:$tag" benchfleet-agent "$profile" \
        --dir /var/lib/benchfleet-agent --ca-roots \
        -- "$bin_dir/benchfleet-agent" "$bin_dir/benchfleet-loadgen" "$bin_dir/benchfleet-sim"
    import_image "benchfleet:$tag" benchfleet "$profile" \
        --user 65532:65532 --dir /var/lib/benchfleet \
        --env BENCHFLEET_DATA_DIR=/var/lib/benchfleet \
        -- "$bin_dir/benchfleet"
}

# Sourced (by build-sim-image.sh): the functions alone.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
