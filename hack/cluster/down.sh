#!/usr/bin/env bash
# Remove the local cluster and its state.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"
export KWOK_WORKDIR=${KWOK_WORKDIR:-$VG_CACHE/kwok}
"$KWOK_BIN/kwokctl" delete cluster --name "${VG_CLUSTER_NAME:-vramguard}" --kubeconfig "${VG_KUBECONFIG:-$VG_CACHE/kubeconfig}"
