#!/usr/bin/env bash
# Build the local cluster's binaries from Go modules, cached by version under
# ~/.cache/vramguard/bin/<component>-<version>/ so a second run takes seconds.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl: k8s.io/kubernetes
#     (kubectl at the cluster's version: every script, the demo and the e2e tests
#     use this one, never a kubectl on the host's PATH)
#   promtool (make verify checks the chart's alert rules): github.com/prometheus/prometheus
#   etcd: go.etcd.io/etcd/server/v3;  kwok, kwokctl: sigs.k8s.io/kwok;  helm: helm.sh/helm/v3
#   the real node (VG_REAL_NODE, docs/real-node.md): kubelet from k8s.io/kubernetes;
#   containerd, containerd-shim-runc-v2, ctr from github.com/containerd/containerd/v2;
#   runc, CNI plugins and busybox-static from Debian packages (apt)
# Prints how long each step took. Usage: hack/cluster/build.sh
set -euo pipefail
source "$(dirname "$0")/versions.sh"

mkdir -p "$VG_BIN" "$VG_CACHE/src"
export GOMODCACHE GOCACHE CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

# One build at a time per cache: a second build.sh (another checkout, make test
# and make demo at once) waits here and then finds the binaries cached.
exec 9>"$VG_CACHE/.build.lock"
if ! flock -n 9; then
  echo "build: another hack/cluster/build.sh is running; waiting for it"
  flock 9
fi

step() {  # step NAME OUTPUT_FILE COMMAND...: run COMMAND unless OUTPUT_FILE exists, and time it
  local name=$1 out=$2; shift 2
  if [[ -x $out ]]; then echo "build: $name cached ($out)"; return; fi
  local t0=$SECONDS
  "$@"
  echo "build: $name built in $((SECONDS - t0)) s"
}

kubernetes_wrapper() {  # write the wrapper module for k8s.io/kubernetes; sets K8S_WRAPPER and K8S_LDFLAGS
  local dir="$VG_CACHE/src/kubernetes-$K8S_VERSION" minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging=v0.${K8S_VERSION#v1.}
  mkdir -p "$dir"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 through relative
  # replace lines that do not apply to a dependent module; pin each one to its
  # published tag instead, reading the list from the module's own go.mod.
  local modfile; modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module vramguard.local/kubernetes-wrapper"; echo; echo "go 1.26"; echo
    echo "require k8s.io/kubernetes $K8S_VERSION"; echo
    grep -oE '^\s*k8s.io/[a-z0-9-]+ => \./staging' "$modfile" | awk '{print $1}' | sort -u |
      while read -r m; do echo "replace $m => $m $staging"; done
  } > "$dir/go.mod"
  # The programs' imports, so that go.sum covers the kubelet's and kubectl's dependencies too
  # (cmd/kubectl is a main package importing k8s.io/kubectl/pkg/cmd and client-go's auth plugins).
  printf 'package wrapper\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n\t_ "k8s.io/kubernetes/cmd/kubelet/app"\n\t_ "k8s.io/kubectl/pkg/cmd"\n\t_ "k8s.io/client-go/plugin/pkg/client/auth"\n)\n' > "$dir/wrapper.go"
  local pkg=k8s.io/component-base/version cpkg=k8s.io/client-go/pkg/version ld="-s -w"
  for p in $pkg $cpkg; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$dir" && go mod tidy >/dev/null 2>&1 || true)
  K8S_WRAPPER=$dir K8S_LDFLAGS=$ld
}

build_kubernetes() {
  kubernetes_wrapper
  mkdir -p "$K8S_BIN.tmp"
  (cd "$K8S_WRAPPER" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$K8S_BIN.tmp/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler)
  mv "$K8S_BIN.tmp" "$K8S_BIN"
}

build_kubectl() {  # kubectl at the cluster's version, from the same wrapper module and version stamps
  kubernetes_wrapper
  mkdir -p "$KUBECTL_BIN.tmp"
  (cd "$K8S_WRAPPER" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$KUBECTL_BIN.tmp/kubectl" \
     k8s.io/kubernetes/cmd/kubectl)
  mv "$KUBECTL_BIN.tmp" "$KUBECTL_BIN"
}

build_kubelet() {  # the real node's kubelet, from the same wrapper module (CGO_ENABLED=0 as above)
  kubernetes_wrapper
  mkdir -p "$KUBELET_BIN.tmp"
  (cd "$K8S_WRAPPER" && go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$KUBELET_BIN.tmp/kubelet" \
     k8s.io/kubernetes/cmd/kubelet)
  mv "$KUBELET_BIN.tmp" "$KUBELET_BIN"
}

build_containerd() {  # containerd, its runc shim and ctr; the version stamped as containerd's Makefile does
  local mod=github.com/containerd/containerd/v2
  mkdir -p "$CONTAINERD_BIN.tmp"
  GOBIN="$CONTAINERD_BIN.tmp" go install -trimpath \
    -ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=github.com/containerd/containerd" \
    "$mod/cmd/containerd@$CONTAINERD_VERSION" "$mod/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$mod/cmd/ctr@$CONTAINERD_VERSION"
  mv "$CONTAINERD_BIN.tmp" "$CONTAINERD_BIN"
}

install_debs() {  # install_debs PACKAGE...: the missing ones, through apt
  local missing=() p
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
  if ((${#missing[@]} == 0)); then echo "build: Debian packages $* installed"; return; fi
  local t0=$SECONDS
  # apt's lists may be missing or old on a fresh machine; refresh them once.
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "build: Debian packages ${missing[*]} installed in $((SECONDS - t0)) s"
  elif [[ ${VG_REAL_NODE:-auto} == on ]]; then
    echo "build: could not install ${missing[*]} (apt-get failed; VG_REAL_NODE=on)" >&2; return 1
  else
    echo "build: could not install ${missing[*]} (apt-get failed): the real node will be skipped"
  fi
}

build_etcd() {  # etcd in its own module so its dependencies never move the Kubernetes build
  local dir="$VG_CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$dir" "$ETCD_BIN.tmp"
  printf 'module vramguard.local/etcd-wrapper\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$dir/go.mod"
  printf 'package wrapper\n\nimport _ "go.etcd.io/etcd/server/v3/embed"\n' > "$dir/wrapper.go"
  (cd "$dir" && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN.tmp/etcd" go.etcd.io/etcd/server/v3)
  mv "$ETCD_BIN.tmp" "$ETCD_BIN"
}

go_install() {  # go_install DEST_DIR PACKAGE@VERSION...
  local dest=$1; shift
  mkdir -p "$dest.tmp"
  GOBIN="$dest.tmp" go install -trimpath -ldflags "-s -w" "$@"
  mv "$dest.tmp" "$dest"
}

build_helm() {
  # helm's own Makefile stamps the Kubernetes version its client libraries
  # support; without it `helm template` assumes Kubernetes 1.20 and rejects
  # charts that require newer. Read that version from helm's go.mod.
  local modfile minor ld
  modfile=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  minor=$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$modfile")
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in lint/rules chartutil; do
    ld+=" -X helm.sh/helm/v3/pkg/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$p.k8sVersionMinor=$minor"
  done
  mkdir -p "$HELM_BIN.tmp"
  GOBIN="$HELM_BIN.tmp" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$HELM_BIN.tmp" "$HELM_BIN"
}

total0=$SECONDS
step "etcd $ETCD_VERSION" "$ETCD_BIN/etcd" build_etcd
step "kwok $KWOK_VERSION" "$KWOK_BIN/kwokctl" go_install "$KWOK_BIN" \
  "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
step "helm $HELM_VERSION" "$HELM_BIN/helm" build_helm
step "promtool $PROMETHEUS_VERSION" "$PROMTOOL_BIN/promtool" go_install "$PROMTOOL_BIN" \
  "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
step "kubernetes $K8S_VERSION" "$K8S_BIN/kube-apiserver" build_kubernetes
step "kubectl $K8S_VERSION" "$KUBECTL" build_kubectl
# The real node (docs/real-node.md) needs root for its Debian packages, cgroups and mounts.
case ${VG_REAL_NODE:-auto} in
  off) echo "build: real node off (VG_REAL_NODE=off): kubelet and containerd not built" ;;
  auto | on)
    if [[ $(id -u) != 0 && ${VG_REAL_NODE:-auto} == auto ]]; then
      echo "build: real node skipped: not root (VG_REAL_NODE=auto); kubelet and containerd not built"
    else
      step "kubelet $K8S_VERSION" "$KUBELET_BIN/kubelet" build_kubelet
      step "containerd $CONTAINERD_VERSION" "$CONTAINERD_BIN/ctr" build_containerd
      install_debs $REAL_NODE_DEBS
    fi ;;
  *) echo "build: VG_REAL_NODE must be auto, on or off, got '$VG_REAL_NODE'" >&2; exit 2 ;;
esac
echo "build: all binaries ready in $((SECONDS - total0)) s"
