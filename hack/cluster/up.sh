#!/usr/bin/env bash
# Start (or reuse) the local cluster: kwokctl's binary runtime with the binaries
# that build.sh cached, then register the fake GPU nodes and, where the machine
# allows, the real node (VG_REAL_NODE=auto|on|off, hack/cluster/realnode.sh).
# Nothing is downloaded. Prints the KUBECONFIG to use on its last line.
# The API server writes an audit log (see audit_policy below);
# `up.sh --print-audit-log` prints its path and does nothing else.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/versions.sh"

CLUSTER_NAME=${VG_CLUSTER_NAME:-vramguard}
export KWOK_WORKDIR=${KWOK_WORKDIR:-$VG_CACHE/kwok}
export KUBECONFIG=${VG_KUBECONFIG:-$VG_CACHE/kubeconfig}
export KWOK_KUBE_VERSION=$K8S_VERSION
# kwokctl's own kubectl (kwokctl kubectl, kubectl proxy): ours, never a download.
export KWOK_KUBECTL_BINARY=$KUBECTL
kwokctl=$KWOK_BIN/kwokctl

# Audit log: every request a ServiceAccount outside kube-system makes, at
# Metadata level (who, verb, resource, subresource, response code; no bodies),
# one line per request (the RequestReceived stage is left out). Requests of
# the control plane and of kubectl, including `kubectl --as=...`
# impersonation (the policy sees the impersonating user), are not logged,
# which keeps the file small. tests/e2e/test_chart_e2e.py reads it to prove
# the chart's RBAC. kwokctl's binary runtime copies the policy to
# <workdir>/audit.yaml and has the API server write <workdir>/logs/audit.log
# (kwok v0.8.0, pkg/kwokctl/runtime/binary/cluster_setup.go).
cluster_dir=$KWOK_WORKDIR/clusters/$CLUSTER_NAME
audit_log=$cluster_dir/logs/audit.log
if [[ ${1:-} == --print-audit-log ]]; then
  echo "$audit_log"
  exit 0
fi
audit_policy=$KWOK_WORKDIR/audit-policy.yaml
mkdir -p "$KWOK_WORKDIR"
cat >"$audit_policy" <<'EOF_POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
EOF_POLICY

# kwokctl's configuration: kwok-controller plays only the nodes annotated
# kwok.x-k8s.io/node=fake (kwokctl's default, --manage-all-nodes=true, would take
# over the real node); the API server reaches kubelets at their InternalIP (no
# DNS knows the node names) and authenticates with the admin certificate (logs,
# exec, the summary API). Pods on the real node reach the API server as in a
# cluster: through the kubernetes Service's address (10.0.0.1, the API server's
# default service range), which realnode.sh routes to it as kube-proxy would,
# so the serving certificate names it; and the API server calls webhooks at
# their Service's endpoints (--enable-aggregator-routing; no kube-proxy here).
kwokctl_config=$KWOK_WORKDIR/kwokctl-$CLUSTER_NAME.yaml
cat >"$kwokctl_config" <<EOF_CONFIG
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: ["10.0.0.1"]
componentsPatches:
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: "false", override: true}
  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}
- name: kube-apiserver
  extraArgs:
  - {key: kubelet-client-certificate, value: $cluster_dir/pki/admin.crt}
  - {key: kubelet-client-key, value: $cluster_dir/pki/admin.key}
  - {key: kubelet-preferred-address-types, value: "InternalIP,Hostname"}
  - {key: enable-aggregator-routing, value: "true"}
EOF_CONFIG

for b in "$K8S_BIN/kube-apiserver" "$ETCD_BIN/etcd" "$kwokctl" "$KUBECTL"; do
  [[ -x $b ]] || { echo "up: $b missing; run hack/cluster/build.sh first" >&2; exit 1; }
done

healthy() { kubectl get --raw /readyz >/dev/null 2>&1; }

t0=$SECONDS
if healthy && { ! cmp -s "$audit_policy" "$cluster_dir/audit.yaml" ||
                ! grep -q enable-aggregator-routing "$cluster_dir/kwok.yaml"; }; then
  # Made before the audit log was on (or with another policy), or before kwok was
  # kept off the real node and the real node's pods could reach the API server:
  # the RBAC test could not read what it needs, kwok would take the real node
  # over, the chart's pods could not run there; so the cluster is made again.
  echo "up: cluster $CLUSTER_NAME runs without this audit policy or kwokctl configuration; recreating it"
  "$here/realnode.sh" down | sed 's/^realnode: /up: real node: /'
  "$kwokctl" delete cluster --name "$CLUSTER_NAME" --kubeconfig "$KUBECONFIG" >/dev/null 2>&1 || true
fi
if healthy; then
  echo "up: reusing cluster $CLUSTER_NAME"
else
  # A stopped or half-made cluster is removed first so that create starts clean.
  "$kwokctl" delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  # The runtime is set explicitly: left to itself kwokctl probes for docker,
  # and this machine has a docker client without an engine.
  "$kwokctl" create cluster --name "$CLUSTER_NAME" --runtime binary --config "$kwokctl_config" \
    --kube-apiserver-binary "$K8S_BIN/kube-apiserver" \
    --kube-controller-manager-binary "$K8S_BIN/kube-controller-manager" \
    --kube-scheduler-binary "$K8S_BIN/kube-scheduler" \
    --etcd-binary "$ETCD_BIN/etcd" \
    --kwok-controller-binary "$KWOK_BIN/kwok" \
    --kube-audit-policy "$audit_policy" \
    --kubeconfig "$KUBECONFIG" --timeout 5m --wait 2m
  echo "up: cluster started in $((SECONDS - t0)) s"
fi
kubectl apply -f "$here/gpu-nodes.yaml" >/dev/null
kubectl_wait 120 --for=condition=Ready node -l type=kwok >/dev/null
"$here/realnode.sh" up | sed 's/^realnode: /up: real node: /'
echo "up: nodes ready: $(kubectl get nodes -o name | tr '\n' ' ')"
echo "export KUBECONFIG=$KUBECONFIG"
