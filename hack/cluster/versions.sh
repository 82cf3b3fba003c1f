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

# The real node (docs/real-node.md): a kubelet and containerd on this machine.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
KUBELET_BIN=$VG_BIN/kubelet-$K8S_VERSION
CONTAINERD_BIN=$VG_BIN/containerd-$CONTAINERD_VERSION
# Debian packages the real node needs: runc, CNI plugins (bridge, host-local,
# loopback) and a static busybox for the local images.
REAL_NODE_DEBS="runc containernetworking-plugins busybox-static"
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
