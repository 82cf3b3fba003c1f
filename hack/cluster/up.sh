#!/usr/bin/env bash
# Start (or reuse) the local cluster: kwokctl's binary runtime with the binaries
# that build.sh cached, then register the fake GPU nodes. Nothing is downloaded.
# Prints the KUBECONFIG to use on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"

CLUSTER_NAME=${VG_CLUSTER_NAME:-vramguard}
export KWOK_WORKDIR=${KWOK_WORKDIR:-$VG_CACHE/kwok}
export KUBECONFIG=${VG_KUBECONFIG:-$VG_CACHE/kubeconfig}
export KWOK_KUBE_VERSION=$K8S_VERSION
kwokctl=$KWOK_BIN/kwokctl

for b in "$K8S_BIN/kube-apiserver" "$ETCD_BIN/etcd" "$kwokctl"; do
  [[ -x $b ]] || { echo "up: $b missing; run hack/cluster/build.sh first" >&2; exit 1; }
done

healthy() { kubectl get --raw /readyz >/dev/null 2>&1; }

t0=$SECONDS
if healthy; then
  echo "up: reusing cluster $CLUSTER_NAME"
else
  # A stopped or half-made cluster is removed first so that create starts clean.
  "$kwokctl" delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  # The runtime is set explicitly: left to itself kwokctl probes for docker,
  # and this machine has a docker client without an engine.
  "$kwokctl" create cluster --name "$CLUSTER_NAME" --runtime binary \
    --kube-apiserver-binary "$K8S_BIN/kube-apiserver" \
    --kube-controller-manager-binary "$K8S_BIN/kube-controller-manager" \
    --kube-scheduler-binary "$K8S_BIN/kube-scheduler" \
    --etcd-binary "$ETCD_BIN/etcd" \
    --kwok-controller-binary "$KWOK_BIN/kwok" \
    --kubeconfig "$KUBECONFIG" --timeout 5m --wait 2m
  echo "up: cluster started in $((SECONDS - t0)) s"
fi
kubectl apply -f "$here/gpu-nodes.yaml" >/dev/null
kubectl wait --for=condition=Ready node --all --timeout=120s >/dev/null
echo "up: nodes ready: $(kubectl get nodes -o name | tr '\n' ' ')"
echo "export KUBECONFIG=$KUBECONFIG"
