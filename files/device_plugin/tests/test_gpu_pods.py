"""`gpu-device-plugin gpu-pods`: the pods holding devices of given GPUs, run as the real command against a
test double of the kubelet's pod-resources API (podresources_double.py) over a real unix socket.

The GPUs are the simulated a100-mig node (GPU 0 in MIG mode with three MIG devices, GPU 1 whole) read by
the daemon's own discovery, or, in the last test, the real pynvml on the mock libnvidia-ml.so.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import grpc
import pytest
from conftest import INSTALLED, SRC
from harness import H100, fixture, write_spec
from podresources_double import PodResourcesDouble, claim, container, pod

MIG_GPU = "GPU-0a5e1c00-0000-4000-8000-00000000a100"
WHOLE_GPU = "GPU-0a5e1c00-0000-4000-8000-00000000a101"
MIG_1G = "MIG-0a5e1c00-0000-4000-8000-0000000000a2"  # MIG device 1 of GPU 0, a 1g.5gb
DRIVER = "gpu.gpuops.k8s"


class Node:
    def __init__(self, tmp_path):
        # unix socket paths are limited to 107 bytes: keep the directory short, as the kubelet's is.
        self.sockets = tempfile.mkdtemp(prefix="gpr-")
        self.socket = os.path.join(self.sockets, "kubelet.sock")
        self.kubelet = PodResourcesDouble(self.socket).start()
        self.tmp = tmp_path
        self.spec = str(tmp_path / "gpus.yaml")
        write_spec(self.spec, fixture("a100-mig.yaml"))

    def gpu_pods(self, *args, env=None, simulated=True):
        """Run the command; (exit status, the JSON it printed or None, stderr)."""
        argv = [sys.executable, "-m", "gpu_device_plugin", "gpu-pods", "--socket", self.socket, *args]
        if simulated:
            argv += ["--backend", "simulated", "--simulated-spec", self.spec]
        environment = dict(os.environ, **(env or {}))
        # The installed package is on the interpreter's own path; the source tree has to be added.
        if not INSTALLED:
            environment["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, environment.get("PYTHONPATH")) if p)
        done = subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=60, check=False)
        printed = json.loads(done.stdout) if done.returncode == 0 else None
        return done.returncode, printed, done.stderr

    def pods(self, *args, **kwargs):
        status, printed, stderr = self.gpu_pods(*args, **kwargs)
        assert status == 0, stderr
        return printed["pods"]

    def close(self):
        self.kubelet.stop()
        shutil.rmtree(self.sockets, ignore_errors=True)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.close()


def names(pods):
    return [f"{p['namespace']}/{p['name']}" for p in pods]


def test_a_pod_holding_a_whole_gpu_is_found_by_that_gpu_alone(node):
    node.kubelet.pods = [pod("ml", "train", container("main", {"nvidia.com/gpu": [WHOLE_GPU]}), container("log"))]
    assert node.pods("--gpu", WHOLE_GPU) == [
        {"namespace": "ml", "name": "train", "uid": None, "containers": ["main"], "gpus": [WHOLE_GPU], "claims": []}
    ]
    assert node.pods("--gpu", MIG_GPU) == []
    assert node.kubelet.calls == 2


def test_mig_devices_by_uuid_and_by_index_name_their_parent_gpu(node):
    node.kubelet.pods = [
        pod("ml", "by-uuid", container("main", {"nvidia.com/mig-1g.5gb": [MIG_1G]})),
        pod("ml", "by-index", container("main", {"nvidia.com/mig-1g.5gb": ["0:2"]})),
        pod("ml", "whole", container("main", {"nvidia.com/gpu": ["1"]})),
    ]
    found = node.pods("--gpu", MIG_GPU, "--mig-strategy", "mixed")
    assert names(found) == ["ml/by-index", "ml/by-uuid"]
    assert {g for p in found for g in p["gpus"]} == {MIG_GPU}
    assert names(node.pods("--gpu", MIG_GPU, "--gpu", WHOLE_GPU, "--mig-strategy", "mixed")) == [
        "ml/by-index",
        "ml/by-uuid",
        "ml/whole",
    ]


def test_time_sliced_replicas_name_their_gpu_under_the_configured_resource_name(node):
    config = node.tmp / "config.yaml"
    config.write_text(
        "version: v1\n"
        "sharing:\n"
        "  timeSlicing:\n"
        "    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 4, rename: nvidia.com/gpu.shared}\n"
    )
    node.kubelet.pods = [
        pod("ml", "replica-by-uuid", container("a", {"nvidia.com/gpu.shared": [f"{WHOLE_GPU}::0"]})),
        pod("ml", "replica-by-index", container("b", {"nvidia.com/gpu.shared": ["1::3"]})),
    ]
    found = node.pods("--gpu", WHOLE_GPU, "--config-file", str(config), "--device-id-strategy", "index")
    assert names(found) == ["ml/replica-by-index", "ml/replica-by-uuid"]
    assert [p["containers"] for p in found] == [["b"], ["a"]]
    # Without the daemon's configuration, an index under a resource name it does not give is not ours.
    assert names(node.pods("--gpu", WHOLE_GPU)) == ["ml/replica-by-uuid"]


def dra_flags(node, node_name="node-1"):
    return [
        "--allocation-mode",
        "dra",
        "--node-name",
        node_name,
        "--kubelet-plugins-dir",
        str(node.tmp / "plugins"),
    ]


def test_dra_claim_devices_of_our_driver_and_pool_name_their_gpu_by_the_daemons_numbers(node):
    numbers = node.tmp / "plugins" / DRIVER / "devices.json"
    numbers.parent.mkdir(parents=True)
    # The daemon bound GPU 1 to number 7 (a GPU that once came before it is gone, say).
    numbers.write_text(json.dumps({"version": 1, "gpus": {MIG_GPU: 0, WHOLE_GPU: 7}}))
    before = numbers.read_bytes()
    node.kubelet.pods = [
        pod("ml", "whole", container("main", claims=[claim("ml", "whole-gpu", [(DRIVER, "node-1", "gpu-7")])])),
        pod("ml", "mig", container("main", claims=[claim("team-b", "slice", [(DRIVER, "node-1", "gpu-0-mig-1")])])),
        pod(
            "ml", "other-driver", container("main", claims=[claim("ml", "c", [("gpu.example.com", "node-1", "gpu-7")])])
        ),
        pod("ml", "other-pool", container("main", claims=[claim("ml", "d", [(DRIVER, "node-2", "gpu-7")])])),
    ]
    assert node.pods("--gpu", WHOLE_GPU, *dra_flags(node)) == [
        {
            "namespace": "ml",
            "name": "whole",
            "uid": None,
            "containers": ["main"],
            "gpus": [WHOLE_GPU],
            "claims": [{"namespace": "ml", "name": "whole-gpu"}],
        }
    ]
    found = node.pods("--gpu", MIG_GPU, *dra_flags(node))
    assert names(found) == ["ml/mig"] and found[0]["claims"] == [{"namespace": "team-b", "name": "slice"}]
    assert numbers.read_bytes() == before, "gpu-pods wrote the daemon's device numbers"


def test_without_the_daemons_numbers_a_dra_device_is_named_by_its_nvml_index(node):
    node.kubelet.pods = [
        pod("ml", "whole", container("main", claims=[claim("ml", "c", [(DRIVER, "node-1", "gpu-1")])]))
    ]
    assert names(node.pods("--gpu", WHOLE_GPU, *dra_flags(node))) == ["ml/whole"]
    assert not (node.tmp / "plugins").exists(), "gpu-pods created the daemon's directory"


def test_devices_of_other_resources_and_drivers_are_ignored(node):
    node.kubelet.pods = [
        pod("ml", "fpga", container("main", {"example.com/fpga": ["1", "0:1"]})),
        pod(
            "ml",
            "foreign-claim",
            container("main", claims=[claim("ml", "x", [("fpga.example.com", "node-1", "gpu-1")])]),
        ),
        pod(
            "ml",
            "both",
            container("fpga", {"example.com/fpga": ["1"]}),
            container("cuda", {"nvidia.com/gpu": [WHOLE_GPU]}),
        ),
    ]
    found = node.pods("--gpu", WHOLE_GPU, *dra_flags(node))
    assert names(found) == ["ml/both"] and found[0]["containers"] == ["cuda"]


def test_no_pods_is_an_empty_list(node):
    status, printed, stderr = node.gpu_pods("--gpu", WHOLE_GPU)
    assert (status, printed, stderr) == (0, {"pods": []}, "")


def one_sentence(stderr):
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr.strip()


def test_an_absent_kubelet_socket_is_one_sentence_and_status_2(node):
    node.close()
    status, printed, stderr = node.gpu_pods("--gpu", WHOLE_GPU)
    assert (status, printed) == (2, None)
    assert one_sentence(stderr) == (
        f"gpu-pods: the kubelet's pod-resources socket {node.socket} does not exist"
        " (is the kubelet running on this node?)."
    )


def test_a_refused_list_is_one_sentence_and_status_2(node):
    node.kubelet.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limit exceeded")
    status, _printed, stderr = node.gpu_pods("--gpu", WHOLE_GPU)
    assert status == 2
    assert one_sentence(stderr) == (
        f"gpu-pods: the kubelet's pod-resources API on {node.socket} refused List: RESOURCE_EXHAUSTED"
        " (rate limit exceeded)."
    )


def test_a_gpu_the_node_does_not_have_is_one_sentence_and_status_2(node):
    status, _printed, stderr = node.gpu_pods("--gpu", WHOLE_GPU, "--gpu", "GPU-not-here")
    assert status == 2
    assert one_sentence(stderr) == "gpu-pods: this node has no GPU with the UUID GPU-not-here."
    assert node.kubelet.calls == 0


def test_an_invalid_configuration_is_one_sentence_and_status_2(node):
    status, _printed, stderr = node.gpu_pods("--gpu", WHOLE_GPU, "--allocation-mode", "dra")
    assert status == 2
    assert one_sentence(stderr) == (
        "gpu-pods: invalid configuration: dra allocation mode needs the node's name (--node-name or the NODE_NAME"
        " variable)."
    )


def test_the_nvml_backend_names_the_gpus(node, mock_nvml):
    node.kubelet.pods = [pod("ml", "train", container("main", {"nvidia.com/gpu": [H100[3], f"{H100[5]}"]}))]
    found = node.pods("--gpu", H100[5], "--backend", "nvml", env=mock_nvml.env(), simulated=False)
    assert found == [
        {"namespace": "ml", "name": "train", "uid": None, "containers": ["main"], "gpus": [H100[5]], "claims": []}
    ]
