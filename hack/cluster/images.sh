#!/usr/bin/env bash
# Build the real node's images without a registry and import them into its
# containerd (docs/real-node.md). Both come from Debian's busybox-static:
#   registry.k8s.io/pause:3.10   the pod sandbox (containerd's sandbox image): busybox sleeping
#   vramguard.local/busybox:1    workloads: busybox with every applet linked in /bin
# The tarballs are cached under ~/.cache/vramguard/images, named by busybox's digest.
# Pods use them with imagePullPolicy: Never.
# Usage: hack/cluster/images.sh [CONTAINERD_ADDRESS]   (no address: build only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"

[[ -x $BUSYBOX ]] || { echo "images: $BUSYBOX missing (Debian package busybox-static; hack/cluster/build.sh installs it)" >&2; exit 1; }
out=$VG_CACHE/images
mkdir -p "$out"
key=$(sha256sum "$BUSYBOX" | cut -c1-12)
pause_tar=$out/pause-$key.tar workload_tar=$out/busybox-$key.tar

if [[ ! -s $pause_tar ]]; then
  # The sandbox only holds the pod's namespaces; its process sleeps.
  python3 "$here/oci_image.py" --name "$PAUSE_IMAGE" --out "$pause_tar" \
    --add "$BUSYBOX=/bin/busybox" --entrypoint '["/bin/busybox", "sleep", "infinity"]' >/dev/null
fi
if [[ ! -s $workload_tar ]]; then
  links=()
  for applet in $("$BUSYBOX" --list); do [[ $applet == busybox ]] || links+=(--link "bin/$applet=busybox"); done
  python3 "$here/oci_image.py" --name "$WORKLOAD_IMAGE" --out "$workload_tar" \
    --add "$BUSYBOX=/bin/busybox" "${links[@]}" --entrypoint '["/bin/sh"]' >/dev/null
fi
echo "images: $PAUSE_IMAGE ($pause_tar), $WORKLOAD_IMAGE ($workload_tar)"

if [[ $# -ge 1 ]]; then
  for tar in "$pause_tar" "$workload_tar"; do
    "$CONTAINERD_BIN/ctr" --address "$1" -n k8s.io images import "$tar" >/dev/null
  done
  echo "images: imported into $1 (namespace k8s.io)"
fi
