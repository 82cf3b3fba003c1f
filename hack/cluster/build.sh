#!/usr/bin/env bash
# Build the local cluster's binaries from Go modules, cached by version under
# ~/.cache/vramguard/bin/<component>-<version>/ so a second run takes seconds.
#   kube-apiserver, kube-controller-manager, kube-scheduler: k8s.io/kubernetes
#   etcd: go.etcd.io/etcd/server/v3;  kwok, kwokctl: sigs.k8s.io/kwok;  helm: helm.sh/helm/v3
# Prints how long each step took. Usage: hack/cluster/build.sh
set -euo pipefail
source "$(dirname "$0")/versions.sh"

mkdir -p "$VG_BIN" "$VG_CACHE/src"
export GOMODCACHE GOCACHE CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

step() {  # step NAME OUTPUT_FILE COMMAND...: run COMMAND unless OUTPUT_FILE exists, and time it
  local name=$1 out=$2; shift 2
  if [[ -x $out ]]; then echo "build: $name cached ($out)"; return; fi
  local t0=$SECONDS
  "$@"
  echo "build: $name built in $((SECONDS - t0)) s"
}

build_kubernetes() {
  local dir="$VG_CACHE/src/kubernetes-$K8S_VERSION" minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging=v0.${K8S_VERSION#v1.}
  mkdir -p "$dir" "$K8S_BIN.tmp"
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
  printf 'package wrapper\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' > "$dir/wrapper.go"
  local pkg=k8s.io/component-base/version cpkg=k8s.io/client-go/pkg/version ld="-s -w"
  for p in $pkg $cpkg; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$dir" && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && go build -trimpath -ldflags "$ld" -o "$K8S_BIN.tmp/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler)
  mv "$K8S_BIN.tmp" "$K8S_BIN"
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
step "kubernetes $K8S_VERSION" "$K8S_BIN/kube-apiserver" build_kubernetes
echo "build: all binaries ready in $((SECONDS - total0)) s"
