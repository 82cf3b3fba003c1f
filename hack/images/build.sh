#!/usr/bin/env bash
# Build vramguard/operator and vramguard/agent from images/*.Dockerfile without a
# container daemon (buildah, vfs storage, chroot isolation) and write them as
# OCI archives that `ctr images import` or `skopeo copy oci-archive:...` take
# (docs/install.md, "Images").
#   base    VG_IMAGE_BASE names one; else the public python slim image where
#           docker.io answers; else a Python base made from Debian packages
#           (mmdebstrap, the machine's apt sources), cached by its inputs
#   pins    images/constraints.txt (make lock); pip's downloads are cached in
#           ~/.cache/vramguard/pip, mounted into the build
#   CA      the host's CA bundle, mounted read-only for pip in the build only
# Prints each image's unpacked and compressed size, its digest and the build's time.
# Usage: hack/images/build.sh [--with-sim]
#   --with-sim  the agent also gets the simulated backends (WITH_SIM=1) and the
#               tag <tag>-sim: the local cluster's real node needs them
# Environment: VG_IMAGE_TAG (default: the chart's appVersion), VG_IMAGE_BASE,
#              VG_IMAGES_OUT (default ~/.cache/vramguard/images)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/hack/cluster/versions.sh"

with_sim=0
case ${1:-} in
  --with-sim) with_sim=1 ;;
  "") ;;
  *) echo "images: unknown argument '$1' (usage: build.sh [--with-sim])" >&2; exit 2 ;;
esac
TAG=${VG_IMAGE_TAG:-$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' "$root/charts/vramguard/Chart.yaml")}
OUT=${VG_IMAGES_OUT:-$VG_CACHE/images}
SLIM=docker.io/library/python:3.12-slim
HOST_CA=${VG_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
buildah=(buildah --storage-driver vfs)
mkdir -p "$OUT" "$VG_CACHE/pip"
t_start=$SECONDS

install_tools() {  # buildah and mmdebstrap (skopeo for the registry probe) from Debian's packages
  local missing=() p
  for p in buildah mmdebstrap skopeo; do command -v "$p" >/dev/null || missing+=("$p"); done
  ((${#missing[@]} == 0)) && return
  echo "images: installing ${missing[*]} (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
}

source "$here/base.sh"

build_one() {  # build_one NAME TAG WITH_SIM: bud, then the archive unless the image is unchanged
  local name=$1 tag=$2 sim=$3 t0=$SECONDS image=vramguard/$1:$2
  local args=(--build-arg "BASE=$BASE" --build-arg "WITH_SIM=$sim")
  [[ -r $HOST_CA ]] && args+=(--volume "$HOST_CA:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
  "${buildah[@]}" bud --isolation chroot --layers --quiet -f "$root/images/$name.Dockerfile" -t "$image" \
    --volume "$VG_CACHE/pip:/root/.cache/pip" "${args[@]}" "$root" >/dev/null
  local id archive=$OUT/vramguard-$name-$tag.oci.tar
  id="$("${buildah[@]}" inspect --type image --format '{{.FromImageID}}' "$image") docker.io/$image"
  if [[ ! -s $archive || $(cat "$archive.id" 2>/dev/null) != "$id" ]]; then
    rm -f "$archive"
    # The archive names the image in full, as the kubelet asks containerd for it
    # (vramguard/agent:TAG is docker.io/vramguard/agent:TAG).
    "${buildah[@]}" push --quiet "$image" "oci-archive:$archive:docker.io/$image" >/dev/null
    echo "$id" >"$archive.id"
  fi
  report "$name" "$image" "$archive" $((SECONDS - t0))
}

report() {  # report NAME IMAGE ARCHIVE SECONDS: one line of sizes and the archive's manifest digest
  local ctr mnt unpacked packed digest
  ctr=$("${buildah[@]}" from --quiet --pull-never "$2")
  mnt=$("${buildah[@]}" mount "$ctr")
  unpacked=$(du -sb "$mnt" | cut -f1)
  "${buildah[@]}" umount "$ctr" >/dev/null; "${buildah[@]}" rm "$ctr" >/dev/null
  packed=$(stat -c %s "$3")
  digest=$(tar -xOf "$3" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')
  printf 'images: %s unpacked %d MiB, compressed %d MiB, %s, %s (%d s)\n' \
    "$2" $((unpacked >> 20)) $((packed >> 20)) "$digest" "$3" "$4"
  printf '{"image": "%s", "unpacked_bytes": %d, "compressed_bytes": %d, "digest": "%s", "archive": "%s", "seconds": %d}\n' \
    "$2" "$unpacked" "$packed" "$digest" "$3" "$4" >"$3.json"
}

install_tools
choose_base
build_one operator "$TAG" 0
build_one agent "$TAG" 0
((with_sim)) && build_one agent "$TAG-sim" 1
echo "images: done in $((SECONDS - t_start)) s (base $BASE)"
