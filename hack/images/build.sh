#!/usr/bin/env bash
# Build vramguard/operator and vramguard/agent from images/*.Dockerfile without a
# container daemon (buildah, vfs storage, chroot isolation) and write them as
# OCI archives that `ctr images import` or `skopeo copy oci-archive:...` take
# (docs/install.md, "Images").
#   base    VG_IMAGE_BASE names one; else the public python slim image where
#           docker.io answers; else a Python base made from Debian packages
#           (mmdebstrap, the machine's apt sources), cached by its inputs
#   pins    images/constraints.txt (make lock); their wheels are downloaded once
#           into ~/.cache/vramguard/wheels/cp<python>-<pins' hash> and mounted
#           read-only into the build, where pip installs from them alone
#   CA      the host's CA bundle, mounted read-only for pip in the build only
# Prints each image's unpacked and compressed size, its digest and the build's time.
# An image whose inputs (sources, Dockerfile, pins, base, build arguments) are
# unchanged since its archive was written is not built again.
# Usage: hack/images/build.sh [--with-sim]
#   --with-sim  also the agent with the simulated backends (WITH_SIM=1: the sim/
#               distribution) as <tag>-sim, which the local cluster's real node
#               runs; without a sim/ folder (the simulators still inside the
#               agent package) that is the product agent under the -sim tag
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
mkdir -p "$OUT"
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

wheelhouse() {  # sets WHEELS: the pinned wheels for the base's Python, downloaded once (empty: use the index)
  WHEELS=""
  local py plat=() p
  py=$(base_python) || return 0
  WHEELS=$VG_CACHE/wheels/cp$py-$( (cat "$root/images/constraints.txt"; echo "$WHEEL_TOOLS") | sha256sum | cut -c1-12)
  [[ -f $WHEELS/.complete ]] && return
  local t0=$SECONDS
  # manylinux tags up to glibc 2.34 (Debian 12 has 2.36; the slim image is Debian too).
  for p in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64; do plat+=(--platform "$p"); done
  mkdir -p "$WHEELS"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --implementation cp \
    --python-version "$py" "${plat[@]}" -d "$WHEELS" -r <(grep -v '^#' "$root/images/constraints.txt") $WHEEL_TOOLS
  touch "$WHEELS/.complete"
  echo "images: $(ls "$WHEELS" | wc -l) wheels for Python $py in $((SECONDS - t0)) s ($WHEELS)"
}
# What pip needs to build the project's own wheel (pyproject.toml's build-system), offline.
WHEEL_TOOLS="setuptools==80.9.0 wheel==0.45.1"

inputs_key() {  # inputs_key NAME WITH_SIM: a hash of all an image is made from
  { echo "$BASE $("${buildah[@]}" inspect --type image --format '{{.FromImageID}}' "$BASE" 2>/dev/null) $2 $WHEELS"
    (cd "$root" && find pyproject.toml README.md api operator agent sim images/constraints.txt images/trim.sh \
       "images/$1.Dockerfile" .dockerignore -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' \
       2>/dev/null | LC_ALL=C sort | xargs sha256sum) || true  # sim/ may be absent
  } | sha256sum | cut -c1-16
}

build_one() {  # build_one NAME TAG WITH_SIM: build and archive, unless the archive of the same inputs is there
  local name=$1 tag=$2 sim=$3 t0=$SECONDS image=vramguard/$1:$2 key
  local archive=$OUT/vramguard-$name-$tag.oci.tar
  key=$(inputs_key "$name" "$sim")
  if [[ -s $archive && $(cat "$archive.key" 2>/dev/null) == "$key" ]] &&
     "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; then
    python3 -c 'import json,sys; f=json.load(open(sys.argv[1])); print("images: %s unpacked %d MiB, compressed %d MiB, %s, %s (cached: same inputs)" % (f["image"], f["unpacked_bytes"] >> 20, f["compressed_bytes"] >> 20, f["digest"], f["archive"]))' "$archive.json"
    return
  fi
  local args=(--build-arg "BASE=$BASE" --build-arg "WITH_SIM=$sim")
  [[ -r $HOST_CA ]] && args+=(--volume "$HOST_CA:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
  # The wheelhouse, read-only: pip installs from it alone (no index, nothing downloaded).
  [[ -n $WHEELS ]] && args+=(--volume "$WHEELS:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_NO_INDEX=1)
  # No --layers: with vfs storage each cached layer is a full copy of the tree
  # (minutes per image); the key above is the cache instead.
  "${buildah[@]}" bud --isolation chroot --quiet -f "$root/images/$name.Dockerfile" -t "$image" \
    "${args[@]}" "$root" >"$OUT/build-$name.log" 2>&1 || { tail -n 30 "$OUT/build-$name.log" >&2; return 1; }
  rm -f "$archive" "$archive.key"
  # The archive names the image in full, as the kubelet asks containerd for it
  # (vramguard/agent:TAG is docker.io/vramguard/agent:TAG).
  "${buildah[@]}" push --quiet "$image" "oci-archive:$archive:docker.io/$image" >/dev/null
  report "$name" "$image" "$archive" $((SECONDS - t0))
  echo "$key" >"$archive.key"
}

tag_as() {  # tag_as NAME TAG NEW_TAG: vramguard/NAME:TAG also as NEW_TAG, with its own archive
  local image=vramguard/$1:$3 archive=$OUT/vramguard-$1-$3.oci.tar t0=$SECONDS key
  key=$(cat "$OUT/vramguard-$1-$2.oci.tar.key")
  if [[ -s $archive && $(cat "$archive.key" 2>/dev/null) == "$key" ]]; then
    echo "images: $image is vramguard/$1:$2 (cached: same inputs)"; return
  fi
  "${buildah[@]}" tag "vramguard/$1:$2" "$image"
  rm -f "$archive" "$archive.key"
  "${buildah[@]}" push --quiet "$image" "oci-archive:$archive:docker.io/$image" >/dev/null
  report "$1" "$image" "$archive" $((SECONDS - t0))
  echo "$key" >"$archive.key"
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
wheelhouse
build_one operator "$TAG" 0
build_one agent "$TAG" 0
if ((with_sim)) && [[ -d $root/sim ]]; then
  build_one agent "$TAG-sim" 1
elif ((with_sim)); then
  # No sim/ distribution (yet): the simulators are still inside the agent
  # package, so the product image is also the test image, under the -sim tag.
  tag_as agent "$TAG" "$TAG-sim"
fi
echo "images: done in $((SECONDS - t_start)) s (base $BASE)"
