#!/usr/bin/env bash
# Remove the local cluster and its state; the real node first (hack/cluster/realnode.sh),
# while the API server can still stop its pods gracefully.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"
export KWOK_WORKDIR=${KWOK_WORKDIR:-$VG_CACHE/kwok}
"$here/realnode.sh" down | sed 's/^realnode: /down: real node: /'
"$KWOK_BIN/kwokctl" delete cluster --name "${VG_CLUSTER_NAME:-vramguard}" --kubeconfig "${VG_KUBECONFIG:-$VG_CACHE/kubeconfig}"
