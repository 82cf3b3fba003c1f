# Versions and cache paths of the local cluster's binaries; sourced by the
# scripts in hack/cluster/. Caches live outside the repo so a fresh clone reuses them.
K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
# promtool checks the chart's alert rules (make verify): Prometheus 3.16's Go module version.
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}

VG_CACHE=${VG_CACHE:-$HOME/.cache/vramguard}
VG_BIN=$VG_CACHE/bin
GOMODCACHE=${VG_GOMODCACHE:-$VG_CACHE/gomod}
GOCACHE=${VG_GOCACHE:-$VG_CACHE/gobuild}
K8S_BIN=$VG_BIN/kubernetes-$K8S_VERSION
ETCD_BIN=$VG_BIN/etcd-$ETCD_VERSION
KWOK_BIN=$VG_BIN/kwok-$KWOK_VERSION
HELM_BIN=$VG_BIN/helm-$HELM_VERSION-k8s  # -k8s: built with the Kubernetes version stamped
PROMTOOL_BIN=$VG_BIN/promtool-$PROMETHEUS_VERSION
KUBECTL_BIN=$VG_BIN/kubectl-$K8S_VERSION
KUBECTL=$KUBECTL_BIN/kubectl

# Every script that sources this file runs the kubectl built at the cluster's
# version (build.sh), never one on the host's PATH: a fresh machine may have
# none, or one several minor versions away (kubectl's skew policy is +-1).
kubectl() {
  [[ -x $KUBECTL ]] || { echo "$KUBECTL missing; run hack/cluster/build.sh first" >&2; return 127; }
  "$KUBECTL" "$@"
}

# kubectl_wait TIMEOUT_S ARGS...: `kubectl wait ARGS` retried until TIMEOUT_S
# has passed. A freshly created object can have no status, or null conditions,
# for a moment (kubectl then fails at once with ".status.conditions accessor
# error: <nil>"), and a selector can match nothing yet; both are retried.
kubectl_wait() {
  local deadline=$((SECONDS + $1)) left out; shift
  while :; do
    left=$((deadline - SECONDS))
    ((left > 0)) || left=1
    if out=$(kubectl wait "$@" --timeout="${left}s" 2>&1); then printf '%s\n' "$out"; return 0; fi
    ((SECONDS < deadline)) || { printf 'kubectl wait %s: %s\n' "$*" "$out" >&2; return 1; }
    sleep 1
  done
}

# The real node (docs/real-node.md): a kubelet and containerd on this machine.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
KUBELET_BIN=$VG_BIN/kubelet-$K8S_VERSION
CONTAINERD_BIN=$VG_BIN/containerd-$CONTAINERD_VERSION
# Debian packages the real node needs: runc, CNI plugins (bridge, host-local,
# loopback), a static busybox for the local images, and iptables (the route
# from pods to the API server, realnode-config.sh).
REAL_NODE_DEBS="runc containernetworking-plugins busybox-static iptables"
RUNC=${RUNC:-/usr/sbin/runc}
CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}
BUSYBOX=${BUSYBOX:-/bin/busybox}
# Images built locally (hack/cluster/images.sh), never pulled.
PAUSE_IMAGE=registry.k8s.io/pause:3.10
WORKLOAD_IMAGE=vramguard.local/busybox:1
REAL_NODE_NAME=real-node-1
REAL_NODE_STATE=${VG_REAL_NODE_STATE:-$VG_CACHE/realnode-${VG_CLUSTER_NAME:-vramguard}}
# The simulated GPU of the real node (docs/real-node.md): the driver's socket,
# in a directory that pods mount at /run/simgpu (hostPath).
SIMGPU_DIR=$REAL_NODE_STATE/simgpu
SIMGPU_SOCKET=$SIMGPU_DIR/driver.sock
