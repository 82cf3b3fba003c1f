#!/usr/bin/env bash
# The real node (docs/real-node.md): a kubelet and containerd on this machine,
# registered as real-node-1 in the local cluster beside the kwok nodes.
# Usage: hack/cluster/realnode.sh up|down|check   (up.sh and down.sh call it)
#   up     start it, or reuse it, for the cluster of VG_CLUSTER_NAME/KWOK_WORKDIR/VG_KUBECONFIG.
#          VG_REAL_NODE=auto (default): skipped with a message where the machine
#          cannot run it; on: that is an error; off: skipped.
#   down   stop it and remove all it made: its pods' processes, mounts and cgroups,
#          the CNI bridge, its state; the sysctls the kubelet changes are restored.
#   check  exit 0 if this machine can run it now, else print why and exit 1.
# One cluster per machine at a time has the real node (there is one /kubepods
# cgroup tree and one kubelet port): /run/vramguard-real-node names that cluster.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/versions.sh"

CLUSTER_NAME=${VG_CLUSTER_NAME:-vramguard}
KWOK_WORKDIR=${KWOK_WORKDIR:-$VG_CACHE/kwok}
export KUBECONFIG=${VG_KUBECONFIG:-$VG_CACHE/kubeconfig}
MODE=${VG_REAL_NODE:-auto}
KUBELET_PORT=${VG_REAL_NODE_KUBELET_PORT:-10250}
HEALTHZ_PORT=${VG_REAL_NODE_HEALTHZ_PORT:-10248}
BRIDGE=${VG_REAL_NODE_BRIDGE:-vgcni0}
POD_SUBNET=${VG_REAL_NODE_POD_SUBNET:-10.244.250.0/24}
LOCK=${VG_REAL_NODE_LOCK:-/run/vramguard-real-node}
STATE=$REAL_NODE_STATE
PKI=$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki
SOCK=$STATE/run/containerd.sock
# The kernel settings the kubelet sets at start (pkg/kubelet/cm, setupKernelTunables).
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

say() { echo "realnode: $*"; }
pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
lock_holder() { [[ -s $LOCK ]] && awk '{print $1}' "$LOCK" || true; }

cgroup_roots() {  # the cgroup hierarchies: each v1 controller mount and any v2 mount (hybrid hosts have both)
  findmnt -rn -t cgroup,cgroup2 -o TARGET
}

check() {  # prints why the real node cannot run here, and fails; silent success otherwise
  [[ $(uname -s) == Linux ]] || { echo "not Linux"; return 1; }
  [[ $(id -u) == 0 ]] || { echo "not root (the kubelet and runc need root)"; return 1; }
  local root probe
  for root in $(cgroup_roots); do
    probe=$root/vramguard-probe-$$
    mkdir "$probe" 2>/dev/null && rmdir "$probe" || { echo "cgroups not writable ($root)"; return 1; }
  done
  [[ -n $(cgroup_roots) ]] || { echo "no cgroup hierarchy mounted under /sys/fs/cgroup"; return 1; }
  local b
  for b in "$KUBELET_BIN/kubelet" "$CONTAINERD_BIN/containerd" "$CONTAINERD_BIN/containerd-shim-runc-v2" \
           "$CONTAINERD_BIN/ctr" "$RUNC" "$CNI_BIN_DIR/bridge" "$CNI_BIN_DIR/host-local" "$CNI_BIN_DIR/loopback" "$BUSYBOX"; do
    [[ -x $b ]] || { echo "$b missing (run hack/cluster/build.sh)"; return 1; }
  done
  local holder; holder=$(lock_holder)
  if [[ -n $holder && $holder != "$CLUSTER_NAME" ]]; then
    local their_state; their_state=$(awk '{print $2}' "$LOCK")
    if pid_alive "$their_state/kubelet.pid" || pid_alive "$their_state/containerd.pid"; then
      echo "cluster '$holder' has the real node (one cluster per machine; VG_CLUSTER_NAME=$holder hack/cluster/down.sh frees it)"
      return 1
    fi
  fi
  [[ -r $PKI/ca.key ]] || { echo "no cluster CA key at $PKI/ca.key (start the cluster with hack/cluster/up.sh)"; return 1; }
  # A cluster made before up.sh wrote kwokctl's configuration has kwok managing all nodes.
  grep -q "kubelet-preferred-address-types" "$KWOK_WORKDIR/clusters/$CLUSTER_NAME/kwok.yaml" 2>/dev/null || {
    echo "cluster '$CLUSTER_NAME' was made by an older up.sh (kwok manages all nodes); recreate it (hack/cluster/down.sh, then up.sh)"
    return 1
  }
  if [[ $holder != "$CLUSTER_NAME" ]] || ! pid_alive "$STATE/kubelet.pid"; then
    local port
    for port in "$KUBELET_PORT" "$HEALTHZ_PORT"; do
      [[ -z $(ss -Hltn "sport = :$port") ]] || { echo "port $port in use (VG_REAL_NODE_KUBELET_PORT / _HEALTHZ_PORT)"; return 1; }
    done
  fi
}

source "$here/realnode-config.sh"
source "$here/realnode-down.sh"

start() {  # start NAME COMMAND...: a daemon in its own session, logged and with a pid file under $STATE
  local name=$1; shift
  PATH=$CONTAINERD_BIN:$PATH setsid "$@" >"$STATE/log/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/$name.pid"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local limit=$1 deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { say "$what not ready after $limit s"; return 1; }
    sleep 0.5
  done
}

start_simgpu() {  # the simulated GPU driver (vramguard-sim simgpu-driver), from this checkout's venv
  local py=$root/.venv/bin/python
  [[ -x $py ]] || { say "no simulated GPU: $py missing (make venv)"; return 0; }
  mkdir -p "$SIMGPU_DIR" || return 1
  start simgpu env PYTHONPATH="$root/api:$root/agent:$root/sim" "$py" -m vramguard_sim simgpu-driver \
    --socket "$SIMGPU_SOCKET" --node "$REAL_NODE_NAME"
  wait_for 30 "simulated GPU driver" test -S "$SIMGPU_SOCKET" || return 1
  say "simulated GPU driver at $SIMGPU_SOCKET (pods mount $SIMGPU_DIR at /run/simgpu)"
}

node_ready() {
  [[ $(kubectl get node "$REAL_NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

bring_up() {  # (called in a condition, where set -e does not apply: each step checks itself)
  local t0=$SECONDS
  mkdir -p "$STATE"/{run,log,containerd,kubelet,pods-log,volume-plugins,cni/net.d,cni/ipam,pki} || return 1
  save_sysctls && record_host_paths || return 1
  write_cni_config && write_containerd_config && write_kubelet_config && write_kubelet_kubeconfig || return 1
  start containerd "$CONTAINERD_BIN/containerd" --config "$STATE/containerd.toml"
  wait_for 30 containerd "$CONTAINERD_BIN/ctr" --address "$SOCK" version || return 1
  "$here/images.sh" "$SOCK" | sed 's/^/realnode: /'
  ((PIPESTATUS[0] == 0)) || return 1
  start_simgpu || return 1
  start kubelet "$KUBELET_BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --root-dir "$STATE/kubelet" --cert-dir "$STATE/pki" --hostname-override "$REAL_NODE_NAME" \
    --node-ip "$(node_ip)" --node-labels "$(node_labels)" --v=1
  wait_for 120 "node $REAL_NODE_NAME" node_ready || return 1
  # An extended resource the kubelet keeps as given (Kubernetes docs: "Advertise
  # Extended Resources for a Node"); the simulated GPU behind it comes with issue 19 item 2.
  kubectl patch node "$REAL_NODE_NAME" --subresource=status --type=merge \
    -p '{"status":{"capacity":{"nvidia.com/gpu":"4"}}}' >/dev/null || return 1
  route_api_service || return 1
  say "$REAL_NODE_NAME ready in $((SECONDS - t0)) s (kubelet $K8S_VERSION, containerd $CONTAINERD_VERSION, state $STATE)"
}

cmd_up() {
  case $MODE in
    off) say "off (VG_REAL_NODE=off)"; return 0 ;;
    auto | on) ;;
    *) echo "realnode: VG_REAL_NODE must be auto, on or off, got '$MODE'" >&2; return 2 ;;
  esac
  local why
  if ! why=$(check); then
    [[ $MODE == on ]] && { echo "realnode: cannot start (VG_REAL_NODE=on): $why" >&2; return 1; }
    say "skipped: $why (VG_REAL_NODE=auto; off silences this)"; return 0
  fi
  if [[ $(lock_holder) == "$CLUSTER_NAME" ]] && pid_alive "$STATE/kubelet.pid" && pid_alive "$STATE/containerd.pid" && node_ready; then
    pid_alive "$STATE/simgpu.pid" || start_simgpu
    route_api_service
    say "$REAL_NODE_NAME reused (state $STATE)"; return 0
  fi
  take_lock || { [[ $MODE == on ]] && return 1; return 0; }
  if ! bring_up; then
    local logs; logs=$(tail -n 5 "$STATE"/log/*.log 2>/dev/null || true)
    cleanup "$STATE" >/dev/null 2>&1 || true
    [[ $MODE == on ]] && { printf 'realnode: failed to start (VG_REAL_NODE=on); last log lines:\n%s\n' "$logs" >&2; return 1; }
    say "failed: the kubelet or containerd did not come up; continuing without it (last log lines below)"
    printf '%s\n' "$logs" | sed 's/^/realnode:   /'
  fi
}

take_lock() {  # claim the machine's real node for this cluster, clearing a stopped holder's leftovers first
  local holder; holder=$(lock_holder)
  if [[ -n $holder ]]; then
    local state; state=$(awk '{print $2}' "$LOCK")
    say "clearing what a stopped real node left (cluster '$holder', $state)"
    cleanup "$state" || return 1
  fi
  # Created only if absent (noclobber): of two up.sh at once, one gets it.
  (set -C; echo "$CLUSTER_NAME $STATE" >"$LOCK") 2>/dev/null || {
    say "skipped: cluster '$(lock_holder)' took the real node just now"; return 1
  }
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  check) check ;;
  *) echo "usage: $0 up|down|check" >&2; exit 2 ;;
esac
