#!/usr/bin/env bash
# Build the real node's images without a registry and import them into its
# containerd (docs/real-node.md). Both come from Debian's busybox-static:
#   registry.k8s.io/pause:3.10   the pod sandbox (containerd's sandbox image): busybox sleeping
#   vramguard.local/busybox:1    workloads: busybox with every applet linked in /bin, and
#                                /bin/simcuda (hack/cluster/simcuda, a static Go binary), the
#                                workload that uses the simulated GPU
# The tarballs are cached under ~/.cache/vramguard/images, named by the digests of
# busybox and of simcuda's source.
# Pods use them with imagePullPolicy: Never.
# Usage: hack/cluster/images.sh [CONTAINERD_ADDRESS]   (no address: build only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"

[[ -x $BUSYBOX ]] || { echo "images: $BUSYBOX missing (Debian package busybox-static; hack/cluster/build.sh installs it)" >&2; exit 1; }
out=$VG_CACHE/images
mkdir -p "$out"
key=$(sha256sum "$BUSYBOX" | cut -c1-12)
simcuda_key=$(cat "$here/simcuda/go.mod" "$here/simcuda/main.go" | sha256sum | cut -c1-12)
simcuda=$out/simcuda-$simcuda_key
pause_tar=$out/pause-$key.tar workload_tar=$out/busybox-$key-simcuda-$simcuda_key.tar

if [[ ! -x $simcuda ]]; then
  command -v go >/dev/null || { echo "images: go missing (needed once to build hack/cluster/simcuda)" >&2; exit 1; }
  # No module outside the standard library: nothing is downloaded.
  (cd "$here/simcuda" && GOTOOLCHAIN=local GOPROXY=off GOCACHE=$GOCACHE CGO_ENABLED=0 \
    go build -trimpath -ldflags "-s -w" -o "$simcuda.tmp" .)
  mv "$simcuda.tmp" "$simcuda"
fi

if [[ ! -s $pause_tar ]]; then
  # The sandbox only holds the pod's namespaces; its process sleeps.
  python3 "$here/oci_image.py" --name "$PAUSE_IMAGE" --out "$pause_tar" \
    --add "$BUSYBOX=/bin/busybox" --entrypoint '["/bin/busybox", "sleep", "infinity"]' >/dev/null
fi
if [[ ! -s $workload_tar ]]; then
  links=()
  for applet in $("$BUSYBOX" --list); do [[ $applet == busybox ]] || links+=(--link "bin/$applet=busybox"); done
  python3 "$here/oci_image.py" --name "$WORKLOAD_IMAGE" --out "$workload_tar" \
    --add "$BUSYBOX=/bin/busybox" --add "$simcuda=/bin/simcuda" "${links[@]}" --entrypoint '["/bin/sh"]' >/dev/null
fi
echo "images: $PAUSE_IMAGE ($pause_tar), $WORKLOAD_IMAGE ($workload_tar)"

if [[ $# -ge 1 ]]; then
  for tar in "$pause_tar" "$workload_tar"; do
    "$CONTAINERD_BIN/ctr" --address "$1" -n k8s.io images import "$tar" >/dev/null
  done
  echo "images: imported into $1 (namespace k8s.io)"
fi
