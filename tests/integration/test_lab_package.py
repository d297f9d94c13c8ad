"""The end-to-end lab's package (tests/e2e/gpuops_lab) without a lab: what it names and computes per
instance, the inventory it prints, the certificates and node files it writes, and its command line's
answers to user errors."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

E2E = Path(__file__).resolve().parents[1] / "e2e"
sys.path.insert(0, str(E2E))

from gpuops_lab import LabError, cli, nodes, pki  # noqa: E402
from gpuops_lab.config import LabConfig  # noqa: E402
from gpuops_lab.controlplane import owned_by, running_pid  # noqa: E402
from gpuops_lab.inventory import (  # noqa: E402
    inventory_text,
    mig_capabilities,
    mig_minors,
    nvidia_devices_script,
    resolve_spec,
)

LAB_PY = E2E / "lab.py"


def config(tmp_path: Path, instance: int = 0, **env: str) -> LabConfig:
    return LabConfig.from_env({"GPUOPS_CACHE": str(tmp_path / "cache"), "GPUOPS_LAB_INSTANCE": str(instance), **env})


def test_instance_0_names_ports_subnets_and_paths(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert cfg.name == "gpuops-lab"
    assert [cfg.node_name(i) for i in (1, 9)] == ["gpuops-lab-node-1", "gpuops-lab-node-9"]
    assert cfg.bridge_name(2) == "gpuopslab2"
    assert cfg.volume_names(1) == ("gpuops-lab-node-1-containerd", "gpuops-lab-node-1-kubelet")
    assert (cfg.etcd_port, cfg.etcd_peer_port, cfg.api_port) == (26379, 26380, 26443)
    assert (cfg.kubelet_port(1), cfg.healthz_port(1), cfg.ssh_port(1)) == (26251, 26271, 26231)
    assert (cfg.controller_manager_port, cfg.scheduler_port) == (26290, 26291)
    assert (cfg.serve_port, cfg.metrics_port(2)) == (31000, 31012)
    assert (cfg.pod_subnet(1), cfg.service_range) == ("10.231.1.0/24", "10.231.0.0/24")
    assert cfg.lab == tmp_path / "cache" / "lab"
    assert cfg.spec_path(1) == tmp_path / "cache/lab/nodes/gpuops-lab-node-1/simulated/gpus.yaml"
    assert cfg.instance_label == "gpuops-lab-instance=0"


@pytest.mark.parametrize("instance", [1, 2, 3, 4])
def test_other_instances_are_offset_everywhere(tmp_path: Path, instance: int) -> None:
    cfg = config(tmp_path, instance)
    assert cfg.name == f"gpuops-lab{instance}"
    assert cfg.node_name(2) == f"gpuops-lab{instance}-node-2"
    assert cfg.bridge_name(2) == f"gpuopslab{instance}2"
    assert cfg.api_port == 26443 + 1000 * instance
    assert cfg.etcd_port == 26379 + 1000 * instance
    assert cfg.kubelet_port(3) == 26253 + 1000 * instance
    assert cfg.ssh_port(3) == 26233 + 1000 * instance
    assert cfg.serve_port == 31000 + instance
    assert cfg.metrics_port(3) == 31013 + 10 * instance
    assert cfg.pod_subnet(3) == f"10.{231 + instance}.3.0/24"
    assert cfg.lab == tmp_path / "cache" / f"lab{instance}"
    # No two instances share a node name, bridge or port.
    other = config(tmp_path, 0)
    assert {cfg.node_name(i) for i in range(1, 10)}.isdisjoint(other.node_name(i) for i in range(1, 10))
    assert {cfg.bridge_name(i) for i in range(1, 10)}.isdisjoint(other.bridge_name(i) for i in range(1, 10))


def test_environment_overrides(tmp_path: Path) -> None:
    cfg = config(tmp_path, 2, GPUOPS_LAB_DIR=str(tmp_path / "here"), GPUOPS_LAB_NODES="3", GPUOPS_PYTHON="py")
    assert (cfg.lab, cfg.nodes_default, cfg.python, cfg.ready_timeout) == (tmp_path / "here", "3", "py", 240)
    assert LabConfig.from_env({"HOME": str(tmp_path)}).lab == tmp_path / ".cache" / "gpuops" / "lab"


@pytest.mark.parametrize("bad", ["5", "-1", "01", "x", "10"])
def test_a_bad_instance_is_one_sentence(tmp_path: Path, bad: str) -> None:
    with pytest.raises(LabError) as refused:
        config(tmp_path, GPUOPS_LAB_INSTANCE=bad)  # type: ignore[arg-type]
    assert str(refused.value) == f"GPUOPS_LAB_INSTANCE must be 0-4, got {bad}"
    assert refused.value.code == 2


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUOPS_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run(
        [sys.executable, str(LAB_PY), *args], capture_output=True, text=True, env=environ, check=False
    )


@pytest.mark.parametrize(
    ("args", "env", "code", "error"),
    [
        (["status"], {"GPUOPS_LAB_INSTANCE": "9"}, 2, "GPUOPS_LAB_INSTANCE must be 0-4, got 9"),
        (["kubeconfig"], {}, 1, "the lab is not up (run: lab.py up)"),
        (["kubectl", "get", "nodes"], {}, 1, "the lab is not up (run: lab.py up)"),
        (["inventory"], {}, 1, "the lab is not up (run: lab.py up)"),
        (["ssh", "1"], {}, 1, "the lab is not up (run: lab.py up)"),
        (["ssh", "x"], {}, 1, "usage: lab.py ssh N [COMMAND...]"),
        (["spec-path"], {}, 1, "usage: lab.py spec-path N"),
        (["node-exec", "1"], {}, 1, "usage: lab.py node-exec N COMMAND..."),
        (["up", "0"], {}, 1, "the node count must be 1-9, got '0'"),
        (["up", "12"], {}, 1, "the node count must be 1-9, got '12'"),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    tmp_path: Path, args: list[str], env: dict[str, str], code: int, error: str
) -> None:
    done = run_cli(tmp_path, *args, **env)
    assert done.returncode == code
    assert done.stderr == f"[lab] error: {error}\n"
    assert done.stdout == ""


def test_cli_answers_without_a_lab(tmp_path: Path) -> None:
    assert run_cli(tmp_path, "nodes").stdout == ""
    assert run_cli(tmp_path, "spec-path", "2", GPUOPS_LAB_INSTANCE="3").stdout == (
        f"{tmp_path}/cache/lab3/nodes/gpuops-lab3-node-2/simulated/gpus.yaml\n"
    )
    (tmp_path / "cache" / "lab1").mkdir(parents=True)
    (tmp_path / "cache" / "lab1" / "nodes.count").write_text("2\n")
    assert run_cli(tmp_path, "nodes", GPUOPS_LAB_INSTANCE="1").stdout == "gpuops-lab1-node-1\ngpuops-lab1-node-2\n"
    done = run_cli(tmp_path, "up", "3", GPUOPS_LAB_INSTANCE="1")
    assert done.returncode == 1
    assert done.stderr == "[lab] error: the lab is up with 2 node(s); run 'lab.py down' first to change that to 3\n"
    assert run_cli(tmp_path, "inventory", "a", "b", "c", GPUOPS_LAB_INSTANCE="1").stderr == (
        "[lab] error: 3 specs given for 2 node(s)\n"
    )
    assert run_cli(tmp_path, "inventory", GPUOPS_LAB_INSTANCE="1", GPUOPS_LAB_CONNECTION="rsh").stderr == (
        "[lab] error: GPUOPS_LAB_CONNECTION must be ssh or podman, got 'rsh'\n"
    )
    usage = run_cli(tmp_path, "frobnicate")
    assert usage.returncode == 2
    assert "tests/e2e/lab.py up [NODES]" in usage.stdout
    assert run_cli(tmp_path).returncode == 0


def group(text: str) -> dict:
    return yaml.safe_load(text)["all"]["children"]["gpu_nodes"]


def test_ssh_inventory(tmp_path: Path) -> None:
    cfg = config(tmp_path, 2)
    data = yaml.safe_load(inventory_text(cfg, 2))
    assert data["all"]["hosts"]["localhost"]["ansible_connection"] == "local"
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    assert list(hosts) == ["gpuops-lab2-node-1", "gpuops-lab2-node-2"]
    assert hosts["gpuops-lab2-node-2"] == {
        "gpu_node_labels_node_name": "gpuops-lab2-node-2",
        "device_plugin_metrics_address": "127.0.0.1:31032",
        "device_plugin_dcgm_metrics_address": "127.0.0.1:31132",
        "ansible_host": "127.0.0.1",
        "ansible_port": 28232,
    }
    variables = group(inventory_text(cfg, 2))["vars"]
    lab = tmp_path / "cache" / "lab2"
    assert variables["ansible_connection"] == "ssh"
    assert variables["ansible_user"] == "gpuops"
    assert variables["ansible_become"] is True
    assert variables["ansible_ssh_pipelining"] is True
    assert variables["ansible_ssh_private_key_file"] == f"{lab}/ssh/id_ed25519"
    assert variables["ansible_ssh_common_args"] == (
        f"-o UserKnownHostsFile={lab}/ssh/known_hosts -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    )
    assert "ControlPersist=300s" in variables["ansible_ssh_args"]
    assert variables["gpuops_simulate_from"] == "/etc/gpuops-lab/simulated/gpus.yaml"
    # The plugin reads the spec's GPUs through NVML, the node's mock libnvidia-ml.so.1; the lab's nvidia
    # runtime cannot inject devices into the plugin's pod.
    assert "device_plugin_simulated_spec" not in variables
    assert variables["device_plugin_backend"] == "nvml"
    assert variables["device_plugin_daemonset_visible_devices"] == ""
    # The dcgm metrics on a port per node (the nodes share the machine's network), read every 2 s.
    assert variables["device_plugin_dcgm_interval"] == 2
    assert variables["container_toolkit_repo_base_url"] == "http://127.0.0.1:31002/toolkit"
    assert variables["device_plugin_pip_extra_args"] == "--no-index --find-links http://127.0.0.1:31002/wheels/"
    assert variables["gpu_node_labels_kubeconfig"] == variables["device_plugin_kubeconfig"] == f"{lab}/admin.kubeconfig"
    # The lab has no nvidia-smi: the nvidia_mig and gpu_remediation roles reset GPUs with the lab's test double.
    assert variables["nvidia_mig_gpu_reset_command"] == ["/usr/local/sbin/gpuops-lab-gpu-reset", "{uuid}"]
    assert variables["gpu_remediation_reset_command"] == ["/usr/local/sbin/gpuops-lab-gpu-reset", "{uuid}"]
    # And set a GPU's persistence mode, off for its reset, with another.
    persistence = ["/usr/local/sbin/gpuops-lab-persistence-mode", "{uuid}", "{mode}"]
    assert variables["nvidia_mig_persistence_command"] == persistence
    assert variables["gpu_remediation_persistence_command"] == persistence


def test_mig_capabilities_are_numbered_as_the_driver_numbers_them() -> None:
    lines = mig_minors([0, 1]).splitlines()
    # config, monitor, then 15 GPU instances of 1 + 8 capabilities per GPU.
    assert len(lines) == 2 + 2 * 135
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi1/access 12" in lines and "gpu0/gi14/ci7/access 137" in lines
    assert lines[2 + 135] == "gpu1/gi0/access 138"
    # The node's devices script makes their devices and mounts the file where nvidia-ctk reads it.
    script = nvidia_devices_script([0, 1])
    assert 'mknod -m 0444 "/dev/nvidia-caps/nvidia-cap$minor" c 510 "$minor"' in script
    assert "mount --bind -o ro /etc/gpuops-lab/proc-driver /proc/driver" in script


def test_each_mig_capability_has_its_file_with_the_minor_of_mig_minors() -> None:
    # /proc/driver/nvidia/capabilities, where NVIDIA's DRA driver reads a MIG device's capability minors: one file per
    # line of mig-minors, in the driver's layout and format.
    files = mig_capabilities([0, 1])
    assert len(files) == len(mig_minors([0, 1]).splitlines())
    assert files["mig/config"] == "DeviceFileMinor: 1\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    assert files["mig/monitor"].startswith("DeviceFileMinor: 2\n")
    assert files["gpu0/mig/gi1/access"].startswith("DeviceFileMinor: 12\n")
    assert files["gpu0/mig/gi14/ci7/access"].startswith("DeviceFileMinor: 137\n")
    assert files["gpu1/mig/gi0/access"].startswith("DeviceFileMinor: 138\n")


def test_podman_inventory(tmp_path: Path) -> None:
    cfg = config(tmp_path, 0, GPUOPS_LAB_CONNECTION="podman")
    nodes_group = group(inventory_text(cfg, 1))
    assert nodes_group["hosts"]["gpuops-lab-node-1"] == {
        "gpu_node_labels_node_name": "gpuops-lab-node-1",
        "device_plugin_metrics_address": "127.0.0.1:31011",
        "device_plugin_dcgm_metrics_address": "127.0.0.1:31111",
    }
    variables = nodes_group["vars"]
    assert variables["ansible_connection"] == "containers.podman.podman"
    assert not any(key.startswith(("ansible_ssh", "ansible_user", "ansible_become")) for key in variables)
    assert variables["ansible_python_interpreter"] == "/usr/bin/python3"


def test_specs_by_name_or_path(tmp_path: Path) -> None:
    assert resolve_spec("t4x1").name == "t4x1.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text("gpus: []\n")
    assert resolve_spec(str(own)) == own
    with pytest.raises(
        LabError, match=r"^no simulated-GPU spec 'v100' \(give a file, or one of: a100-mig h100x8 mig-demos t4x1"
    ):
        resolve_spec("v100")


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def verify(ca: x509.Certificate, cert: x509.Certificate) -> None:
    cert.verify_directly_issued_by(ca)


def names(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [a.value for a in cert.subject.get_attributes_for_oid(oid)]


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> LabConfig:
    cfg = config(tmp_path_factory.mktemp("pki"), 3)
    cfg.lab.mkdir(parents=True)
    pki.make_pki(cfg)
    pki.make_ssh_key(cfg)
    nodes.write_node_config(cfg, 2, "192.0.2.7")
    return cfg


def test_the_ca_signs_the_api_server_with_its_names(issued: LabConfig) -> None:
    ca, server = load(issued.pki / "ca.crt"), load(issued.pki / "apiserver.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    verify(ca, server)
    assert isinstance(server.public_key(), ec.EllipticCurvePublicKey)
    assert server.public_key().curve.name == "secp256r1"
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.234.0.1"}
    assert set(sans.get_values_for_type(x509.DNSName)) == set(pki.SERVICE_NAMES)
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # openssl agrees, with RFC 5280's checks that Python 3.13's default TLS context makes (VERIFY_X509_STRICT): the
    # CA's key usage, the issued certificate's authority key identifier.
    done = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-CAfile", issued.pki / "ca.crt", issued.pki / "apiserver.crt"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("name", "common_name", "groups"),
    [
        ("admin", "gpuops-lab-admin", ["system:masters"]),
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"]),
        ("kube-controller-manager", "system:kube-controller-manager", []),
        ("kube-scheduler", "system:kube-scheduler", []),
        ("kubelet-gpuops-lab3-node-2", "system:node:gpuops-lab3-node-2", ["system:nodes"]),
    ],
)
def test_client_certificates(issued: LabConfig, name: str, common_name: str, groups: list[str]) -> None:
    cert = load(issued.pki / f"{name}.crt")
    verify(load(issued.pki / "ca.crt"), cert)
    assert names(cert, NameOID.COMMON_NAME) == [common_name]
    assert names(cert, NameOID.ORGANIZATION_NAME) == groups
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert not (issued.pki / f"{name}.csr").exists()
    done = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-CAfile", issued.pki / "ca.crt", issued.pki / f"{name}.crt"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_certificates_are_kept_once_made(issued: LabConfig) -> None:
    before = (issued.pki / "admin.crt").read_bytes()
    pki.make_pki(issued)
    assert (issued.pki / "admin.crt").read_bytes() == before
    assert (issued.pki / "sa.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_node_config_files(issued: LabConfig) -> None:
    directory = issued.node_dir(2)
    assert directory == issued.lab / "nodes" / "gpuops-lab3-node-2"
    client_cert = load(directory / "kubelet-client.crt")
    assert names(client_cert, NameOID.COMMON_NAME) == ["system:node:gpuops-lab3-node-2"]
    assert (directory / "ca.crt").read_bytes() == (issued.pki / "ca.crt").read_bytes()
    kubeconfig = yaml.safe_load((directory / "kubelet.kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:29443"
    assert kubeconfig["users"][0] == {
        "name": "gpuops-lab3-node-2",
        "user": {
            "client-certificate": "/etc/gpuops-lab/kubelet-client.crt",
            "client-key": "/etc/gpuops-lab/kubelet-client.key",
        },
    }
    kubelet = yaml.safe_load((directory / "kubelet-config.yaml").read_text())
    assert kubelet["address"] == "192.0.2.7"
    assert (kubelet["port"], kubelet["healthzPort"]) == (29252, 29272)
    assert kubelet["cgroupRoot"] == "/gpuops-lab3-node-2"
    assert (kubelet["cgroupDriver"], kubelet["failCgroupV1"]) == ("cgroupfs", False)
    env = dict(line.split("=", 1) for line in (directory / "kubelet.env").read_text().splitlines())
    assert env["GPUOPS_LAB_CGROUP_ROOT"] == "/gpuops-lab3-node-2"
    assert "--hostname-override=gpuops-lab3-node-2" in env["KUBELET_ARGS"].split()
    assert "--node-ip=192.0.2.7" in env["KUBELET_ARGS"].split()
    conflist = yaml.safe_load((directory / "10-gpuops-lab.conflist").read_text())
    bridge = conflist["plugins"][0]
    assert bridge["bridge"] == "gpuopslab32"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.234.2.0/24"}]]
    sshd = (directory / "sshd.conf").read_text().splitlines()
    assert "Port 29232" in sshd
    assert "ListenAddress 127.0.0.1" in sshd
    assert "AllowUsers gpuops" in sshd
    assert (directory / "ssh-user.pub").read_text() == (issued.ssh_dir / "id_ed25519.pub").read_text()
    admin = yaml.safe_load(issued.admin_kubeconfig.read_text()) if issued.admin_kubeconfig.exists() else None
    assert admin is None  # only `up` writes the control plane's kubeconfigs


def test_kubeconfigs(issued: LabConfig) -> None:
    pki.write_kubeconfigs(issued)
    admin = yaml.safe_load(issued.admin_kubeconfig.read_text())
    assert admin["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:29443",
        "certificate-authority": str(issued.pki / "ca.crt"),
    }
    assert admin["users"][0]["name"] == "gpuops-lab-admin"
    scheduler = yaml.safe_load((issued.lab / "kube-scheduler.kubeconfig").read_text())
    assert scheduler["users"][0]["user"]["client-certificate"] == str(issued.pki / "kube-scheduler.crt")


def test_node_image_tag_follows_its_inputs() -> None:
    tag = nodes.node_image_tag("sha256:base")
    assert tag.startswith("localhost/gpuops-lab-node:")
    assert tag != nodes.node_image_tag("sha256:other")
    assert E2E / "node" / "cleanup.sh" in nodes.node_image_inputs()


def test_labs_of_two_instances_build_the_shared_images_one_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """Two labs coming up at once (make test's e2e tier and test-awx run in two lanes) build the node and pause
    images, which every instance shares, one after the other: the second waits for the first's lock. So does
    `lab.py images` in make test's early builds, which builds the node image alone (no Kubernetes build yet)."""
    inside: list[int] = []
    overlaps: list[int] = []
    given: dict[int, Path | None] = {}
    guard = threading.Lock()

    def build(cfg: LabConfig, bin_dir: Path | None) -> str:
        with guard:
            inside.append(cfg.instance)
            overlaps.append(len(inside))
            given[cfg.instance] = bin_dir
        time.sleep(0.3)
        with guard:
            inside.remove(cfg.instance)
        return f"image-{cfg.instance}"

    monkeypatch.setattr(nodes, "_build_images", build)
    results: dict[int, str] = {}
    labs = [
        threading.Thread(
            target=lambda i=i: results.update({i: nodes.build_images(config(tmp_path, i), tmp_path if i else None)})
        )
        for i in (0, 2, 3)
    ]
    for lab in labs:
        lab.start()
    for lab in labs:
        lab.join()
    assert results == {0: "image-0", 2: "image-2", 3: "image-3"}
    assert overlaps == [1, 1, 1]
    assert given == {0: None, 2: tmp_path, 3: tmp_path}


def test_lab_images_builds_the_node_image_alone_and_prints_it(tmp_path: Path, monkeypatch, capsys) -> None:
    """`lab.py images` (make test's early builds) asks for the node image without a Kubernetes build: no pause
    image, which needs the pause program that build makes, and nothing started."""
    calls: list[tuple[int, Path | None]] = []
    monkeypatch.setattr(nodes, "_build_images", lambda cfg, bin_dir: calls.append((cfg.instance, bin_dir)) or "img")
    assert cli.dispatch(config(tmp_path, 0), "images", []) == 0
    assert calls == [(0, None)]
    assert capsys.readouterr().out == "img\n"


def test_own_cgroups_are_exact(tmp_path: Path) -> None:
    """Only this node's kubelet root and its container's cgroup; never a sibling's or a prefix match."""
    container = "/libpod_parent/libpod-" + "a" * 64
    for hierarchy in ("memory", "systemd"):
        for path in ("gpuops-lab-node-1/pod1", "gpuops-lab-node-10", "gpuops-lab1-node-1", container.strip("/")):
            (tmp_path / hierarchy / path).mkdir(parents=True, exist_ok=True)
        (tmp_path / hierarchy / "libpod_parent" / ("libpod-" + "b" * 64)).mkdir()
    found = nodes.own_cgroups(container, "gpuops-lab-node-1", root=tmp_path)
    assert sorted(found) == sorted(
        tmp_path / h / p for h in ("memory", "systemd") for p in ("gpuops-lab-node-1", container.strip("/"))
    )
    for path in found:
        nodes.remove_cgroup_tree(path)
    assert (tmp_path / "memory" / "gpuops-lab1-node-1").is_dir()
    assert (tmp_path / "systemd" / "libpod_parent" / ("libpod-" + "b" * 64)).is_dir()
    assert not (tmp_path / "systemd" / "gpuops-lab-node-1").exists()
    with pytest.raises(LabError):
        nodes.own_cgroups(None, "init.scope", root=tmp_path)


def test_a_pid_is_ours_only_with_our_state_dir_on_its_command_line(tmp_path: Path) -> None:
    cfg = config(tmp_path, 4)
    cfg.run_dir.mkdir(parents=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    ours = subprocess.Popen([*sleeper, f"{cfg.lab}/etcd"])
    theirs = subprocess.Popen([*sleeper, f"{cfg.lab}-other/etcd"])
    try:
        assert owned_by(cfg, ours.pid)
        assert not owned_by(cfg, theirs.pid)
        cfg.pid_file("etcd").write_text(f"{theirs.pid}\n")
        assert running_pid(cfg, "etcd") is None
        cli.cmd_down(cfg)  # must not signal the pid it does not own
        assert theirs.poll() is None
        cfg.run_dir.mkdir(parents=True)
        cfg.pid_file("etcd").write_text(f"{ours.pid}\n")
        assert running_pid(cfg, "etcd") == ours.pid
    finally:
        ours.kill()
        theirs.kill()
        ours.wait()
        theirs.wait()
