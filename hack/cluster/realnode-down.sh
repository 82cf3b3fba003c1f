# Stopping the real node and removing all it left; sourced by realnode.sh.
# Order matters: pods go through the API first (graceful, as on any node), then
# the kubelet stops, then whatever containers remain are killed through
# containerd, containerd stops, stray shims and cgroup members are killed, and
# only then are mounts, cgroups, the bridge and the state removed.

stop_pid() {  # stop_pid PIDFILE: SIGTERM, up to 10 s, then SIGKILL
  local file=$1 pid i
  [[ -s $file ]] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

remove_containers() {  # remove_containers STATE: every container left in that containerd
  local sock=$1/run/containerd.sock ctr id
  ctr=("$CONTAINERD_BIN/ctr" --address "$sock" -n k8s.io)
  "${ctr[@]}" version >/dev/null 2>&1 || return 0
  for id in $("${ctr[@]}" containers ls -q 2>/dev/null); do
    "${ctr[@]}" tasks delete --force "$id" >/dev/null 2>&1 || true
    "${ctr[@]}" containers delete "$id" >/dev/null 2>&1 || true
  done
}

kill_shims() {  # kill_shims STATE: runc shims started by that containerd (they outlive it by design)
  local sock=$1/run/containerd.sock f pid
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}; pid=${pid%/cmdline}
    { tr '\0' ' ' <"$f"; } 2>/dev/null | grep -q -- "containerd-shim-runc-v2 .*-address $sock " && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}

kill_pods_processes() {  # anything still in a pod cgroup (kubepods)
  local root try pids
  for try in 1 2 3 4 5; do
    pids=$(for root in $(cgroup_roots); do
      [[ -d $root/kubepods ]] && find "$root/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null
    done | sort -u)
    [[ -z $pids ]] && return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
  done
}

under() { awk -v d="$1" '$0 == d || index($0, d "/") == 1'; }  # the lines naming DIR or a path below it

unmount_under() {  # unmount_under DIR: every mount at or below DIR, deepest first
  local dir=$1 target try
  for try in 1 2 3; do
    local targets; targets=$(findmnt -rn -o TARGET | under "$dir" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
    [[ -z $targets ]] && return 0
    for target in $targets; do umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true; done
  done
  [[ -z $(findmnt -rn -o TARGET | under "$dir") ]]
}

remove_cgroups() {  # the kubelet's kubepods tree in every hierarchy, leaves first
  local root
  for root in $(cgroup_roots); do
    [[ -d $root/kubepods ]] && find "$root/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  for root in $(cgroup_roots); do [[ ! -d $root/kubepods ]] || return 1; done
}

restore_sysctls() {  # restore_sysctls STATE
  local line
  [[ -s $1/sysctls ]] || return 0
  while read -r line; do sysctl -q -w "$line" >/dev/null 2>&1 || say "could not restore $line"; done <"$1/sysctls"
}

remove_host_paths() {  # remove_host_paths STATE: the paths outside STATE that its first start created
  local p
  [[ -s $1/host-paths-created ]] || return 0
  while read -r p; do
    # Never through a mount (none is expected there).
    [[ -z $(findmnt -rn -o TARGET | under "$p") ]] && rm -rf "$p"
  done <"$1/host-paths-created"
}

cleanup() {  # cleanup STATE: stop and remove everything of the real node whose state is STATE
  local state=$1 ok=true
  stop_pid "$state/kubelet.pid"
  remove_containers "$state"
  stop_pid "$state/containerd.pid"
  kill_shims "$state"
  kill_pods_processes
  stop_pid "$state/simgpu.pid"
  unmount_under "$state" || { say "mounts left under $state: $(findmnt -rn -o TARGET | under "$state" | tr '\n' ' ')"; ok=false; }
  remove_cgroups || { say "cgroups left: $(cgroup_roots | sed 's|$|/kubepods|' | xargs -r ls -d 2>/dev/null | tr '\n' ' ')"; ok=false; }
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  unroute_api_service
  restore_sysctls "$state"
  # Never rm -rf through a mount that is still there: it could be a bind mount of host files.
  if $ok; then remove_host_paths "$state"; rm -rf "$state"; fi
  [[ $(awk '{print $2}' "$LOCK" 2>/dev/null) == "$state" ]] && rm -f "$LOCK"
  $ok
}

cmd_down() {
  local holder; holder=$(lock_holder)
  if [[ -n $holder && $holder != "$CLUSTER_NAME" ]]; then
    # Nothing to say unless this cluster expected it (its state directory exists).
    [[ -d $STATE ]] && say "the real node belongs to cluster '$holder'; nothing of it to stop here"
    return 0
  fi
  [[ -n $holder || -d $STATE ]] || return 0
  local t0=$SECONDS
  if pid_alive "$STATE/kubelet.pid" && kubectl get --raw /readyz >/dev/null 2>&1; then
    # As on any node: the kubelet stops each pod within its grace period.
    kubectl delete pods -A --field-selector "spec.nodeName=$REAL_NODE_NAME" --wait=true --timeout=60s >/dev/null 2>&1 || true
  fi
  cleanup "$STATE" || { echo "realnode: $REAL_NODE_NAME stopped, but not all was removed (see above)" >&2; return 1; }
  kubectl delete node "$REAL_NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  say "$REAL_NODE_NAME stopped in $((SECONDS - t0)) s; no processes, mounts or cgroups left"
}
