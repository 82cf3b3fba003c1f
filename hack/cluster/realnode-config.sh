# Configuration files of the real node, written under $STATE; sourced by realnode.sh.
# Every path the kubelet and containerd write to is under $STATE, not /var/lib
# or /run/containerd, so that down.sh can remove all of it.

node_ip() {  # the machine's first global IPv4 address (the kubelet refuses a loopback node IP)
  ip -4 -o addr show scope global | awk -v br="$BRIDGE" '$2 != br {split($4, a, "/"); print a[1]; exit}'
}

node_labels() {  # like a GPU node: GPU feature discovery's labels (see gpu-nodes.yaml)
  local l="vramguard.io/real-node=true,type=real,nvidia.com/gpu.present=true"
  l+=",nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3,nvidia.com/gpu.memory=81559,nvidia.com/gpu.count=1"
  l+=",nvidia.com/gpu.replicas=4,nvidia.com/gpu.sharing-strategy=time-slicing,nvidia.com/cuda.driver-version.full=570.133.20"
  echo "$l"
}

save_sysctls() {  # what the kubelet and the CNI bridge (ip_forward) may change, restored by down
  [[ -s $STATE/sysctls ]] && return
  local s
  for s in $SYSCTLS net.ipv4.ip_forward; do echo "$s=$(sysctl -n "$s")"; done >"$STATE/sysctls.tmp"
  mv "$STATE/sysctls.tmp" "$STATE/sysctls"
}

# Paths outside $STATE that the kubelet, libcni and containerd's shims use whatever
# their configuration says (the device plugin socket directory, CNI's result
# cache, the shims' socket directory, util-linux's mount table). Those that did
# not exist before the first start are removed by down.
HOST_PATHS="/var/lib/kubelet /var/lib/cni /run/containerd /run/mount"

record_host_paths() {
  [[ -f $STATE/host-paths-created ]] && return
  local p
  for p in $HOST_PATHS; do [[ -e $p ]] || echo "$p"; done >"$STATE/host-paths-created"
}

write_cni_config() {  # a bridge with host-local addresses, so that the node is Ready and pods get an IP
  local gateway=${POD_SUBNET%.*}.1
  cat >"$STATE/cni/net.d/10-vramguard.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vramguard-real-node",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": false,
    "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam",
             "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$gateway"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
EOF
}

write_containerd_config() {
  local cri=plugins.\"io.containerd.cri.v1.runtime\"
  cat >"$STATE/containerd.toml" <<EOF
version = 3
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
# NRI would open /var/run/nri; nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"

[$cri]
  # Without CAP_SYS_RESOURCE runc cannot lower oom_score_adj below the parent's
  # and fails to create any container ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [$cri.containerd]
    default_runtime_name = "runc"
    [$cri.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [$cri.containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        Root = "$STATE/runc"
        SystemdCgroup = false
  [$cri.cni]
    bin_dirs = ["$CNI_BIN_DIR"]
    conf_dir = "$STATE/cni/net.d"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$PAUSE_IMAGE"
EOF
}

write_kubelet_config() {
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 machines need failCgroupV1: false (on by default since 1.35); cgroupfs,
# not systemd, because the machine need not run systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /
containerRuntimeEndpoint: unix://$SOCK
address: $(node_ip)
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
registerWithTaints:
- {key: vramguard.io/real-node, value: "true", effect: NoSchedule}
podLogsDir: $STATE/pods-log
volumePluginDir: $STATE/volume-plugins
# A shared build machine: low thresholds, so that others' disk use does not evict test pods.
evictionHard: {memory.available: 100Mi, nodefs.available: 3%, imagefs.available: 3%}
imageGCHighThresholdPercent: 97
imageGCLowThresholdPercent: 95
maxPods: 30
failSwapOn: false
EOF
}

write_kubelet_kubeconfig() {  # a node identity (system:node:<name>), so the Node authorizer applies as in production
  local key=$STATE/pki/kubelet-client.key crt=$STATE/pki/kubelet-client.crt server
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  openssl ecparam -name prime256v1 -genkey -noout -out "$key" 2>/dev/null
  openssl req -new -key "$key" -subj "/O=system:nodes/CN=system:node:$REAL_NODE_NAME" 2>/dev/null |
    openssl x509 -req -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
      -days 30 -out "$crt" 2>/dev/null
  cat >"$STATE/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "$server", certificate-authority: "$PKI/ca.crt"}
users:
- name: $REAL_NODE_NAME
  user: {client-certificate: "$crt", client-key: "$key"}
contexts:
- name: $REAL_NODE_NAME
  context: {cluster: local, user: $REAL_NODE_NAME}
current-context: $REAL_NODE_NAME
EOF
}

# kube-proxy's part for the one Service the chart's pods need: the kubelet gives
# every pod KUBERNETES_SERVICE_HOST/PORT, the kubernetes Service's address, and
# nothing here routes Services. A DNAT rule sends what pods send there to the
# API server on this machine (its certificate names 10.0.0.1, see up.sh).
API_ROUTE_COMMENT=vramguard-real-node-api
route_api_service() {
  command -v iptables >/dev/null || { say "no iptables: pods cannot reach the API server (chart tests skip)"; return 0; }
  local service server rule
  service=$(kubectl get service kubernetes -n default -o jsonpath='{.spec.clusterIP} {.spec.ports[0].port}') || return 1
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  server=${server##*:}
  set -- $service
  rule=(PREROUTING -s "$POD_SUBNET" -d "$1" -p tcp --dport "$2" -m comment --comment "$API_ROUTE_COMMENT"
        -j DNAT --to-destination "$(node_ip):${server%%/*}")
  iptables -t nat -C "${rule[@]}" 2>/dev/null || iptables -t nat -A "${rule[@]}"
}

unroute_api_service() {  # remove the rule above (down)
  command -v iptables >/dev/null || return 0
  local line
  iptables -t nat -S PREROUTING 2>/dev/null | grep -- "--comment $API_ROUTE_COMMENT" | while read -r line; do
    eval "iptables -t nat ${line/-A /-D }"
  done
}
