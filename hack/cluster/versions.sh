# Versions and cache paths of the local cluster's binaries; sourced by the
# scripts in hack/cluster/. Caches live outside the repo so a fresh clone reuses them.
K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}

VG_CACHE=${VG_CACHE:-$HOME/.cache/vramguard}
VG_BIN=$VG_CACHE/bin
GOMODCACHE=${VG_GOMODCACHE:-$VG_CACHE/gomod}
GOCACHE=${VG_GOCACHE:-$VG_CACHE/gobuild}
K8S_BIN=$VG_BIN/kubernetes-$K8S_VERSION
ETCD_BIN=$VG_BIN/etcd-$ETCD_VERSION
KWOK_BIN=$VG_BIN/kwok-$KWOK_VERSION
HELM_BIN=$VG_BIN/helm-$HELM_VERSION-k8s  # -k8s: built with the Kubernetes version stamped
