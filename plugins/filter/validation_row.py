# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: validation_row
short_description: One GPU node's row of playbooks/validate.yml, with its checks
version_added: 0.1.0
description:
  - Takes what C(playbooks/validate.yml) read on one node and from the Kubernetes API and returns the node's
    row for P(gpuops.k8s.gpu_node_table#filter), with C(checks), a dict of check name to true (green) or false
    (red).
  - Every node is checked for C(driver) (NVML answered), C(node) (one Node object of that name), C(runtime)
    (the runtime configuration needs no change), C(plugin), C(allocatable), C(labels) (every wanted label
    with its value) and C(taint) (the GPU taint is there exactly when it is wanted).
  - A device-plugin node's C(allocatable) C(nvidia.com/gpu) must equal its GPU count and not be 0. Its
    plugin is green when its health endpoint answers 200, or, without a metrics address, when its socket is
    in the kubelet's directory.
  - A DRA node must advertise no C(nvidia.com/gpu) (two allocators would hand out the same GPUs), and its
    ResourceSlices of the latest pool generation must publish its GPUs (check C(published)) - one device
    per GPU, or some on a node with MIG devices. Unhealthy devices are counted, never red. Its plugin is
    green as a device plugin's is, with the DRA registration socket for the device plugin's socket.
  - In daemonset mode the plugin is the DaemonSet's pod on the node (one not being deleted), green when it
    is Ready and registered.
options:
  _input:
    description: The node's M(gpuops.k8s.nvidia_gpu_info) result.
    type: dict
    required: true
  node_name:
    description: The node's Kubernetes name.
    type: str
    required: true
  node:
    description: The M(kubernetes.core.k8s_info) result for the Node.
    type: dict
    required: true
  runtime:
    description: The looped M(gpuops.k8s.nvidia_runtime) result, run in check mode.
    type: dict
    required: true
  want_labels:
    description: The labels the node must carry (P(gpuops.k8s.gpu_labels#filter) of the GPU facts).
    type: dict
    required: true
  taint:
    description: Whether the GPU taint C(nvidia.com/gpu) is wanted.
    type: bool
    default: true
  dra:
    description: Whether the node allocates its GPUs through DRA.
    type: bool
    default: false
  daemonset:
    description: Whether the plugin runs as a DaemonSet's pod.
    type: bool
    default: false
  metrics_address:
    description: The plugin's metrics address; empty when it serves none.
    type: str
    default: ""
  driver_ok:
    description: Whether the driver answered (NVML, or the simulated spec in labs).
    type: bool
    default: true
  driver_reason:
    description: Why the driver did not answer (M(gpuops.k8s.nvidia_gpu_info)'s RV(nvml_unavailable_reason)); the row's
      C(reason) says it where O(driver_ok) is false.
    type: str
    default: ""
  boot:
    description:
      - Whether the kernel the node boots next has the driver's module (docs/kernel-updates.md), as C(judged) (a
        kernel was found) and C(problem) (empty where it has the module). Where judged, the row has the check
        C(boot_module), and a problem goes into its C(reason).
    type: dict
    default: {}
  fabric_settings:
    description:
      - The NVLink fabric services' settings, C(fabricmanager), C(nvlsm) and C(imex) to C(auto), C(always) or
        C(never), as the nvidia_driver role takes them (C(nvidia_driver_fabricmanager) and so on); a service
        not given is C(auto). C(auto) needs a service where the input's C(nvlink_fabric) (from
        M(gpuops.k8s.nvidia_gpu_info)) names it.
    type: dict
    default: {}
  fabric_state:
    description:
      - The M(gpuops.k8s.node_state) result for the units C(nvidia-fabricmanager.service) and
        C(nvidia-imex.service) and the path C(/opt/nvidia/nvlsm/sbin/nvlsm). Where the node needs a fabric
        service, the row has the check C(fabric), red where Fabric Manager's or IMEX's unit is not active, or the
        NVLink Subnet Manager is not installed; the row's C(fabric) says each needed service's state.
    type: dict
    default: {}
  health:
    description: The M(ansible.builtin.uri) result of the plugin's C(/healthz) (its C(status)); empty when not asked.
    type: dict
    default: {}
  sockets:
    description: The M(ansible.builtin.find) result for the plugin sockets in the kubelet's directory.
    type: dict
    default: {}
  dra_socket:
    description: The M(ansible.builtin.stat) result for the DRA driver's registration socket.
    type: dict
    default: {}
  pods:
    description: The M(kubernetes.core.k8s_info) result for the node's pod of the plugin's DaemonSet.
    type: dict
    default: {}
  slices:
    description: The M(kubernetes.core.k8s_info) result for the node's ResourceSlices of the DRA driver.
    type: dict
    default: {}
  claims:
    description: The number of claims the DRA driver prepared, or C(unreadable).
    type: raw
    default: 0
  cgroupfs:
    description:
      - The M(ansible.builtin.command) result of C(stat -fc %T /sys/fs/cgroup) on the node. When it succeeded,
        the row's C(cgroup_note) is P(gpuops.k8s.cgroup_v1_note#filter) of its output, for the node's kubelet
        version; otherwise the note is empty.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Compute this node's row
  ansible.builtin.set_fact:
    row: >-
      {{ gpu_info | gpuops.k8s.validation_row(node_name='gpu-node-1', node=node_info, runtime=runtime_check,
         want_labels=gpu_info | gpuops.k8s.gpu_labels, health=healthz, sockets=plugin_sockets) }}
"""

RETURN = r"""
_value:
  description:
    - The row. C(published), C(unhealthy) and C(claims) are C(-) on a device-plugin node; C(plugin) is
      C(healthy), C(registered) or C(down), or in daemonset mode C(ready), C(not-ready) or C(no-pod).
  type: dict
  contains:
    node:
      description: The node's name.
      type: str
    mode:
      description: C(dra) or C(device-plugin).
      type: str
    model:
      description: The first GPU's name, C(-) without GPUs.
      type: str
    count:
      description: The number of GPUs.
      type: int
    allocatable:
      description: The node's allocatable C(nvidia.com/gpu).
      type: int
    published:
      description: Devices in the latest generation of the node's ResourceSlices.
      type: raw
    unhealthy:
      description: Those of them whose C(health) attribute is C(Unhealthy).
      type: raw
    claims:
      description: Claims the DRA driver prepared.
      type: raw
    labels:
      description: C(ok) or C(missing).
      type: str
    taint:
      description: C(on) or C(off).
      type: str
    plugin:
      description: The plugin's status.
      type: str
    cgroup_note:
      description: The cgroup v1 sentence, or empty.
      type: str
    fabric:
      description:
        - The NVLink fabric services the node needs, each with its state (C(active), C(inactive), C(installed) or
          C(missing)), such as C(nvlsm installed, fabricmanager active); C(-) where it needs none.
      type: str
    checks:
      description:
        - Check name to true (green) or false (red); C(published) only on a DRA node, C(boot_module) only where
          O(boot) was judged, C(fabric) only where the node needs an NVLink fabric service.
      type: dict
    reason:
      description: Why the driver, the boot kernel's module or the fabric services are red, where known.
      type: str
      returned: when the driver, the boot kernel's module or the fabric services are red with a reason
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.cgroup_v1_note import cgroup_v1_note

_GPU = "nvidia.com/gpu"
# The NVLink fabric services in the order they start (plugins/module_utils/_nvlink_fabric.py): Fabric Manager and
# IMEX are judged by their units, the NVLink Subnet Manager (which Fabric Manager's service starts) by its program.
_FABRIC_SERVICES = ("nvlsm", "fabricmanager", "imex")
_FABRIC_UNITS = {"fabricmanager": "nvidia-fabricmanager.service", "imex": "nvidia-imex.service"}
NVLSM_PROGRAM = "/opt/nvidia/nvlsm/sbin/nvlsm"


def _int(value):
    """Like Jinja's int filter: a count the API gives as a string, 0 where there is none."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _ready(pod):
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c.get("status") for c in conditions if c.get("type") == "Ready"), "") == "True"


def _latest_devices(slices):
    """The devices of the pool's slices of its latest generation: a slice of an older one is on its way out."""
    generations = [((s.get("spec") or {}).get("pool") or {}).get("generation") for s in slices]
    latest = max((g for g in generations if g is not None), default=0)
    devices = []
    for item, generation in zip(slices, generations):
        if generation is not None and _int(generation) == _int(latest):
            devices.extend((item.get("spec") or {}).get("devices") or [])
    return devices


def _unhealthy(device):
    return (((device.get("attributes") or {}).get("health") or {}).get("string")) == "Unhealthy"


def _cgroup_note(cgroupfs, node_name, node):
    if cgroupfs.get("rc") != 0:
        return ""
    kubelet = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return cgroup_v1_note(str(cgroupfs.get("stdout", "")).strip(), node=node_name, kubelet_version=kubelet)


def _fabric(gpu_info, settings, state):
    """[(service, state)] for each NVLink fabric service the node needs, in start order."""
    auto = ((gpu_info.get("nvlink_fabric") or {}).get("services")) or []
    settings = settings or {}
    found = []
    for service in _FABRIC_SERVICES:
        setting = str(settings.get(service) or "auto")
        if setting not in ("auto", "always", "never"):
            raise AnsibleFilterError(
                f"validation_row: fabric_settings {service} must be auto, always or never, not {setting}."
            )
        if setting == "never" or (setting == "auto" and service not in auto):
            continue
        if service in _FABRIC_UNITS:
            unit = ((state or {}).get("units") or {}).get(_FABRIC_UNITS[service]) or {}
            if unit.get("load_state", "not-found") == "not-found":
                found.append((service, "missing"))
            else:
                found.append((service, "active" if unit.get("active_state") == "active" else "inactive"))
        else:
            path = ((state or {}).get("paths") or {}).get(NVLSM_PROGRAM) or {}
            found.append((service, "missing" if path.get("type", "absent") == "absent" else "installed"))
    return found


def validation_row(
    gpu_info,
    node_name,
    node,
    runtime,
    want_labels,
    taint=True,
    dra=False,
    daemonset=False,
    metrics_address="",
    driver_ok=True,
    driver_reason="",
    boot=None,
    health=None,
    sockets=None,
    dra_socket=None,
    pods=None,
    slices=None,
    claims=0,
    cgroupfs=None,
    fabric_settings=None,
    fabric_state=None,
):
    if not isinstance(gpu_info, dict) or not isinstance(gpu_info.get("gpus"), list):
        raise AnsibleFilterError("validation_row: the input must be a gpuops.k8s.nvidia_gpu_info result with gpus.")
    for name, value in (("node", node), ("runtime", runtime), ("want_labels", want_labels)):
        if not isinstance(value, dict):
            raise AnsibleFilterError(f"validation_row: {name} must be a dict (the registered result or the labels).")
    gpus = gpu_info["gpus"]
    nodes = node.get("resources") or []
    found = nodes[0] if nodes else {}
    labels = (found.get("metadata") or {}).get("labels") or {}
    allocatable = _int(((found.get("status") or {}).get("allocatable") or {}).get(_GPU, "0"))
    taints = [t for t in (found.get("spec") or {}).get("taints") or [] if t.get("key") == _GPU]

    registered = (
        bool(((dra_socket or {}).get("stat") or {}).get("exists", False))
        if dra
        else _int((sockets or {}).get("matched", 0)) > 0
    )
    running = [p for p in (pods or {}).get("resources") or [] if "deletionTimestamp" not in (p.get("metadata") or {})]
    pod_ready = bool(running) and _ready(running[0])
    healthy = (health or {}).get("status", 0) == 200
    plugin_ok = (pod_ready and registered) if daemonset else (healthy or (registered and not metrics_address))
    if daemonset:
        plugin = ("ready" if pod_ready else "not-ready") if running else "no-pod"
    else:
        plugin = "healthy" if healthy else ("registered" if plugin_ok else "down")

    devices = _latest_devices((slices or {}).get("resources") or [])
    mig = any(gpu.get("mig_devices") for gpu in gpus)
    labels_ok = all(key in labels and labels[key] == value for key, value in want_labels.items())
    checks = {
        "driver": bool(driver_ok),
        "node": len(nodes) == 1,
        "runtime": not any(result.get("changed") for result in runtime.get("results") or []),
        "plugin": plugin_ok,
        "allocatable": allocatable == 0 if dra else (allocatable == len(gpus) and allocatable > 0),
        "labels": labels_ok,
        "taint": bool(taints) == bool(taint),
    }
    if dra:
        checks["published"] = len(devices) > 0 and (mig or len(devices) == len(gpus))
    reasons = [f"driver: {driver_reason}"] if not driver_ok and driver_reason else []
    if (boot or {}).get("judged") and _truthy_bool((boot or {}).get("judged")):
        problem = str(boot.get("problem") or "").strip()
        checks["boot_module"] = not problem
        reasons += [f"boot_module: {problem}"] if problem else []
    fabric = _fabric(gpu_info, fabric_settings, fabric_state)
    if fabric:
        down = [service for service, state in fabric if state in ("missing", "inactive")]
        checks["fabric"] = not down
        reasons += ["fabric: " + ", ".join(f"{s} {state}" for s, state in fabric if s in down)] if down else []
    row = {
        "node": node_name,
        "mode": "dra" if dra else "device-plugin",
        "model": gpus[0].get("name", "-") if gpus else "-",
        "count": len(gpus),
        "allocatable": allocatable,
        "published": len(devices) if dra else "-",
        "unhealthy": sum(1 for device in devices if _unhealthy(device)) if dra else "-",
        "claims": claims if dra else "-",
        "labels": "ok" if labels_ok else "missing",
        "taint": "on" if taints else "off",
        "plugin": plugin,
        "cgroup_note": _cgroup_note(cgroupfs or {}, node_name, found),
        "fabric": ", ".join(f"{service} {state}" for service, state in fabric) or "-",
        "checks": checks,
    }
    if reasons:
        row["reason"] = "; ".join(reasons)
    return row


def _truthy_bool(value):
    """A template's bool, which older ansible-core hands over as text."""
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


class FilterModule:
    def filters(self):
        return {"validation_row": validation_row}
