"""The DRA driver's DaemonSet of the device_plugin role (daemonset mode, device_plugin_allocation_mode: dra)
against a real kube-apiserver.

The peer is real, as in test_dra_api.py: etcd from Debian and kube-apiserver built by
tests/e2e/build-kubernetes.sh, with the Node and RBAC authorizers, NodeRestriction, and a
ServiceAccount issuer and keys, so the API server issues ServiceAccount tokens (TokenRequest) and
authenticates them. No kubelet, scheduler or controller-manager runs.

- The role's dra-daemonset.yml.j2 is rendered by Ansible itself, with the role's defaults and vars.
- Its ServiceAccount, ClusterRole and ClusterRoleBinding are applied; SubjectAccessReviews show that
  the ServiceAccount may do what the daemon does and nothing next to it.
- The daemon's own API client (gpu_device_plugin.dra.kubeapi and .slices), loading in-cluster
  credentials as in the pod, with a token of that ServiceAccount, publishes a node's ResourceSlice
  and reads a ResourceClaim.
- The rendered DaemonSet passes the API server's validation (server-side dry run).
- The role's tasks (daemonset.yml, daemonset_leave.yml), on a batch of two nodes, one per allocation
  mode: check mode, both DaemonSets, the labels, the markers, idempotence, the wait for the node's DRA
  pod, and the nodes leaving each DaemonSet.
The control plane is the `control_plane` fixture's (conftest.py).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.config import incluster_config
from kubernetes.dynamic import DynamicClient
from local_api import ApiServerSettings, wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "files/device_plugin/src"))

from gpu_device_plugin import hostdriver, simspec  # noqa: E402
from gpu_device_plugin.config import MountsSettings  # noqa: E402
from gpu_device_plugin.dra.devices import dra_devices  # noqa: E402
from gpu_device_plugin.dra.kubeapi import KubeApi  # noqa: E402
from gpu_device_plugin.dra.slices import ResourceSlices  # noqa: E402

ADMIN_TOKEN = "gpuops-dra-daemonset-test-admin"
NAMESPACE = "gpuops-system"
ACCOUNT = "gpuops-dra-plugin"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"]
NODE = "dra-ds-node-a"  # the node in dra mode
DP_NODE = "dra-ds-node-dp"  # the node in device_plugin mode
DRIVER = "gpu.gpuops.k8s"
GROUP = "resource.k8s.io"
CLAIMS = "dra-ds-claims"
ROLE = ROOT / "roles/device_plugin"
SPEC_DIR = "/etc/gpuops/simulated"
FIXTURES = ROOT / "tests/fixtures/simulated"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# The policy on pods that run as the account, and its binding: in `rendered` under these keys.
POD_POLICY_KINDS = ("ValidatingAdmissionPolicy/pods", "ValidatingAdmissionPolicyBinding/pods")
# Who creates a DaemonSet's pods: kube-controller-manager with --use-service-account-credentials.
DAEMONSET_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"
OTHER_NODE = DP_NODE  # a second Node, whose slices the DRA node's pod must not write


# The control_plane fixture's API server (conftest.py): the Node and RBAC authorizers with NodeRestriction (the
# lab's), and an administrator with a bearer token.
API_SERVER = ApiServerSettings(tokens=((ADMIN_TOKEN, "gpuops-admin", "system:masters"),))


@pytest.fixture(scope="module")
def apiserver(control_plane):
    work = control_plane.work
    kubeconfig = control_plane.kubeconfig(work / "admin.conf", token=ADMIN_TOKEN)
    admin = config.new_client_from_config(str(kubeconfig))
    core = client.CoreV1Api(admin)
    for node in (NODE, DP_NODE):
        core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}},
            }
        )
    return {
        "work": work,
        "ca": control_plane.ca,
        "server": control_plane.server,
        "port": control_plane.cfg.api_port,
        "kubeconfig": str(kubeconfig),
        "admin": admin,
        "core": core,
    }


def _ansible_env(**more):
    return dict(
        os.environ,
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
        ANSIBLE_NOCOLOR="1",
        **more,
    )


def _render(work, template, values):
    """A template of the role as Ansible renders it with the role's defaults and vars: its objects in order."""
    out = work / "objects.json"
    playbook = work / "render.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.include_vars": str(ROLE / "defaults/main.yml")},
                        {"ansible.builtin.include_vars": str(ROLE / "vars/main.yml")},
                        {
                            "ansible.builtin.copy": {
                                "dest": str(out),
                                "content": "{{ lookup('ansible.builtin.template', '"
                                + str(ROLE / "templates" / template)
                                + "') | from_yaml_all | list | to_json }}",
                            }
                        },
                    ],
                }
            ]
        )
    )
    extra = {"ansible_python_interpreter": sys.executable, **values}
    run = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        env=_ansible_env(),
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """dra-daemonset.yml.j2 as Ansible renders it with the role's defaults and vars, in dra mode with the
    simulated backend: {kind: object}."""
    values = {
        "device_plugin_allocation_mode": "dra",
        "device_plugin_backend": "simulated",
        "device_plugin_simulated_spec": f"{SPEC_DIR}/gpus.yaml",
    }
    objects = _render(tmp_path_factory.mktemp("render"), "dra-daemonset.yml.j2", values)
    # In the template's order (a dict keeps it): the order in which the role applies them.
    return {o["kind"] + ("/pods" if o["metadata"]["name"].endswith("-pods") else ""): o for o in objects}


DRIVER_LIB = "usr/lib/x86_64-linux-gnu"


def _driver_mounts(container, pod):
    """The pod's view of the host's driver: {path in the pod: (host path, read-only, recursively)}."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        m["mountPath"]: (volumes[m["name"]]["hostPath"]["path"], m.get("readOnly"), m.get("recursiveReadOnly"))
        for m in container["volumeMounts"]
        if m["mountPath"] == "/driver-root" or m["mountPath"].startswith("/driver-root/")
    }


@pytest.mark.parametrize(("template", "mode"), [("dra-daemonset.yml.j2", "dra"), ("daemonset.yml.j2", "device-plugin")])
@pytest.mark.parametrize("visible", ["all", ""])
def test_with_the_nvml_backend_the_pod_sees_the_drivers_library_and_device_nodes_and_no_more(
    tmp_path_factory, tmp_path, template, mode, visible
):
    values = {
        "device_plugin_allocation_mode": mode,
        "device_plugin_backend": "nvml",
        "device_plugin_daemonset_visible_devices": visible,
        "device_plugin_driver_library_dir": DRIVER_LIB,
        "device_plugin_driver_extra_dirs": ["/etc/gpuops-lab/simulated/"],
    }
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-nvml"), template, values)}
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-2:] == ["--container-driver-root", "/driver-root"]
    # Not the host's / (its submounts, the container runtime's socket, the kubelet's keys, other pods' tokens):
    # the library's directory, a further one, and the device nodes, each read-only with its submounts.
    # No mount propagation: a node whose / is a private mount (a container's, the lab's nodes) would refuse the
    # pod, and the device nodes appear in the mounted /dev without it.
    assert _driver_mounts(container, pod) == {
        f"/driver-root/{DRIVER_LIB}": (f"/{DRIVER_LIB}", True, "IfPossible"),
        "/driver-root/etc/gpuops-lab/simulated": ("/etc/gpuops-lab/simulated", True, "IfPossible"),
        "/driver-root/dev": ("/dev", True, "IfPossible"),
    }
    assert all(v["hostPath"]["type"] == "Directory" for v in pod["volumes"] if v["name"].startswith("driver-"))
    asked = [e for e in container.get("env", []) if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
    assert asked == ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}] if visible else [])
    assert not any(m["name"] == "simulated-spec" for m in container["volumeMounts"])

    # The daemon's own lookup (hostdriver), in a tree laid out as the pod sees it, finds the library and the
    # device nodes there and names their host paths.
    root = tmp_path / "pod"
    for inside in _driver_mounts(container, pod):
        (root / inside.lstrip("/")).mkdir(parents=True)
    lib = root / "driver-root" / DRIVER_LIB
    (lib / "libnvidia-ml.so.570.1").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.1")
    (root / "driver-root/dev/nvidiactl").write_bytes(b"")
    settings = MountsSettings(container_driver_root=str(root / "driver-root"))
    assert hostdriver.nvml_library(settings) == str(lib / "libnvidia-ml.so.1")
    found = hostdriver.find(settings)
    assert found.control_devices == ("/dev/nvidiactl",)
    assert (f"/{DRIVER_LIB}/libnvidia-ml.so.1", "libnvidia-ml.so.1") in found.libraries


@pytest.mark.parametrize(("template", "mode"), [("dra-daemonset.yml.j2", "dra"), ("daemonset.yml.j2", "device_plugin")])
@pytest.mark.parametrize("exporter_on_node", [False, True])
def test_with_the_nvml_backend_the_pods_serve_the_dcgm_metrics_on_a_named_port_unless_dcgm_exporter_does(
    tmp_path_factory, template, mode, exporter_on_node
):
    values = {
        "device_plugin_allocation_mode": mode,
        "device_plugin_backend": "nvml",
        "device_plugin_driver_library_dir": DRIVER_LIB,
        "device_plugin_dcgm_exporter_on_node": exporter_on_node,
    }
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-dcgm"), template, values)}
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    if exporter_on_node:
        assert "ports" not in container
        assert not [a for a in args if a.startswith(("--dcgm", "--pod-resources"))]
        return
    # dcgm-exporter's port, named for a PodMonitor (docs/metrics.md), on all of the pod's addresses.
    assert container["ports"] == [{"name": "dcgm-metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert args[args.index("--dcgm-metrics-address") + 1] == ":9400"
    assert args[args.index("--dcgm-interval-seconds") + 1] == "30"
    # The kubelet's pod-resources socket, for the series' pod labels, in the directory the pod mounts read-only.
    socket = args[args.index("--pod-resources-socket") + 1]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert mounts["/var/lib/kubelet/pod-resources"] is True


def test_with_a_containerised_driver_the_pod_sees_its_library_under_its_root(tmp_path_factory):
    values = {
        "device_plugin_allocation_mode": "dra",
        "device_plugin_backend": "nvml",
        "device_plugin_driver_root": "/run/nvidia/driver",
        "device_plugin_driver_library_dir": "/usr/lib64/",
    }
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-nvml"), "dra-daemonset.yml.j2", values)}
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The daemon looks for the device nodes outside that root in its own /dev (the runtime's).
    assert _driver_mounts(container, pod) == {
        "/driver-root/usr/lib64": ("/run/nvidia/driver/usr/lib64", True, "IfPossible")
    }


def test_with_node_credentials_the_pod_uses_the_nodes_kubeconfig_on_the_hosts_network(tmp_path_factory):
    values = {
        "device_plugin_allocation_mode": "dra",
        "device_plugin_backend": "nvml",
        "device_plugin_dra_daemonset_node_credentials": True,
        "device_plugin_dra_kubeconfig": "/etc/kubernetes/kubelet.conf",
        # What tasks/daemonset.yml found the kubeconfig to name on kubeadm's nodes.
        "__device_plugin_dra_credential_files": [
            "/etc/kubernetes/kubelet.conf",
            "/var/lib/kubelet/pki/kubelet-client-current.pem",
        ],
    }
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-node"), "dra-daemonset.yml.j2", values)}
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostNetwork"] is True and pod["automountServiceAccountToken"] is False
    assert container["args"][-2:] == ["--kubeconfig", "/etc/kubernetes/kubelet.conf"]
    # Those files, each at its own path, and nothing else of /etc/kubernetes (admin.conf, pki/*.key).
    volumes = {v["name"]: v for v in pod["volumes"]}
    credentials = {
        m["mountPath"]: (volumes[m["name"]]["hostPath"], m["readOnly"])
        for m in container["volumeMounts"]
        if m["name"].startswith("node-credentials")
    }
    assert credentials == {
        path: ({"path": path, "type": "File"}, True) for path in values["__device_plugin_dra_credential_files"]
    }
    # With the node's identity the daemon sets the Node condition GPUHealthy.
    assert not any(e["name"] == "GPU_DEVICE_PLUGIN_NODE_CONDITION" for e in container["env"])


PROBE_TIMING = {"periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3}
LIVENESS_TIMING = {"initialDelaySeconds": 30, "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 6}


@pytest.mark.parametrize(
    ("template", "mode", "node_credentials"),
    [("daemonset.yml.j2", "device_plugin", False), ("dra-daemonset.yml.j2", "dra", False)],
)
def test_a_pod_in_its_own_network_namespace_is_probed_from_inside_on_its_health_endpoint(
    tmp_path_factory, template, mode, node_credentials
):
    """The daemon keeps its address (the pod's loopback): the kubelet cannot reach that, so the probe runs in the
    pod, with the image's Python, and asks /readyz there; a 503 or no answer is a failed probe."""
    values = {"device_plugin_allocation_mode": mode, "device_plugin_dra_daemonset_node_credentials": node_credentials}
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-probe"), template, values)}
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--metrics-address") + 1] == "127.0.0.1:9402"
    probe = container["readinessProbe"]
    assert {k: probe[k] for k in PROBE_TIMING} == PROBE_TIMING
    command = probe["exec"]["command"]
    assert command[:4] == ["python3", "-I", "-S", "-c"] and command[5] == "http://127.0.0.1:9402/readyz"
    # A wedged daemon is restarted: the same check on /healthz, which never waits on the kubelet or the API server,
    # with time to start and a minute of failures before the kubelet restarts it.
    liveness = container["livenessProbe"]
    assert {k: v for k, v in liveness.items() if k != "exec"} == LIVENESS_TIMING
    assert liveness["exec"]["command"] == [*command[:5], "http://127.0.0.1:9402/healthz"]
    # The probe's script, run as the kubelet runs it, against a health endpoint that answers 200, then 503.
    state = {"code": 200}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(state["code"] if self.path in ("/readyz", "/healthz") else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for path, probe_command in (("readyz", command), ("healthz", liveness["exec"]["command"])):
            state["code"] = 200
            url = f"http://127.0.0.1:{server.server_address[1]}/{path}"
            probe_argv = [sys.executable, *probe_command[1:5], url]
            assert subprocess.run(probe_argv, capture_output=True, timeout=30, check=False).returncode == 0
            state["code"] = 503
            failed = subprocess.run(probe_argv, capture_output=True, text=True, timeout=30, check=False)
            assert failed.returncode == 1 and "503" in failed.stderr and "Traceback" not in failed.stderr
    finally:
        server.shutdown()
        server.server_close()
    # No endpoint, no probe.
    values["device_plugin_metrics_address"] = ""
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-probe"), template, values)}
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert "readinessProbe" not in container and "--metrics-address" not in container["args"]
    assert "livenessProbe" not in container


def test_a_dra_pod_on_the_hosts_network_is_probed_at_its_address(tmp_path_factory):
    values = {"device_plugin_allocation_mode": "dra", "device_plugin_dra_daemonset_node_credentials": True}
    objects = {o["kind"]: o for o in _render(tmp_path_factory.mktemp("render-probe"), "dra-daemonset.yml.j2", values)}
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--metrics-address") + 1] == "127.0.0.1:9402"
    assert container["readinessProbe"] == {
        "httpGet": {"host": "127.0.0.1", "path": "/readyz", "port": 9402},
        **PROBE_TIMING,
    }
    assert container["livenessProbe"] == {
        "httpGet": {"host": "127.0.0.1", "path": "/healthz", "port": 9402},
        **LIVENESS_TIMING,
    }


def _apply(apiserver, obj, **kwargs):
    dynamic = DynamicClient(apiserver["admin"])
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return resource.server_side_apply(
        body=obj,
        name=obj["metadata"]["name"],
        namespace=obj["metadata"].get("namespace"),
        field_manager="gpuops-test",
        force_conflicts=True,
        **kwargs,
    )


def _delete(apiserver, api_version, kind, name, namespace=None):
    dynamic = DynamicClient(apiserver["admin"])
    resource = dynamic.resources.get(api_version=api_version, kind=kind)
    try:
        resource.delete(name=name, namespace=namespace)
    except client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def applied(apiserver, rendered):
    """The rendered namespace, ServiceAccount, ClusterRole and ClusterRoleBinding, applied for real
    (and removed afterwards, the namespace kept)."""
    for kind in ("Namespace", "ServiceAccount", *POLICY_KINDS, *POD_POLICY_KINDS, "ClusterRole", "ClusterRoleBinding"):
        if kind in rendered:
            _apply(apiserver, rendered[kind])
    yield rendered
    for node in (NODE, OTHER_NODE):  # the pods _pod_token made (no kubelet: gone at once)
        try:
            apiserver["core"].delete_namespaced_pod(f"{ACCOUNT}-{node}", NAMESPACE, grace_period_seconds=0)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
    _delete(apiserver, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", ACCOUNT)
    _delete(apiserver, "rbac.authorization.k8s.io/v1", "ClusterRole", ACCOUNT)
    for kind in reversed(POLICY_KINDS):
        _delete(apiserver, "admissionregistration.k8s.io/v1", kind, ACCOUNT)
        _delete(apiserver, "admissionregistration.k8s.io/v1", kind, f"{ACCOUNT}-pods")
    _delete(apiserver, "v1", "ServiceAccount", ACCOUNT, NAMESPACE)


def test_the_template_renders_the_account_its_exact_rules_and_the_daemonset(rendered):
    # The admission policy and its binding before the account gets its rights: never a moment without them.
    assert list(rendered) == [
        "Namespace",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        *POD_POLICY_KINDS,
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
    ]
    account = rendered["ServiceAccount"]
    assert account["metadata"] == {
        "name": ACCOUNT,
        "namespace": NAMESPACE,
        "labels": {"app.kubernetes.io/managed-by": "gpuops.k8s"},
    }
    assert account["automountServiceAccountToken"] is True
    assert rendered["ClusterRole"]["metadata"]["name"] == ACCOUNT
    assert rendered["ClusterRole"]["rules"] == [
        {"apiGroups": [GROUP], "resources": ["resourceslices"], "verbs": ["list", "create", "update", "delete"]},
        {"apiGroups": [GROUP], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]
    binding = rendered["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ACCOUNT}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]

    daemonset = rendered["DaemonSet"]
    assert daemonset["metadata"]["name"] == "gpuops-dra-plugin"
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["spec"]["selector"]["matchLabels"] == daemonset["spec"]["template"]["metadata"]["labels"]
    assert pod["serviceAccountName"] == ACCOUNT
    assert pod["automountServiceAccountToken"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpuops.k8s/device-plugin": "dra"}
    assert "runtimeClassName" not in pod, "nvidia is the runtime's default unless said otherwise"
    (container,) = pod["containers"]
    assert container["args"] == [
        "--backend",
        "simulated",
        "--config-file",
        "/etc/gpuops/device-plugin/config.yaml",
        "--device-list-strategy",
        "envvar",
        "--log-format",
        "json",
        "--simulated-spec",
        f"{SPEC_DIR}/gpus.yaml",
        "--metrics-address",
        "127.0.0.1:9402",
        "--allocation-mode",
        "dra",
        "--driver-name",
        DRIVER,
        "--plugin-registry-dir",
        "/var/lib/kubelet/plugins_registry",
        "--kubelet-plugins-dir",
        "/var/lib/kubelet/plugins",
        "--cdi-dir",
        "/var/run/cdi",
    ]
    # The simulated backend has no NVML: no dcgm metrics, no port for them.
    assert "ports" not in container
    assert container["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # The account may not patch Node status (NEIGHBOURS): no GPUHealthy condition without node credentials.
        {"name": "GPU_DEVICE_PLUGIN_NODE_CONDITION", "value": "false"},
    ]
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"type": "spc_t"},
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert (
        set(volumes)
        == set(mounts)
        == {"plugins-registry", "plugin", "cdi", "config", "pod-resources", "simulated-spec", "health"}
    )
    # The kubelet's pod-resources API, read-only, for gpu-pods in the pod (the nvidia_mig role).
    assert volumes["pod-resources"]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "DirectoryOrCreate",
    }
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    # The pod leaves a node the nvidia_mig role pauses while a MIG mode changes there.
    assert pod["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpuops.k8s/device-plugin.paused", "operator": "DoesNotExist"}]}
                ]
            }
        }
    }
    for name, path in (
        ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
        ("plugin", f"/var/lib/kubelet/plugins/{DRIVER}"),
        ("cdi", "/var/run/cdi"),
        ("health", "/var/lib/gpuops"),  # the GPU health file's directory, which gpu_faults reads on the node
    ):
        # The same path in the pod as on the host: the endpoint the driver gives the kubelet is a host path.
        assert volumes[name]["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}, name
        assert mounts[name] == {"name": name, "mountPath": path}, name
    assert volumes["simulated-spec"]["hostPath"] == {"path": SPEC_DIR, "type": "Directory"}
    assert mounts["simulated-spec"] == {"name": "simulated-spec", "mountPath": SPEC_DIR, "readOnly": True}
    assert volumes["config"] == {"name": "config", "configMap": {"name": "gpuops-dra-plugin-config"}}
    assert not any("device-plugins" in v.get("hostPath", {}).get("path", "") for v in pod["volumes"])
    assert yaml.safe_load(rendered["ConfigMap"]["data"]["config.yaml"]) == {
        "version": "v1",
        "flags": {"migStrategy": "none"},
    }


def _review(apiserver, verb, resource, group="", namespace=None, subresource=None, name=None):
    attributes = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attributes["namespace"] = namespace
    if subresource:
        attributes["subresource"] = subresource
    if name:
        attributes["name"] = name
    review = client.AuthorizationV1Api(apiserver["admin"]).create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": USER, "groups": GROUPS, "resourceAttributes": attributes},
        }
    )
    return review.status.allowed


NEEDED = [
    ("list", "resourceslices", GROUP, None, None),
    ("create", "resourceslices", GROUP, None, None),
    ("update", "resourceslices", GROUP, None, None),
    ("delete", "resourceslices", GROUP, None, None),
    ("get", "resourceclaims", GROUP, CLAIMS, None),
    ("get", "nodes", "", None, None),
]
NEIGHBOURS = [
    ("get", "resourceslices", GROUP, None, None),
    ("watch", "resourceslices", GROUP, None, None),
    ("patch", "resourceslices", GROUP, None, None),
    ("deletecollection", "resourceslices", GROUP, None, None),
    ("list", "resourceclaims", GROUP, CLAIMS, None),
    ("watch", "resourceclaims", GROUP, CLAIMS, None),
    ("create", "resourceclaims", GROUP, CLAIMS, None),
    ("update", "resourceclaims", GROUP, CLAIMS, None),
    ("patch", "resourceclaims", GROUP, CLAIMS, None),
    ("delete", "resourceclaims", GROUP, CLAIMS, None),
    ("update", "resourceclaims", GROUP, CLAIMS, "status"),
    ("create", "deviceclasses", GROUP, None, None),
    ("get", "deviceclasses", GROUP, None, None),
    ("list", "nodes", "", None, None),
    ("patch", "nodes", "", None, None),
    ("update", "nodes", "", None, None),
    ("patch", "nodes", "", None, "status"),
    ("get", "secrets", "", NAMESPACE, None),
    ("list", "secrets", "", NAMESPACE, None),
    ("create", "pods", "", NAMESPACE, None),
    ("list", "pods", "", None, None),
    ("get", "configmaps", "", NAMESPACE, None),
    ("create", "serviceaccounts", "", NAMESPACE, "token"),
    ("escalate", "clusterroles", "rbac.authorization.k8s.io", None, None),
]


def test_the_account_may_do_what_the_daemon_does_and_nothing_beside(apiserver, applied):
    allowed = {check: _review(apiserver, *check) for check in NEEDED}
    assert allowed == dict.fromkeys(NEEDED, True)
    denied = {check: _review(apiserver, *check) for check in NEIGHBOURS}
    assert denied == dict.fromkeys(NEIGHBOURS, False)


def _account_pod(name, node, labels=None, owner="gpuops-dra-plugin", owner_uid="00000000-0000-4000-8000-000000000001"):
    """A pod of the DRA driver's DaemonSet as its controller makes it: run as the account, owned by the DaemonSet."""
    return {
        "metadata": {
            "name": name,
            "labels": labels or {},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "uid": owner_uid, "controller": True}
            ],
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": ACCOUNT,
            "automountServiceAccountToken": False,
            "containers": [{"name": "dra-plugin", "image": "localhost/gpu-device-plugin:0.1.0"}],
        },
    }


def _as_user(apiserver, user):
    """The administrator's client acting as ``user`` (impersonation; no extra user info)."""
    return client.ApiClient(apiserver["admin"].configuration, header_name="Impersonate-User", header_value=user)


def _create_as_daemonset_controller(apiserver, pod):
    with _as_user(apiserver, DAEMONSET_CONTROLLER) as controller:
        return client.CoreV1Api(controller).create_namespaced_pod(NAMESPACE, pod)


def _pod_token(apiserver, node):
    """A token of the ServiceAccount bound to a pod of it on ``node``, as the kubelet asks for one (TokenRequest
    with the pod as bound object): the API server adds the pod's node to the token's user info."""
    core = apiserver["core"]
    name = f"{ACCOUNT}-{node}"
    try:
        pod = core.read_namespaced_pod(name, NAMESPACE)
    except client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise
        pod = _create_as_daemonset_controller(apiserver, _account_pod(name, node))
    token = core.create_namespaced_service_account_token(
        ACCOUNT,
        NAMESPACE,
        {
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid},
            }
        },
    )
    return token.status.token


def _token_client(apiserver, token):
    settings = client.Configuration()
    settings.host = apiserver["server"]
    settings.ssl_ca_cert = str(apiserver["ca"])
    settings.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(settings)


def _slice(name, node, driver=DRIVER, pool=None):
    """A ResourceSlice of ``node``, in the pool named after the node (as the driver names its pool) unless said."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
        },
    }


def test_the_admission_policy_lets_a_pods_token_write_its_own_nodes_slices_and_no_others(apiserver, applied):
    """The account's rights cover every node's slices (RBAC cannot say "the node of the pod"); the role's
    admission policy narrows its writes to slices of its driver on the node its token is bound to."""
    admin = client.CustomObjectsApi(apiserver["admin"])
    own_node = _token_client(apiserver, _pod_token(apiserver, NODE))
    other_node = _token_client(apiserver, _pod_token(apiserver, OTHER_NODE))
    unbound = _token_client(
        apiserver,
        client.CoreV1Api(apiserver["admin"])
        .create_namespaced_service_account_token(ACCOUNT, NAMESPACE, {"spec": {"expirationSeconds": 600}})
        .status.token,
    )
    mine, theirs = client.CustomObjectsApi(own_node), client.CustomObjectsApi(other_node)

    def refused(call, *args, **kwargs):
        with pytest.raises(client.exceptions.ApiException) as error:
            call(GROUP, "v1", "resourceslices", *args, **kwargs)
        assert error.value.status == 403, error.value.body
        return json.loads(error.value.body)["message"]

    try:
        who = client.AuthenticationV1Api(own_node).create_self_subject_review({"metadata": {}}).status.user_info
        assert who.extra["authentication.kubernetes.io/node-name"] == [NODE]

        # The API server loads a new policy within a few seconds (an informer); until then it does not apply.
        def policy_loaded():
            try:
                mine.create_cluster_custom_object(
                    GROUP, "v1", "resourceslices", _slice("probe", OTHER_NODE), dry_run="All"
                )
            except client.exceptions.ApiException as exc:
                return exc.status == 403
            return False

        wait_for("the admission policy to apply", policy_loaded, 30, 0.5)
        # Create: its own node's slice, of its driver, yes; another node's, or another driver's, no.
        mine.create_cluster_custom_object(GROUP, "v1", "resourceslices", _slice("a-own", NODE))
        message = refused(mine.create_cluster_custom_object, _slice("a-writes-b", OTHER_NODE))
        assert "ValidatingAdmissionPolicy" in message and NODE in message, message
        refused(mine.create_cluster_custom_object, _slice("a-other-driver", NODE, driver="gpu.example.com"))
        # Nor its own node's slice in another node's pool: devices are allocated by driver, pool and device
        # cluster-wide, so B's GPUs would be taken.
        message = refused(mine.create_cluster_custom_object, _slice("a-pool-b", NODE, pool=OTHER_NODE))
        assert f"on node {NODE} may write only ResourceSlices of the pool {NODE}" in message, message
        # A token of the account that no pod on a node holds writes nothing.
        refused(client.CustomObjectsApi(unbound).create_cluster_custom_object, _slice("unbound", NODE))

        # Update and delete: the other node's slice is refused to A, and B's own pod may.
        theirs.create_cluster_custom_object(GROUP, "v1", "resourceslices", _slice("b-own", OTHER_NODE))
        current = admin.get_cluster_custom_object(GROUP, "v1", "resourceslices", "b-own")
        current["spec"]["pool"]["generation"] = 2
        refused(mine.replace_cluster_custom_object, "b-own", current)
        refused(mine.delete_cluster_custom_object, "b-own")
        assert admin.get_cluster_custom_object(GROUP, "v1", "resourceslices", "b-own")["spec"]["nodeName"] == OTHER_NODE
        theirs.replace_cluster_custom_object(GROUP, "v1", "resourceslices", "b-own", current)
        theirs.delete_cluster_custom_object(GROUP, "v1", "resourceslices", "b-own")

        # A's own slice: updated and deleted by A.
        own = admin.get_cluster_custom_object(GROUP, "v1", "resourceslices", "a-own")
        own["spec"]["pool"]["generation"] = 2
        mine.replace_cluster_custom_object(GROUP, "v1", "resourceslices", "a-own", own)
        mine.delete_cluster_custom_object(GROUP, "v1", "resourceslices", "a-own")
    finally:
        for name in ("a-own", "b-own", "a-writes-b", "a-other-driver", "a-pool-b", "unbound"):
            _delete(apiserver, f"{GROUP}/v1", "ResourceSlice", name)
        for api in (own_node, other_node, unbound):
            api.close()


def test_the_admission_policy_denies_a_request_of_the_account_with_no_extra_user_info_in_its_own_words(
    apiserver, applied
):
    """A request of the account whose user info has no extra at all (an administrator acting as the account;
    the account's rights are bound to its user name): a clean denial with the policy's sentence, not an error
    of its expression."""
    with _as_user(apiserver, USER) as impersonated:
        slices = client.CustomObjectsApi(impersonated)

        messages = []

        def denied():
            try:
                slices.create_cluster_custom_object(GROUP, "v1", "resourceslices", _slice("bare", NODE), dry_run="All")
            except client.exceptions.ApiException as exc:
                assert exc.status == 403, exc.body
                messages.append(json.loads(exc.body)["message"])
                # Until the RBAC authorizer has the fixture's ClusterRoleBinding, RBAC refuses the request before
                # admission ("cannot create resource"): the policy has not been asked yet.
                return "ValidatingAdmissionPolicy" in messages[-1]
            return False

        # The API server loads a new policy, and RBAC its bindings, within a few seconds (informers).
        wait_for("the admission policy to apply", denied, 30, 0.5)
    message = messages[-1]
    assert "token is not bound to a pod on a node: it may write no ResourceSlice" in message, message
    assert "error" not in message.lower(), message


def test_only_the_daemonset_controller_runs_pods_as_the_account_for_the_daemonset(apiserver, applied):
    """Whoever may create pods in the namespace would otherwise get the account's token (and its reads of every
    claim and Node) by running a pod as it: the role's second policy leaves that to the DaemonSet controller,
    for the DRA driver's DaemonSet."""
    core = apiserver["core"]

    def refused(pod, api=core):
        with pytest.raises(client.exceptions.ApiException) as error:
            api.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
        assert error.value.status == 403, error.value.body
        return json.loads(error.value.body)["message"]

    def policy_loaded():
        try:
            core.create_namespaced_pod(NAMESPACE, _account_pod("probe", NODE), dry_run="All")
        except client.exceptions.ApiException as exc:
            return exc.status == 403
        return False

    wait_for("the pods' admission policy to apply", policy_loaded, 30, 0.5)
    # An administrator or any other pod creator in the namespace: refused, with the policy's sentence.
    message = refused(_account_pod("by-hand", NODE))
    assert "only the DaemonSet gpuops-dra-plugin may run pods as the ServiceAccount gpuops-dra-plugin" in message
    # The DaemonSet controller, for another DaemonSet (one a namespace's user could create): refused.
    with _as_user(apiserver, DAEMONSET_CONTROLLER) as controller:
        refused(_account_pod("other-daemonset", NODE, owner="mine"), api=client.CoreV1Api(controller))
        # For the DRA driver's DaemonSet: admitted.
        created = client.CoreV1Api(controller).create_namespaced_pod(
            NAMESPACE, _account_pod("the-daemonsets", NODE), dry_run="All"
        )
        assert created.spec.service_account_name == ACCOUNT
    # Pods of other accounts in the namespace are not the policy's.
    other = _account_pod("other-account", NODE)
    other["spec"]["serviceAccountName"] = "default"
    del other["metadata"]["ownerReferences"]
    try:
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    assert core.create_namespaced_pod(NAMESPACE, other, dry_run="All").spec.service_account_name == "default"


@pytest.fixture
def in_cluster(apiserver, applied, tmp_path, monkeypatch):
    """What the kubelet gives the pod: a token of the ServiceAccount bound to the pod (TokenRequest), the
    cluster's CA and the KUBERNETES_SERVICE_* variables, at paths of this test's own."""
    token = _pod_token(apiserver, NODE)
    (tmp_path / "token").write_text(token)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(apiserver["ca"]))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(apiserver["port"]))
    return token


def test_the_daemons_client_with_the_accounts_token_publishes_a_slice_and_reads_a_claim(apiserver, in_cluster):
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    account = client.ApiClient(configuration)
    review = client.AuthenticationV1Api(account).create_self_subject_review({"metadata": {}})
    assert review.status.user_info.username == USER

    # The daemon's client, as in the pod: no kubeconfig, the in-cluster credentials.
    api = KubeApi()
    slices = ResourceSlices(api, NODE, DRIVER)
    custom = client.CustomObjectsApi(apiserver["admin"])
    try:
        assert api.probe() == "v1"
        inventory = simspec.load(str(FIXTURES / "h100x8.yaml"))
        assert slices.publish(dra_devices(inventory), frozenset(), inventory) is True
        (published,) = custom.list_cluster_custom_object(
            GROUP, "v1", "resourceslices", field_selector=f"spec.nodeName={NODE}"
        )["items"]
        assert published["spec"]["driver"] == DRIVER
        assert published["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert [d["name"] for d in published["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
        node_uid = apiserver["core"].read_node(NODE).metadata.uid
        assert published["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
        # An update (a device turns unhealthy), and nothing written when nothing changed.
        assert slices.publish(dra_devices(inventory), frozenset({"gpu-2"}), inventory) is True
        assert slices.reconcile() is False

        apiserver["core"].create_namespace({"metadata": {"name": CLAIMS}})
        created = custom.create_namespaced_custom_object(
            GROUP,
            "v1",
            CLAIMS,
            "resourceclaims",
            {
                "apiVersion": f"{GROUP}/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "one-gpu"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            },
        )
        claim = api.get_resource_claim(CLAIMS, "one-gpu")
        assert claim["metadata"]["uid"] == created["metadata"]["uid"]
        # Unlike the node identity (403), the account may get any claim: one that does not exist is None.
        assert api.get_resource_claim(CLAIMS, "no-such-claim") is None

        slices.delete_all()
        assert (
            custom.list_cluster_custom_object(GROUP, "v1", "resourceslices", field_selector=f"spec.nodeName={NODE}")[
                "items"
            ]
            == []
        )

        # A neighbouring request, for real: refused.
        with pytest.raises(client.exceptions.ApiException) as refused:
            client.CoreV1Api(account).list_namespaced_secret(NAMESPACE)
        assert refused.value.status == 403
        with pytest.raises(client.exceptions.ApiException) as refused:
            client.CoreV1Api(account).patch_node(NODE, {"metadata": {"labels": {"x": "y"}}})
        assert refused.value.status == 403
    finally:
        slices.delete_all()
        api.close()
        account.close()


def test_the_rendered_daemonset_passes_the_api_servers_validation(apiserver, applied):
    daemonset = applied["DaemonSet"]
    apps = client.AppsV1Api(apiserver["admin"])
    checked = apps.create_namespaced_daemon_set(NAMESPACE, daemonset, dry_run="All")
    assert checked.metadata.name == "gpuops-dra-plugin"
    assert checked.spec.template.spec.containers[0].env[0].value_from.field_ref.field_path == "spec.nodeName"
    with pytest.raises(client.exceptions.ApiException) as absent:
        apps.read_namespaced_daemon_set("gpuops-dra-plugin", NAMESPACE)
    assert absent.value.status == 404, "a dry run wrote the DaemonSet"
    # The dry run does validate: a broken copy is refused.
    broken = json.loads(json.dumps(daemonset))
    broken["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["type"] = "Nonsense"
    with pytest.raises(client.exceptions.ApiException) as invalid:
        apps.create_namespaced_daemon_set(NAMESPACE, broken, dry_run="All")
    assert invalid.value.status == 422


# -- the role's tasks --------------------------------------------------------------------------------


def _play(apiserver, tasks_from, hosts, check=False, limit=None, expect_ok=True):
    """The role's tasks file on a batch of inventory hosts (all local; each is one Node); returns
    (changed per host, {task name: {host: result}})."""
    work = apiserver["work"]
    inventory = work / "inventory.yml"
    # In the order given: the first host of the batch is the one that creates the objects (run_once).
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}, sort_keys=False))
    playbook = work / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "all",
                    # The service manager (systemd or not) decides whether there is a unit to remove.
                    "gather_facts": True,
                    "gather_subset": ["min"],
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "gpuops.k8s.device_plugin",
                                "tasks_from": tasks_from,
                            }
                        }
                    ],
                }
            ]
        )
    )
    collections = work / "collections"
    if not collections.exists():
        (collections / "ansible_collections" / "gpuops").mkdir(parents=True)
        (collections / "ansible_collections" / "gpuops" / "k8s").symlink_to(ROOT)
    argv = ["ansible-playbook", "-i", str(inventory), str(playbook)]
    if check:
        argv += ["--check", "--diff"]
    if limit:
        argv += ["--limit", limit]
    run = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=_ansible_env(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"),
        timeout=600,
        check=False,
    )
    assert (run.returncode == 0) is expect_ok, run.stdout[-6000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    tasks = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            tasks.setdefault(task["task"]["name"].rsplit(" : ", 1)[-1], {}).update(task["hosts"])
    return {host: stats["changed"] for host, stats in report["stats"].items()}, tasks


def _hosts(apiserver, **per_host):
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "device_plugin_mode": "daemonset",
        "device_plugin_kubeconfig": apiserver["kubeconfig"],
        "device_plugin_backend": "simulated",
        "device_plugin_simulated_spec": f"{SPEC_DIR}/gpus.yaml",
        # No unit of ours is here; should the role look, it looks in this test's directories.
        "device_plugin_install_dir": str(apiserver["work"] / "install"),
        "device_plugin_config_dir": str(apiserver["work"] / "config"),
        "device_plugin_wait_for_pod": False,
        "device_plugin_pod_timeout": 4,
    }
    hosts = {
        "dra": dict(
            common,
            device_plugin_node_name=NODE,
            device_plugin_allocation_mode="dra",
            device_plugin_state_dir=str(apiserver["work"] / "state-dra"),
        ),
        "dp": dict(
            common,
            device_plugin_node_name=DP_NODE,
            device_plugin_allocation_mode="device_plugin",
            device_plugin_state_dir=str(apiserver["work"] / "state-dp"),
        ),
    }
    for host, more in per_host.items():
        hosts[host].update(more)
    return hosts


DRA_OBJECTS = [
    ("apps/v1", "DaemonSet", "gpuops-dra-plugin", NAMESPACE),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", "gpuops-dra-plugin", None),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "gpuops-dra-plugin", None),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", "gpuops-dra-plugin-pods", None),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "gpuops-dra-plugin-pods", None),
    ("v1", "ConfigMap", "gpuops-dra-plugin-config", NAMESPACE),
    ("v1", "ServiceAccount", "gpuops-dra-plugin", NAMESPACE),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "gpuops-dra-plugin", None),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "gpuops-dra-plugin", None),
]
DP_OBJECTS = [
    ("apps/v1", "DaemonSet", "gpuops-device-plugin", NAMESPACE),
    ("v1", "ConfigMap", "gpuops-device-plugin-config", NAMESPACE),
    ("v1", "ServiceAccount", "gpuops-device-plugin", NAMESPACE),
]


def _exists(apiserver, api_version, kind, name, namespace):
    resource = DynamicClient(apiserver["admin"]).resources.get(api_version=api_version, kind=kind)
    try:
        resource.get(name=name, namespace=namespace)
        return True
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def _mode_label(apiserver, node):
    return (apiserver["core"].read_node(node).metadata.labels or {}).get("gpuops.k8s/device-plugin")


def test_the_role_runs_a_batch_with_a_node_in_each_mode_and_each_leaves(apiserver):
    core, apps = apiserver["core"], client.AppsV1Api(apiserver["admin"])
    work = apiserver["work"]
    for api_version, kind, name, namespace in DRA_OBJECTS + DP_OBJECTS:
        _delete(apiserver, api_version, kind, name, namespace)

    # Check mode: reported, nothing written.
    changed = _play(apiserver, "daemonset", _hosts(apiserver), check=True)[0]
    assert changed["dra"] >= 1 and changed["dp"] >= 1
    assert not any(_exists(apiserver, *obj) for obj in DRA_OBJECTS + DP_OBJECTS)
    assert _mode_label(apiserver, NODE) is None and _mode_label(apiserver, DP_NODE) is None
    assert not (work / "state-dra").exists()

    changed = _play(apiserver, "daemonset", _hosts(apiserver))[0]
    assert changed["dra"] >= 1 and changed["dp"] >= 1
    assert all(_exists(apiserver, *obj) for obj in DRA_OBJECTS + DP_OBJECTS)
    assert _mode_label(apiserver, NODE) == "dra"
    assert _mode_label(apiserver, DP_NODE) == "daemonset"
    assert json.loads((work / "state-dra" / "device-plugin-daemonset.json").read_text()) == {
        "namespace": NAMESPACE,
        "daemonset": "gpuops-dra-plugin",
        "allocation_mode": "dra",
    }
    assert json.loads((work / "state-dp" / "device-plugin-daemonset.json").read_text()) == {
        "namespace": NAMESPACE,
        "daemonset": "gpuops-device-plugin",
    }
    dra = apps.read_namespaced_daemon_set("gpuops-dra-plugin", NAMESPACE).spec.template.spec
    assert dra.node_selector == {"nvidia.com/gpu.present": "true", "gpuops.k8s/device-plugin": "dra"}
    assert dra.containers[0].args[dra.containers[0].args.index("--allocation-mode") + 1] == "dra"
    rules = client.RbacAuthorizationV1Api(apiserver["admin"]).read_cluster_role("gpuops-dra-plugin").rules
    assert [(r.api_groups, r.resources, r.verbs) for r in rules] == [
        ([GROUP], ["resourceslices"], ["list", "create", "update", "delete"]),
        ([GROUP], ["resourceclaims"], ["get"]),
        ([""], ["nodes"], ["get"]),
    ]
    # The DRA node came first and rendered both: the device plugin's DaemonSet is still the device plugin's.
    plugin = apps.read_namespaced_daemon_set("gpuops-device-plugin", NAMESPACE).spec.template.spec
    assert plugin.node_selector == {"nvidia.com/gpu.present": "true", "gpuops.k8s/device-plugin": "daemonset"}
    assert not {"--allocation-mode", "--driver-name", "--node-name", "--kubeconfig"} & set(plugin.containers[0].args)

    # The node's DRA pod, as the DaemonSet controller and the kubelet would make it: the role waits for it.
    daemonset = apps.read_namespaced_daemon_set("gpuops-dra-plugin", NAMESPACE).metadata
    labels = {"app.kubernetes.io/name": "gpuops-dra-plugin", "pod-template-generation": str(daemonset.generation)}
    _create_as_daemonset_controller(
        apiserver, _account_pod("gpuops-dra-plugin-x", NODE, labels=labels, owner_uid=daemonset.uid)
    )
    core.patch_namespaced_pod_status(
        "gpuops-dra-plugin-x",
        NAMESPACE,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )
    # This time the device-plugin node comes first and renders the objects: nothing changes either.
    hosts = _hosts(apiserver, dra={"device_plugin_wait_for_pod": True})
    changed, tasks = _play(apiserver, "daemonset", {"dp": hosts["dp"], "dra": hosts["dra"]})
    assert changed == {"dra": 0, "dp": 0}
    waited = tasks["Wait for the node's plugin pod to be ready"]
    assert waited["dp"].get("skipped") is True, "the device-plugin node does not wait here"
    assert [p["metadata"]["name"] for p in waited["dra"]["resources"]] == ["gpuops-dra-plugin-x"]

    # The DRA node leaves (to systemd mode): while its pod is there, the role waits, then gives up.
    _changed, tasks = _play(apiserver, "daemonset_leave", _hosts(apiserver), limit="dra", expect_ok=False)
    (failed,) = [name for name, hosts in tasks.items() if hosts.get("dra", {}).get("failed")]
    assert failed == "Wait until the DaemonSet's plugin pod has left the node"
    assert [p["metadata"]["name"] for p in tasks[failed]["dra"]["resources"]] == ["gpuops-dra-plugin-x"]
    assert _mode_label(apiserver, NODE) is None
    core.delete_namespaced_pod("gpuops-dra-plugin-x", NAMESPACE, grace_period_seconds=0)
    wait_for("the pod to go", lambda: not core.list_namespaced_pod(NAMESPACE).items, 30)
    changed = _play(apiserver, "daemonset_leave", _hosts(apiserver), limit="dra")[0]
    assert changed["dra"] >= 1
    assert not any(_exists(apiserver, *obj) for obj in DRA_OBJECTS), "the DRA driver's objects stayed"
    assert all(_exists(apiserver, *obj) for obj in DP_OBJECTS), "the device plugin's objects went"
    assert not (work / "state-dra" / "device-plugin-daemonset.json").exists()
    assert _mode_label(apiserver, DP_NODE) == "daemonset"

    # Then the device-plugin node: its DaemonSet goes, the namespace stays.
    changed = _play(apiserver, "daemonset_leave", _hosts(apiserver), limit="dp")[0]
    assert changed["dp"] >= 1
    assert not any(_exists(apiserver, *obj) for obj in DP_OBJECTS)
    assert _mode_label(apiserver, DP_NODE) is None
    assert core.read_namespace(NAMESPACE).metadata.name == NAMESPACE


VICTIM_NAMESPACE = "dra-ds-victim"


def _victims():
    """Objects of someone else's that a marker file on a node could name: a DaemonSet, its ConfigMap and
    ServiceAccount (in another namespace and in the role's own), a ClusterRole and a ClusterRoleBinding."""
    labels = {"app": "victim"}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "victim"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {"no-such-node": "x"}, "containers": [{"name": "c", "image": "victim:1"}]},
            },
        },
    }
    objects = []
    for namespace in (VICTIM_NAMESPACE, NAMESPACE):
        meta = {"namespace": namespace}
        objects += [
            {**daemonset, "metadata": {"name": "victim", **meta}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "victim-config", **meta}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "victim", **meta}},
        ]
    objects += [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "victim"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "victim"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "victim"},
            "subjects": [{"kind": "ServiceAccount", "name": "victim", "namespace": VICTIM_NAMESPACE}],
        },
    ]
    return objects


def test_leaving_deletes_only_the_roles_own_objects_whatever_the_node_file_names(apiserver):
    """The marker on the node names another namespace and another DaemonSet (root on the node can write
    it); leaving the DaemonSet deletes the role's own objects, named by its settings, and nothing else."""
    work = apiserver["work"]
    for api_version, kind, name, namespace in DRA_OBJECTS + DP_OBJECTS:
        _delete(apiserver, api_version, kind, name, namespace)
    hosts = _hosts(apiserver)
    _play(apiserver, "daemonset", {"dra": hosts["dra"]})
    assert all(_exists(apiserver, *obj) for obj in DRA_OBJECTS)
    try:
        apiserver["core"].create_namespace({"metadata": {"name": VICTIM_NAMESPACE}})
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    victims = _victims()
    for obj in victims:
        _apply(apiserver, obj)
    marker = work / "state-dra" / "device-plugin-daemonset.json"
    marker.write_text(json.dumps({"namespace": VICTIM_NAMESPACE, "daemonset": "victim", "allocation_mode": "dra"}))

    _play(apiserver, "daemonset_leave", hosts, limit="dra")

    deleted = [
        (o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
        for o in victims
        if not _exists(apiserver, o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
    ]
    assert deleted == [], "objects the marker named were deleted"
    assert not any(_exists(apiserver, *obj) for obj in DRA_OBJECTS), "the role's own objects stayed"
    assert not marker.exists()
    assert _mode_label(apiserver, NODE) is None


def _driver_root(work, name, lib_dir):
    """A driver root of a node: its libnvidia-ml.so.1 (a link to the versioned file, as the driver installs it)."""
    root = work / name
    lib = root / lib_dir
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "libnvidia-ml.so.570.1").write_bytes(b"")
    if not (lib / "libnvidia-ml.so.1").is_symlink():
        (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.1")
    return str(root)


def _node_kubeconfig(work, user, name="kubelet.conf"):
    """A kubelet's kubeconfig on a node, as kubeadm writes it: the authority embedded, the client certificate
    and key named as files (here one relative, which is the kubeconfig's directory's)."""
    directory = work / "node-kubernetes"
    directory.mkdir(exist_ok=True)
    for beside in ("kubelet-client.pem", "admin.conf"):
        (directory / beside).write_text("x\n")
    path = directory / name
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority-data": "eA=="}}
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def _failure(tasks, host):
    (failed,) = [result for result in (hosts.get(host, {}) for hosts in tasks.values()) if result.get("failed")]
    return failed["msg"]


def test_the_role_gives_the_pods_what_the_nodes_have_and_removes_the_objects_in_the_safe_order(apiserver):
    """What the pods see is found on the nodes: the directory of libnvidia-ml.so.1 (where the daemon looks) and the
    files the node's kubeconfig names; the role refuses what would widen it, and `state: absent` deletes the
    DaemonSet before the rights and the rights before the policy that narrows them."""
    work = apiserver["work"]
    for api_version, kind, name, namespace in DRA_OBJECTS + DP_OBJECTS:
        _delete(apiserver, api_version, kind, name, namespace)
    lib = "usr/lib/x86_64-linux-gnu"
    root = _driver_root(work, "driver-root", lib)
    nvml = {"device_plugin_backend": "nvml", "device_plugin_driver_root": root}
    kubeconfig = _node_kubeconfig(
        work,
        {"client-certificate": "kubelet-client.pem", "client-key": str(work / "node-kubernetes/kubelet-client.pem")},
    )
    credentials = {"device_plugin_dra_daemonset_node_credentials": True, "device_plugin_dra_kubeconfig": kubeconfig}

    # A kubeconfig that names a file beside the node's credentials (on a control plane: admin.conf) is refused.
    wide = _node_kubeconfig(
        work, {"client-certificate": "/etc/passwd", "client-key": "kubelet-client.pem"}, "wide.conf"
    )
    _changed, tasks = _play(
        apiserver,
        "daemonset",
        {"dra": _hosts(apiserver, dra={**nvml, **credentials, "device_plugin_dra_kubeconfig": wide})["dra"]},
        expect_ok=False,
    )
    assert "names /etc/passwd, outside its own directory and /var/lib/kubelet/pki" in _failure(tasks, "dra")
    # One that runs a command for its credentials, which the pod has not, is refused too.
    command = _node_kubeconfig(
        work, {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}}, "command.conf"
    )
    _changed, tasks = _play(
        apiserver,
        "daemonset",
        {"dra": _hosts(apiserver, dra={**nvml, **credentials, "device_plugin_dra_kubeconfig": command})["dra"]},
        expect_ok=False,
    )
    assert "runs a command for its credentials" in _failure(tasks, "dra")
    # Two nodes whose libraries lie in different directories cannot share one DaemonSet.
    other_root = _driver_root(work, "driver-root-rhel", "usr/lib64")
    _changed, tasks = _play(
        apiserver,
        "daemonset",
        _hosts(apiserver, dra={**nvml, **credentials}, dp={**nvml, "device_plugin_driver_root": other_root}),
        expect_ok=False,
    )
    assert "differ in the directory of libnvidia-ml.so.1" in _failure(tasks, "dra")
    assert not any(_exists(apiserver, *obj) for obj in DRA_OBJECTS + DP_OBJECTS)

    _play(apiserver, "daemonset", _hosts(apiserver, dra={**nvml, **credentials}, dp=nvml))
    apps = client.AppsV1Api(apiserver["admin"])
    for name in ("gpuops-dra-plugin", "gpuops-device-plugin"):
        pod = apps.read_namespaced_daemon_set(name, NAMESPACE).spec.template.spec
        (container,) = pod.containers
        hosts = {v.name: v.host_path.path for v in pod.volumes if v.host_path}
        seen = {
            m.mount_path: (hosts[m.name], m.read_only, m.recursive_read_only)
            for m in container.volume_mounts
            if m.mount_path.startswith("/driver-root")
        }
        # The driver root is not /: the daemon looks for the device nodes in the pod's own /dev.
        assert seen == {f"/driver-root/{lib}": (f"{root}/{lib}", True, "IfPossible")}, name
    pod = apps.read_namespaced_daemon_set("gpuops-dra-plugin", NAMESPACE).spec.template.spec
    hosts = {v.name: (v.host_path.path, v.host_path.type) for v in pod.volumes if v.host_path}
    mounted = {m.mount_path: hosts[m.name] for m in pod.containers[0].volume_mounts if m.name.startswith("node-cred")}
    # The kubeconfig and the one file it names (twice, once relative): not admin.conf beside them.
    pem = str(work / "node-kubernetes/kubelet-client.pem")
    assert mounted == {kubeconfig: (kubeconfig, "File"), pem: (pem, "File")}

    # state: absent, the DaemonSet first, the ClusterRoleBinding before the ClusterRole and the policy.
    absent = {"device_plugin_state": "absent"}
    _changed, tasks = _play(apiserver, "daemonset", _hosts(apiserver, dra=absent, dp=absent))
    removed = tasks["Create or remove the ServiceAccount, ConfigMap and DaemonSet (and the DRA driver's RBAC)"]
    (result,) = [r for r in removed.values() if not r.get("skipped")]
    # The module deletes the objects one by one, in the order given, and reports each in that order.
    given = result["invocation"]["module_args"]["definition"]
    assert [r["changed"] for r in result["result"]["results"]] == [True] * len(given)
    order = [(o["kind"], o["metadata"]["name"]) for o in given]
    dra = [kind for kind, name in order if name.startswith("gpuops-dra-plugin")]
    assert dra == [
        "DaemonSet",
        "ConfigMap",
        "ClusterRoleBinding",
        "ClusterRole",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ServiceAccount",
    ], order
    assert not any(_exists(apiserver, *obj) for obj in DRA_OBJECTS + DP_OBJECTS)
    assert _mode_label(apiserver, NODE) is None and _mode_label(apiserver, DP_NODE) is None
