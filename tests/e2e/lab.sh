#!/usr/bin/env bash
# The end-to-end lab: a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler, processes on 127.0.0.1) and one or more GPU nodes, each a privileged podman container
# with systemd running containerd and the kubelet as systemd services.
#
#   tests/e2e/lab.sh up [NODES]      build what is missing, start everything, wait until nodes are Ready
#   tests/e2e/lab.sh down            stop and remove everything the lab created
#   tests/e2e/lab.sh status          control-plane processes, node containers, `kubectl get nodes`
#   tests/e2e/lab.sh kubeconfig      print the admin kubeconfig path
#   tests/e2e/lab.sh kubectl ARGS    run the lab's kubectl against the lab
#   tests/e2e/lab.sh node-exec N CMD run CMD inside node container N (1-based)
#   tests/e2e/lab.sh nodes           print the node names, one per line
#   tests/e2e/lab.sh inventory [SPEC...]  prepare the nodes for playbooks/site.yml and print an Ansible
#                                    inventory (YAML) for them; SPEC i is node i's simulated-GPU spec
#                                    (a name from tests/fixtures/simulated/ or a path; default h100x8).
#                                    It connects over SSH as the unprivileged user gpuops with become,
#                                    pipelining and ControlPersist (GPUOPS_LAB_CONNECTION=podman: as root
#                                    through podman exec instead, for debugging)
#   tests/e2e/lab.sh ssh N [CMD]     ssh to node N as that user, the way the inventory does
#   tests/e2e/lab.sh spec-path N     print where node N's simulated-GPU spec lives on this machine
#
# Everything it creates is named gpuops-lab-*: containers gpuops-lab-node-N, volumes
# gpuops-lab-node-N-containerd, bridges gpuopslabN, state under $GPUOPS_LAB_DIR
# (default $GPUOPS_CACHE/lab). Ports on 127.0.0.1 (chosen high and unusual, below the ephemeral
# range): etcd 26379/26380, kube-apiserver 26443, kubelet of node N 26250+N, its healthz 26270+N,
# kube-controller-manager 26290, kube-scheduler 26291 (their healthz), sshd of node N 26230+N.
# Every node runs sshd (its own host keys) and has the user gpuops with passwordless sudo, logging in
# with the key $GPUOPS_LAB_DIR/ssh/id_ed25519 that `up` generates; known_hosts is beside it.
# GPUOPS_LAB_INSTANCE=I (1-4) runs another lab beside the default one (0): names gpuops-labI-*,
# bridges gpuopslabIN, ports +1000*I, subnets 10.(231+I).N.0/24, state under $GPUOPS_CACHE/labI.
# `inventory` serves the container toolkit repository and the device plugin's wheels on
# 127.0.0.1:31000+I, and gives node N's device plugin the metrics port 31010+10*I+N.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
instance=${GPUOPS_LAB_INSTANCE:-0}
if ! [[ $instance =~ ^[0-4]$ ]]; then
  printf '[lab] error: GPUOPS_LAB_INSTANCE must be 0-4, got %s\n' "$instance" >&2
  exit 2
fi
if [ "$instance" = 0 ]; then suffix=''; else suffix=$instance; fi
lab=${GPUOPS_LAB_DIR:-$cache/lab$suffix}
nodes_default=${GPUOPS_LAB_NODES:-1}
port_offset=$((instance * 1000))
etcd_port=$((26379 + port_offset))
etcd_peer_port=$((26380 + port_offset))
api_port=$((26443 + port_offset))
kubelet_port_base=$((26250 + port_offset))
healthz_port_base=$((26270 + port_offset))
controller_manager_port=$((26290 + port_offset))
scheduler_port=$((26291 + port_offset))
ssh_port_base=$((26230 + port_offset))
ssh_user=gpuops
connection=${GPUOPS_LAB_CONNECTION:-ssh}
net_prefix=10.$((231 + instance))
pause_image=localhost/gpuops-lab-pause:1.0
node_image_repo=localhost/gpuops-lab-node
mirror=${GPUOPS_DEBIAN_MIRROR:-}
ready_timeout=${GPUOPS_LAB_READY_TIMEOUT:-240}
serve_port=$((31000 + instance))
metrics_port_base=$((31010 + 10 * instance))
# Where a node's simulated-GPU spec is, inside the node (the node's config directory is mounted at
# /etc/gpuops-lab, so an edit on this machine is an edit on the node, seen by inotify there).
node_spec_path=/etc/gpuops-lab/simulated/gpus.yaml

log() { printf '[lab] %s\n' "$*" >&2; }
die() {
  printf '[lab] error: %s\n' "$*" >&2
  exit 1
}

node_name() { echo "gpuops-lab$suffix-node-$1"; }
bridge_name() { echo "gpuopslab$suffix$1"; }
node_count() { cat "$lab/nodes.count" 2>/dev/null || echo 0; }
ssh_port() { echo $((ssh_port_base + $1)); }

# ---------------------------------------------------------------------------------------------
# Certificates: one CA signs the API server's serving certificate, the admin client (group
# system:masters), the API server's kubelet client, and each kubelet's client certificate
# (system:node:<name> in group system:nodes, what the Node authorizer and NodeRestriction expect).
# ---------------------------------------------------------------------------------------------
pki=$lab/pki

# P-256 keys: as good as RSA here and generated in milliseconds instead of seconds.
genkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

sign_cert() { # name subject [extfile-content]
  local name=$1 subj=$2 ext=${3:-}
  [ -f "$pki/$name.crt" ] && return 0
  genkey "$pki/$name.key"
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" \
    "${ext:-extendedKeyUsage=clientAuth}" > "$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr"
}

make_pki() {
  mkdir -p "$pki"
  chmod 700 "$pki"
  if [ ! -f "$pki/ca.crt" ]; then
    log "generating the lab CA and certificates (openssl)"
    genkey "$pki/ca.key"
    openssl req -x509 -new -key "$pki/ca.key" -out "$pki/ca.crt" -days 30 \
      -subj "/CN=gpuops-lab-ca" 2>/dev/null
  fi
  sign_cert apiserver "/CN=kube-apiserver" \
    "$(printf '%s\n' 'extendedKeyUsage=serverAuth' \
      "subjectAltName=IP:127.0.0.1,IP:$net_prefix.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc")"
  sign_cert admin "/O=system:masters/CN=gpuops-lab-admin"
  sign_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  # The names RBAC's bootstrap policy binds the system:kube-controller-manager and
  # system:kube-scheduler roles to.
  sign_cert kube-controller-manager "/CN=system:kube-controller-manager"
  sign_cert kube-scheduler "/CN=system:kube-scheduler"
  if [ ! -f "$pki/sa.key" ]; then
    genkey "$pki/sa.key"
    openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  fi
}

# The login key of the nodes' user (a fleet's machine credential) and the nodes' host keys.
make_ssh_key() {
  mkdir -p "$lab/ssh"
  chmod 700 "$lab/ssh"
  if [ ! -f "$lab/ssh/id_ed25519" ]; then
    ssh-keygen -q -t ed25519 -N '' -C "gpuops-lab$suffix" -f "$lab/ssh/id_ed25519"
  fi
  touch "$lab/ssh/known_hosts"
}

write_kubeconfig() { # file user cert key
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpuops-lab
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $3
    client-key: $4
contexts:
- name: gpuops-lab
  context: {cluster: gpuops-lab, user: $2}
current-context: gpuops-lab
EOF
}

# ---------------------------------------------------------------------------------------------
# Control plane: etcd and kube-apiserver as background processes, pid files under $lab/run.
# ---------------------------------------------------------------------------------------------
running() { [ -f "$lab/run/$1.pid" ] && kill -0 "$(cat "$lab/run/$1.pid")" 2>/dev/null; }

start_bg() { # name command...
  local name=$1
  shift
  running "$name" && return 0
  mkdir -p "$lab/run" "$lab/logs"
  setsid "$@" >"$lab/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$lab/run/$name.pid"
}

wait_for() { # description timeout command...
  local what=$1 timeout=$2 start=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS - start > timeout)); then
      die "timed out after ${timeout}s waiting for $what (logs: $lab/logs)"
    fi
    sleep 1
  done
  log "$what after $((SECONDS - start))s"
}

start_control_plane() {
  start_bg etcd etcd --name "gpuops-lab$suffix" --data-dir "$lab/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "gpuops-lab$suffix=http://127.0.0.1:$etcd_peer_port" \
    --quota-backend-bytes 536870912
  wait_for "etcd healthy" 60 curl -fsS "http://127.0.0.1:$etcd_port/health"

  # --endpoint-reconciler-type=none: the API server would otherwise try to publish 127.0.0.1 as the
  # kubernetes Service endpoint, which validation refuses (loopback), and log that every 10 s.
  start_bg kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" --etcd-prefix "/gpuops-lab$suffix" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range $net_prefix.0.0/24 --allow-privileged=true --profiling=false \
    --storage-backend etcd3 --v 1
  wait_for "kube-apiserver ready" 120 \
    curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$api_port/readyz"

  start_controller_manager
  start_scheduler
}

# Only the controllers the lab uses: DaemonSets (the device plugin's daemonset mode), Deployments and
# ReplicaSets (workloads a drain moves), PodDisruptionBudgets (disruption: a drain's evictions honour
# them), ServiceAccounts with their tokens and the root CA ConfigMap (pods that mount a token), the
# garbage collector (owned objects go with their owner), namespaces (deleting one empties it).
# Node lifecycle is on: a kubelet registers its node with the node.kubernetes.io/not-ready:NoSchedule
# taint and only that controller removes it once the node is Ready (and puts it back when heartbeats
# stop), so without it neither the scheduler nor the DaemonSet controller places a pod anywhere.
# Taint-based eviction stays off (taint-eviction-controller): on a shared 2-core machine a starved
# kubelet, or one a test restarts on purpose, must not have its pods evicted under the test.
lab_controllers=daemonset-controller,deployment-controller,replicaset-controller,disruption-controller
lab_controllers+=,node-lifecycle-controller,serviceaccount-controller,serviceaccount-token-controller
lab_controllers+=,root-ca-certificate-publisher-controller,garbage-collector-controller,namespace-controller

start_controller_manager() {
  # Each controller acts with its own service account's token (as kubeadm sets it up), so RBAC
  # limits every controller to what its bootstrap role allows. --authentication-skip-lookup (here and
  # for the scheduler): the API server has no front proxy, so there is no request-header CA to read
  # from kube-system/extension-apiserver-authentication, and the lookup would log an error every time.
  start_bg kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$lab/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$lab/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$lab/kube-controller-manager.kubeconfig" --authentication-skip-lookup \
    --bind-address 127.0.0.1 --secure-port "$controller_manager_port" \
    --leader-elect=false --controllers "$lab_controllers" \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --profiling=false --v 1
  wait_for "kube-controller-manager healthy" 120 \
    curl -fsSk "https://127.0.0.1:$controller_manager_port/healthz"
  # Pods need their namespace's default ServiceAccount to pass admission; the controller makes them.
  local ns
  for ns in default kube-system; do
    wait_for "ServiceAccount $ns/default" 60 kctl -n "$ns" get serviceaccount default
  done
}

start_scheduler() {
  start_bg kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$lab/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$lab/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$lab/kube-scheduler.kubeconfig" --authentication-skip-lookup \
    --bind-address 127.0.0.1 --secure-port "$scheduler_port" \
    --leader-elect=false --profiling=false --v 1
  wait_for "kube-scheduler healthy" 120 curl -fsSk "https://127.0.0.1:$scheduler_port/healthz"
}

kctl() { "$bin/kubectl" --kubeconfig "$lab/admin.kubeconfig" "$@"; }

# ---------------------------------------------------------------------------------------------
# Images: the node image (the shared Debian 12 systemd image plus containerd, runc and the CNI
# plugins from Debian) and the pause image (a static pause program in a scratch image).
# ---------------------------------------------------------------------------------------------
build_images() {
  local base base_id hash
  base=$("$repo/scripts/build-base-image.sh")
  base_id=$(podman image inspect --format '{{.Id}}' "$base")
  hash=$(cat "$here/node/Containerfile" "$here/node/"*.service "$here/node/"*.toml "$here/node/"*.conflist "$here/node/"*.sh |
    { cat; echo "$base_id"; } | sha256sum | cut -c1-12)
  node_image=$node_image_repo:$hash
  if ! podman image exists "$node_image"; then
    log "building the node image $node_image (containerd, runc, CNI plugins from Debian; about a minute)"
    podman build -q --network host --build-arg BASE="$base" ${mirror:+--build-arg MIRROR="$mirror"} \
      -t "$node_image" -f "$here/node/Containerfile" "$here/node" >/dev/null
    # Older node images are out of date now; keep only this one.
    local stale
    for stale in $(podman images --format '{{.Repository}}:{{.Tag}}' "$node_image_repo"); do
      if [ "$stale" != "$node_image" ]; then podman rmi "$stale" >/dev/null 2>&1 || true; fi
    done
  fi

  # The pause image is rebuilt only when the pause binary changes (its hash is a label).
  local pause_sum
  pause_sum=$(sha256sum "$bin/pause" | cut -c1-16)
  if [ "$(podman image inspect --format '{{index .Labels "gpuops.pause"}}' "$pause_image" 2>/dev/null)" != "$pause_sum" ]; then
    log "building the pause image $pause_image"
    local ctx
    ctx=$(mktemp -d)
    cp "$bin/pause" "$ctx/pause"
    printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$ctx/Containerfile"
    podman build -q --label "gpuops.pause=$pause_sum" -t "$pause_image" -f "$ctx/Containerfile" "$ctx" >/dev/null
    rm -rf "$ctx"
  fi
  mkdir -p "$lab/images"
  if [ ! -f "$lab/images/pause.tar" ]; then
    podman save -q --format docker-archive -o "$lab/images/pause.tar" "$pause_image" >/dev/null
  fi
}

# ---------------------------------------------------------------------------------------------
# Nodes. Host network: the API server listens on 127.0.0.1 only and every kubelet reaches it there
# without publishing anything; each node therefore gets its own kubelet ports, its own bridge
# (gpuopslabN, pod subnet 10.231.N.0/24) and its own cgroup root (/gpuops-lab-node-N).
# The kubelet refuses a loopback node IP (validateNodeIP), so nodes use the machine's own address
# (the source address of its default route) as InternalIP, and the kubelet listens there.
# ---------------------------------------------------------------------------------------------
detect_node_ip() {
  local ip=${GPUOPS_LAB_NODE_IP:-}
  [ -n "$ip" ] || ip=$(ip -4 -o route get 198.51.100.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
  [ -n "$ip" ] || ip=$(ip -4 -o addr show scope global | awk '$2 !~ /^(podman|gpuopslab|cni|veth)/ {sub("/.*", "", $4); print $4; exit}')
  [ -n "$ip" ] || die "found no IPv4 address for the nodes (set GPUOPS_LAB_NODE_IP)"
  node_ip=$ip
}

write_node_config() { # index
  local i=$1 name dir
  name=$(node_name "$i")
  dir=$lab/nodes/$name
  mkdir -p "$dir"
  sign_cert "kubelet-$name" "/O=system:nodes/CN=system:node:$name"
  cp "$pki/ca.crt" "$dir/ca.crt"
  cp "$pki/kubelet-$name.crt" "$dir/kubelet-client.crt"
  cp "$pki/kubelet-$name.key" "$dir/kubelet-client.key"
  cat >"$dir/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpuops-lab
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: /etc/gpuops-lab/ca.crt
users:
- name: $name
  user:
    client-certificate: /etc/gpuops-lab/kubelet-client.crt
    client-key: /etc/gpuops-lab/kubelet-client.key
contexts:
- name: gpuops-lab
  context: {cluster: gpuops-lab, user: $name}
current-context: gpuops-lab
EOF
  # cgroupfs driver on both sides: the host has no systemd and the node's systemd does not own the
  # (host) cgroup v1 hierarchy the kubelet writes to. failCgroupV1: false keeps the kubelet running
  # on this cgroup v1 host.
  cat >"$dir/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $((kubelet_port_base + i))
healthzBindAddress: 127.0.0.1
healthzPort: $((healthz_port_base + i))
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupRoot: /$name
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: /etc/gpuops-lab/ca.crt}
authorization:
  mode: AlwaysAllow
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
evictionPressureTransitionPeriod: 5s
nodeStatusUpdateFrequency: 5s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
registerNode: true
EOF
  cat >"$dir/kubelet.env" <<EOF
KUBELET_ARGS=--kubeconfig=/etc/gpuops-lab/kubelet.kubeconfig --config=/etc/gpuops-lab/kubelet-config.yaml --hostname-override=$name --node-ip=$node_ip --cert-dir=/var/lib/kubelet/pki --pod-infra-container-image=$pause_image --v=1
GPUOPS_LAB_CGROUP_ROOT=/$name
EOF
  sed -e "s/@BRIDGE@/$(bridge_name "$i")/" -e "s/@SUBNET@/$net_prefix.$i.0\/24/" "$here/node/10-gpuops-lab.conflist" \
    >"$dir/10-gpuops-lab.conflist"
  # sshd on the machine's loopback (host network), a port per node; keys only, no root login.
  cat >"$dir/sshd.conf" <<EOF
Port $(ssh_port "$i")
ListenAddress 127.0.0.1
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowUsers $ssh_user
EOF
  cp "$lab/ssh/id_ed25519.pub" "$dir/ssh-user.pub"
}

start_node() { # index
  local i=$1 name
  name=$(node_name "$i")
  if podman container exists "$name"; then
    [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || podman start "$name" >/dev/null
    return 0
  fi
  log "starting node container $name"
  # containerd's snapshots and the kubelet's state live on volumes, not on the container's overlay.
  local volume
  for volume in "$name-containerd" "$name-kubelet"; do
    podman volume exists "$volume" || podman volume create "$volume" >/dev/null
  done
  podman run -d --name "$name" --hostname "$name" --add-host "$name:127.0.1.1" \
    --privileged --systemd=always --network host --cgroupns private \
    --label gpuops-lab=node --label "gpuops-lab-instance=$instance" \
    -v "$name-containerd:/var/lib/containerd" \
    -v "$name-kubelet:/var/lib/kubelet" \
    -v "$lab/nodes/$name:/etc/gpuops-lab:ro" \
    -v "$bin/kubelet:/usr/local/bin/kubelet:ro" \
    -v "$lab/images:/opt/gpuops-lab/images:ro" \
    "$node_image" >/dev/null
}

node_exec() { # index command...
  local name
  name=$(node_name "$1")
  shift
  podman exec "$name" "$@"
}

node_systemd_up() { # index
  local state
  state=$(node_exec "$1" systemctl is-system-running 2>/dev/null || true)
  [ "$state" = running ] || [ "$state" = degraded ]
}

# Ready, and schedulable: the node lifecycle controller has removed the not-ready taint the kubelet
# registers the node with.
node_ready() { # name
  [ "$(kctl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}/{.spec.taints[?(@.key=="node.kubernetes.io/not-ready")].effect}' 2>/dev/null)" = True/ ]
}

prepare_node() { # index
  local i=$1 name
  name=$(node_name "$i")
  wait_for "$name: systemd up" 90 node_systemd_up "$i"
  wait_for "$name: containerd up" 60 node_exec "$i" ctr version
  if ! node_exec "$i" ctr -n k8s.io images ls -q | grep -qx "$pause_image"; then
    node_exec "$i" ctr -n k8s.io images import /opt/gpuops-lab/images/pause.tar >/dev/null
    log "$name: imported $pause_image into containerd"
  fi
  node_exec "$i" systemctl start kubelet
  setup_ssh "$i"
}

# The node's login: the user with passwordless sudo and the lab's key, the node's own host keys
# (generated on first start), sshd running, and the host key in the lab's known_hosts.
setup_ssh() { # index
  local i=$1 name port key
  name=$(node_name "$i")
  port=$(ssh_port "$i")
  node_exec "$i" sh -euc "
    id -u $ssh_user >/dev/null 2>&1 || useradd -m -s /bin/bash $ssh_user
    install -d -o $ssh_user -g $ssh_user -m 700 /home/$ssh_user/.ssh
    install -o $ssh_user -g $ssh_user -m 600 /etc/gpuops-lab/ssh-user.pub /home/$ssh_user/.ssh/authorized_keys
    printf '%s\n' '$ssh_user ALL=(ALL:ALL) NOPASSWD: ALL' >/etc/sudoers.d/gpuops-lab
    chmod 440 /etc/sudoers.d/gpuops-lab
    ssh-keygen -A >/dev/null
    systemctl enable -q ssh
    systemctl restart ssh"
  key=$(node_exec "$i" cat /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f1,2)
  { grep -v "^\[127.0.0.1\]:$port " "$lab/ssh/known_hosts" || true; echo "[127.0.0.1]:$port $key"; } >"$lab/ssh/known_hosts.new"
  mv "$lab/ssh/known_hosts.new" "$lab/ssh/known_hosts"
  wait_for "$name: sshd on 127.0.0.1:$port" 30 lab_ssh "$i" true
}

ssh_options() { # index
  printf '%s\n' -o BatchMode=yes -o IdentitiesOnly=yes -o "UserKnownHostsFile=$lab/ssh/known_hosts" \
    -o StrictHostKeyChecking=yes -i "$lab/ssh/id_ed25519" -p "$(ssh_port "$1")"
}

lab_ssh() { # index [command...]
  local i=$1
  shift
  local options
  mapfile -t options < <(ssh_options "$i")
  # shellcheck disable=SC2029 # the command runs on the node, as given
  ssh "${options[@]}" "$ssh_user@127.0.0.1" "$@"
}

cmd_up() {
  local n=${1:-$nodes_default} i start=$SECONDS
  [[ $n =~ ^[1-9]$ ]] || die "the node count must be 1-9, got '$n'"
  local old
  old=$(node_count)
  if [ "$old" -gt 0 ] && [ "$old" != "$n" ]; then
    die "the lab is up with $old node(s); run 'lab.sh down' first to change that to $n"
  fi
  mkdir -p "$lab"
  log "building or reusing the Kubernetes binaries"
  bin=$("$here/build-kubernetes.sh")
  echo "$bin" >"$lab/bin.path"
  make_pki
  make_ssh_key
  write_kubeconfig "$lab/admin.kubeconfig" gpuops-lab-admin "$pki/admin.crt" "$pki/admin.key"
  local component
  for component in kube-controller-manager kube-scheduler; do
    write_kubeconfig "$lab/$component.kubeconfig" "system:$component" "$pki/$component.crt" "$pki/$component.key"
  done
  build_images
  echo "$n" >"$lab/nodes.count"
  detect_node_ip
  log "starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler on 127.0.0.1"
  start_control_plane
  for ((i = 1; i <= n; i++)); do
    write_node_config "$i"
    start_node "$i"
  done
  for ((i = 1; i <= n; i++)); do prepare_node "$i"; done
  for ((i = 1; i <= n; i++)); do
    wait_for "$(node_name "$i") Ready" "$ready_timeout" node_ready "$(node_name "$i")"
  done
  log "lab up with $n node(s) in $((SECONDS - start))s; kubeconfig: $lab/admin.kubeconfig"
}

# The node containers' own cgroup paths (from the machine's view), read before they go.
node_cgroup() { # name
  local pid
  pid=$(podman inspect --format '{{.State.Pid}}' "$1" 2>/dev/null || echo 0)
  if [ "$pid" -gt 0 ]; then sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' "/proc/$pid/cgroup" 2>/dev/null || true; fi
}

remove_node_containers() { # names...
  local name cgroup ctrl cgroups=()
  [ $# -gt 0 ] || return 0
  # Every node first: the pod cleanup runs `podman exec`, and a node's systemd shutting down can
  # remove a sibling node's empty name=systemd cgroup, after which exec into that sibling fails.
  for name in "$@"; do
    cgroups+=("$(node_cgroup "$name")")
    if [ "$(podman inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; then
      podman exec "$name" /usr/local/sbin/gpuops-lab-cleanup || log "warning: pod cleanup in $name failed"
    fi
  done
  log "removing node containers $*"
  podman rm -f -t 5 "$@" >/dev/null
  # The kubelet's pod cgroups nest inside each container's own cgroup; podman only removes an empty
  # one. Every process in them died with the container, so they can go now, deepest first.
  for cgroup in "${cgroups[@]}"; do
    if [ -z "$cgroup" ] || [ "$cgroup" = / ]; then continue; fi
    for ctrl in /sys/fs/cgroup/*/; do
      if [ -d "$ctrl${cgroup#/}" ]; then find "$ctrl${cgroup#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
    done
  done
}

cmd_down() {
  local name i volume
  # shellcheck disable=SC2046 # one name per word
  remove_node_containers $(podman ps -a --filter "label=gpuops-lab-instance=$instance" --format '{{.Names}}')
  for ((i = 1; i <= 9; i++)); do
    name=$(node_name "$i")
    for volume in "$name-containerd" "$name-kubelet"; do
      if podman volume exists "$volume"; then podman volume rm -f "$volume" >/dev/null; fi
    done
    if ip link show "$(bridge_name "$i")" >/dev/null 2>&1; then ip link del "$(bridge_name "$i")"; fi
  done
  for p in serve kube-scheduler kube-controller-manager kube-apiserver etcd; do
    if running "$p"; then
      log "stopping $p"
      kill "$(cat "$lab/run/$p.pid")"
      for _ in $(seq 50); do
        running "$p" || break
        sleep 0.2
      done
    fi
  done
  if [ -d "$lab" ]; then
    rm -rf "$lab"
    log "lab removed"
  fi
}

cmd_status() {
  local p
  for p in etcd kube-apiserver kube-controller-manager kube-scheduler serve; do
    if running "$p"; then echo "$p: running (pid $(cat "$lab/run/$p.pid"))"; else echo "$p: stopped"; fi
  done
  podman ps -a --filter "label=gpuops-lab-instance=$instance" --format '{{.Names}}: {{.Status}}'
  if running kube-apiserver; then kctl get nodes -o wide; fi
}

# ---------------------------------------------------------------------------------------------
# Inventory: what playbooks/site.yml needs on the lab's nodes, and an inventory that says so.
# Nothing NVIDIA's servers or a package index would give a real node is fetched at run time: the
# container toolkit comes from the signed local repository (scripts/build-toolkit-repo.sh) and the
# device plugin's pinned wheels from a wheelhouse, both served on 127.0.0.1 (the nodes share the
# machine's network). Debian's own packages come from the node's apt sources.
# ---------------------------------------------------------------------------------------------
python_bin=${GPUOPS_PYTHON:-python3}

resolve_spec() { # name-or-path -> a readable file
  local spec=$1
  if [ -f "$spec" ]; then
    echo "$spec"
  elif [ -f "$repo/tests/fixtures/simulated/$spec.yaml" ]; then
    echo "$repo/tests/fixtures/simulated/$spec.yaml"
  else
    local known=("$repo"/tests/fixtures/simulated/*.yaml)
    known=("${known[@]##*/}")
    die "no simulated-GPU spec '$spec' (give a file, or one of: ${known[*]%.yaml})"
  fi
}

# The device plugin's pinned dependencies (roles/device_plugin/defaults), downloaded once into a
# wheelhouse keyed by the pins: the same key as molecule/plugin's, so both share the download.
wheelhouse() {
  local pins key dir
  pins=$("$python_bin" -c 'import sys, yaml; print(" ".join(sorted(yaml.safe_load(open(sys.argv[1]))["device_plugin_pip_packages"])), end="")' \
    "$repo/roles/device_plugin/defaults/main.yml") || die "cannot read the plugin's pins with $python_bin (it needs PyYAML)"
  key=$(printf '%s' "$pins" | sha256sum | cut -c1-12)
  dir=$cache/wheels/cluster-plugin-$key
  if [ ! -f "$dir/.complete" ]; then
    log "downloading the device plugin's pinned wheels into $dir"
    # shellcheck disable=SC2086 # one pin per word
    "$python_bin" -m pip download -q --only-binary=:all: -d "$dir" $pins >&2
    touch "$dir/.complete"
  fi
  echo "$dir"
}

serve_up() {
  local toolkit wheels
  toolkit=$("$repo/scripts/build-toolkit-repo.sh")
  wheels=$(wheelhouse)
  mkdir -p "$lab/serve"
  ln -sfn "$toolkit" "$lab/serve/toolkit"
  ln -sfn "$wheels" "$lab/serve/wheels"
  start_bg serve "$python_bin" -m http.server --bind 127.0.0.1 --directory "$lab/serve" "$serve_port"
  wait_for "the toolkit repository and the wheels served on 127.0.0.1:$serve_port" 30 \
    curl -fsS "http://127.0.0.1:$serve_port/toolkit/gpgkey"
}

# What a freshly installed Debian node has and the lab's image lacks: apt's package lists. And what
# simulated GPUs need on the node: PyYAML, with which nvidia_gpu_info reads the spec.
prepare_node_for_site() { # index spec-file
  local i=$1 spec=$2 name dir
  name=$(node_name "$i")
  dir=$lab/nodes/$name/simulated
  mkdir -p "$dir"
  # Written in place: the node sees the same file, and the plugin's watch sees the write.
  cat "$spec" >"$dir/gpus.yaml"
  if ! node_exec "$i" python3 -c 'import yaml' 2>/dev/null; then
    log "$name: fetching apt's package lists and installing python3-yaml"
    node_exec "$i" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-yaml >/dev/null' >&2 ||
      die "$name: apt-get could not install python3-yaml"
  fi
}

cmd_inventory() {
  local n i spec kubeconfig specs=("$@")
  n=$(node_count)
  [ "$n" -gt 0 ] || die "the lab is not up (run: lab.sh up)"
  [ ${#specs[@]} -le "$n" ] || die "${#specs[@]} specs given for $n node(s)"
  kubeconfig=$lab/admin.kubeconfig
  case $connection in
    ssh | podman) ;;
    *) die "GPUOPS_LAB_CONNECTION must be ssh or podman, got '$connection'" ;;
  esac
  serve_up
  for ((i = 1; i <= n; i++)); do
    spec=$(resolve_spec "${specs[i - 1]:-h100x8}")
    prepare_node_for_site "$i" "$spec"
  done
  cat <<EOF
# Written by tests/e2e/lab.sh inventory (lab instance $instance) for playbooks/site.yml and validate.yml.
all:
  hosts:
    # The Kubernetes API is reached from the control host, with the Python that runs Ansible.
    localhost:
      ansible_connection: local
      ansible_python_interpreter: "{{ ansible_playbook_python }}"
  children:
    gpu_nodes:
      hosts:
EOF
  for ((i = 1; i <= n; i++)); do
    cat <<EOF
        $(node_name "$i"):
          gpu_node_labels_node_name: $(node_name "$i")
          device_plugin_metrics_address: "127.0.0.1:$((metrics_port_base + i))"
EOF
    if [ "$connection" = ssh ]; then
      printf '          ansible_host: 127.0.0.1\n          ansible_port: %s\n' "$(ssh_port "$i")"
    fi
  done
  echo "      vars:"
  if [ "$connection" = ssh ]; then
    # What a fleet uses: an unprivileged login with sudo, one pipelined SSH session per task, and the
    # connection kept open between tasks (ControlPersist). The host keys are checked.
    cat <<EOF
        ansible_connection: ssh
        ansible_user: $ssh_user
        ansible_ssh_private_key_file: $lab/ssh/id_ed25519
        ansible_ssh_common_args: >-
          -o UserKnownHostsFile=$lab/ssh/known_hosts -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes
        ansible_ssh_args: -o ControlMaster=auto -o ControlPersist=300s -o ServerAliveInterval=30
        ansible_ssh_pipelining: true
        ansible_become: true
EOF
  else
    echo "        ansible_connection: containers.podman.podman"
  fi
  cat <<EOF
        ansible_python_interpreter: /usr/bin/python3
        # Simulated GPUs (labs and CI only): the spec at $node_spec_path on each node,
        # $lab/nodes/<node>/simulated/gpus.yaml on this machine.
        gpuops_simulate_from: $node_spec_path
        device_plugin_backend: simulated
        device_plugin_simulated_spec: $node_spec_path
        container_toolkit_repo_base_url: "http://127.0.0.1:$serve_port/toolkit"
        container_toolkit_version: "1.17.8"
        device_plugin_pip_extra_args: "--no-index --find-links http://127.0.0.1:$serve_port/wheels/"
        gpu_node_labels_kubeconfig: $kubeconfig
        device_plugin_kubeconfig: $kubeconfig
EOF
}

load_bin() {
  bin=$(cat "$lab/bin.path" 2>/dev/null) || die "the lab is not up (run: lab.sh up)"
}

main() {
  local cmd=${1:-}
  shift || true
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status)
      bin=$(cat "$lab/bin.path" 2>/dev/null || true)
      cmd_status
      ;;
    kubeconfig)
      [ -f "$lab/admin.kubeconfig" ] || die "the lab is not up (run: lab.sh up)"
      echo "$lab/admin.kubeconfig"
      ;;
    kubectl)
      load_bin
      kctl "$@"
      ;;
    node-exec)
      [ $# -ge 2 ] || die "usage: lab.sh node-exec N COMMAND..."
      node_exec "$@"
      ;;
    ssh)
      [[ ${1:-} =~ ^[1-9]$ ]] || die "usage: lab.sh ssh N [COMMAND...]"
      [ -f "$lab/ssh/id_ed25519" ] || die "the lab is not up (run: lab.sh up)"
      lab_ssh "$@"
      ;;
    inventory) cmd_inventory "$@" ;;
    spec-path)
      [[ ${1:-} =~ ^[1-9]$ ]] || die "usage: lab.sh spec-path N"
      echo "$lab/nodes/$(node_name "$1")/simulated/gpus.yaml"
      ;;
    nodes)
      for ((i = 1; i <= $(node_count); i++)); do node_name "$i"; done
      ;;
    *)
      sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'
      [ -z "$cmd" ] || [ "$cmd" = help ] || exit 2
      ;;
  esac
}

main "$@"
