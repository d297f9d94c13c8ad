"""The container image, for real: built with build-image.sh (podman, local base image), saved as an
OCI archive, and run the way the DaemonSet runs it (UID 0, read-only root, no capabilities, no network)
against the kubelet double over a bind-mounted device-plugin directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(PLUGIN, "tests"), os.path.join(PLUGIN, "src")]

from kubelet_double import KubeletDouble  # noqa: E402

GPU = "nvidia.com/gpu"
SPEC = os.path.join(PLUGIN, "..", "..", "tests", "fixtures", "simulated", "h100x8.yaml")


def build_image(archive):
    """build-image.sh builds (or reuses) the image and saves it as an OCI archive at ``archive``."""
    built = subprocess.run(
        [os.path.join(PLUGIN, "build-image.sh"), "--save", str(archive)],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return built


def run_as_the_daemonset_does(name, image, volumes, args):
    """The image in the background the way the DaemonSet runs it: UID 0, read-only root, no capabilities,
    no privilege escalation, no network; ``volumes`` are podman ``-v`` values."""
    mounts = [flag for volume in volumes for flag in ("-v", volume)]
    confined = ["--network", "none", "--user", "0", "--read-only", "--cap-drop", "ALL"]
    subprocess.run(
        [
            "podman",
            "run",
            "-d",
            "--name",
            name,
            *confined,
            "--security-opt",
            "no-new-privileges",
            *mounts,
            image,
            *args,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_the_image_registers_follows_spec_edits_and_stops_cleanly(tmp_path):
    archive = tmp_path / "gpu-device-plugin.oci.tar"
    built = build_image(archive)
    image = built.stdout.strip().splitlines()[-1]
    sys.stderr.write(built.stderr)
    # The same image under the reference the device_plugin role asks for by default (the package's
    # name and version; tests/integration/test_device_plugin_package.py compares that with the role).
    reference = subprocess.run(
        [os.path.join(PLUGIN, "build-image.sh"), "--reference"], check=True, capture_output=True, text=True
    ).stdout.strip()
    ids = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", image, reference],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert len(ids) == 2 and ids[0] == ids[1], (image, reference, ids)
    assert archive.stat().st_size > 10_000_000
    with open(archive, "rb") as handle:
        handle.seek(257)
        assert handle.read(5) == b"ustar"  # a tar archive, as `ctr images import` expects
    work = tempfile.mkdtemp(prefix="gdp-img-")
    plugin_dir, spec_dir = os.path.join(work, "dp"), os.path.join(work, "spec")
    os.makedirs(plugin_dir)
    os.makedirs(spec_dir)
    shutil.copy(SPEC, os.path.join(spec_dir, "gpus.yaml"))
    kubelet = KubeletDouble(os.path.join(plugin_dir, "kubelet.sock"))
    kubelet.start()
    name = f"gdp-image-test-{os.getpid()}"
    try:
        run_as_the_daemonset_does(
            name,
            image,
            [f"{plugin_dir}:/var/lib/kubelet/device-plugins", f"{spec_dir}:/spec:ro"],
            ["--backend", "simulated", "--simulated-spec", "/spec/gpus.yaml", "--metrics-address", ""],
        )
        assert kubelet.wait(lambda: kubelet.devices(GPU) is not None, timeout=30)
        assert len(kubelet.devices(GPU)) == 8
        assert kubelet.registrations[0].endpoint == "gpuops-nvidia.com-gpu.sock"
        with open(os.path.join(spec_dir, "gpus.yaml")) as handle:
            text = handle.read()
        with open(os.path.join(spec_dir, "gpus.yaml.tmp"), "w") as handle:
            handle.write(text.replace("  numa_node: 0\n", "  numa_node: 0\n  xid: 79\n", 1))
        os.replace(os.path.join(spec_dir, "gpus.yaml.tmp"), os.path.join(spec_dir, "gpus.yaml"))
        assert kubelet.wait(lambda: kubelet.health(GPU).get(kubelet.devices(GPU)[0]["id"]) == "Unhealthy", 5)
        endpoint = kubelet.endpoints[GPU]
        subprocess.run(["podman", "stop", "-t", "10", name], check=True, capture_output=True, timeout=60)
        state = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.ExitCode}}", name], capture_output=True, text=True, check=True
        )
        assert state.stdout.strip() == "0"
        ended_ok = kubelet.wait(lambda: endpoint.stream_ended == "OK", 5)
        logs = subprocess.run(["podman", "logs", "--tail", "30", name], capture_output=True, text=True, check=False)
        assert ended_ok, (
            f"ListAndWatch ended with {endpoint.stream_ended!r} (want OK) after {len(kubelet.registrations)}"
            f" registration(s); the daemon's last lines:\n{logs.stdout}{logs.stderr}"
        )
        deadline = time.monotonic() + 5
        while os.path.exists(os.path.join(plugin_dir, "gpuops-nvidia.com-gpu.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(os.path.join(plugin_dir, "gpuops-nvidia.com-gpu.sock"))
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, check=False)
        kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_the_oci_archive_imports_into_containerd_and_runs_there_as_non_root(tmp_path):
    """A private containerd (its own root, state and socket): `ctr images import` of the saved archive,
    then `ctr run` with the image's default user (65532) against the kubelet double."""
    archive = tmp_path / "gpu-device-plugin.oci.tar"
    built = build_image(archive)
    image = built.stdout.strip().splitlines()[-1]
    work = tempfile.mkdtemp(prefix="gdp-ctr-")
    address = os.path.join(work, "containerd.sock")
    with open(os.path.join(work, "config.toml"), "w") as handle:
        handle.write(
            f'version = 2\nroot = "{work}/root"\nstate = "{work}/state"\n'
            f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{address}"\n'
        )
    containerd = subprocess.Popen(
        ["containerd", "--config", os.path.join(work, "config.toml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ctr = ["ctr", "-a", address, "-n", "gpuops-test"]
    plugin_dir, spec_dir = os.path.join(work, "dp"), os.path.join(work, "spec")
    os.makedirs(plugin_dir)
    os.makedirs(spec_dir)
    shutil.copy(SPEC, os.path.join(spec_dir, "gpus.yaml"))
    kubelet = KubeletDouble(os.path.join(plugin_dir, "kubelet.sock"))
    kubelet.start()
    # Not root in the container: open the directory and kubelet.sock to it, as a test host may.
    os.chmod(plugin_dir, 0o777)
    os.chmod(kubelet.socket_path, 0o666)
    task = None
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(address) and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run([*ctr, "images", "import", str(archive)], check=True, capture_output=True, timeout=300)
        listed = subprocess.run([*ctr, "images", "ls", "-q"], check=True, capture_output=True, text=True)
        assert image in listed.stdout.split()
        task = subprocess.Popen(
            [
                *ctr,
                "run",
                "--rm",
                "--mount",
                f"type=bind,src={plugin_dir},dst=/var/lib/kubelet/device-plugins,options=rbind:rw",
                "--mount",
                f"type=bind,src={spec_dir},dst=/spec,options=rbind:ro",
                image,
                "gdp-ctr-test",
                "python3",
                "-m",
                "gpu_device_plugin",
                "--backend",
                "simulated",
                "--simulated-spec",
                "/spec/gpus.yaml",
                "--metrics-address",
                "",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert kubelet.wait(lambda: kubelet.devices(GPU) is not None, timeout=60)
        assert len(kubelet.devices(GPU)) == 8
        assert os.stat(os.path.join(plugin_dir, "gpuops-nvidia.com-gpu.sock")).st_uid == 65532
        subprocess.run([*ctr, "tasks", "kill", "-s", "SIGTERM", "gdp-ctr-test"], check=True, capture_output=True)
        out, _err = task.communicate(timeout=30)
        assert task.returncode == 0, out
        assert not os.path.exists(os.path.join(plugin_dir, "gpuops-nvidia.com-gpu.sock"))
    finally:
        if task is not None and task.poll() is None:
            subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", "gdp-ctr-test"], capture_output=True, check=False)
            task.wait(30)
        subprocess.run([*ctr, "containers", "rm", "gdp-ctr-test"], capture_output=True, check=False)
        kubelet.stop()
        containerd.terminate()
        containerd.wait(30)
        subprocess.run(["umount", "-R", os.path.join(work, "root")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


def test_the_image_reaches_nvml_and_the_device_nodes_through_a_mounted_driver_root(tmp_path):
    """The nvml backend as a DaemonSet pod runs it: the host's driver root read-only at /driver-root, with the
    lab's mock libnvidia-ml.so.1 (a TEST DOUBLE of the driver's library, docs/mock-nvml.md) where the driver
    puts it and its state beside it; nothing else leads the image's pynvml to NVML."""
    from gpu_device_plugin.api import api_pb2

    image = build_image(tmp_path / "gpu-device-plugin.oci.tar").stdout.strip().splitlines()[-1]
    repo = os.path.abspath(os.path.join(PLUGIN, "..", ".."))
    library = subprocess.run(
        [os.path.join(repo, "scripts", "build-mock-nvml.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    work = tempfile.mkdtemp(prefix="gdp-nvml-")
    plugin_dir, root = os.path.join(work, "dp"), os.path.join(work, "root")
    lib = os.path.join(root, "usr", "lib", "x86_64-linux-gnu")
    os.makedirs(plugin_dir)
    os.makedirs(lib)
    os.makedirs(os.path.join(root, "dev"))
    shutil.copy(os.path.join(library, "libnvidia-ml.so.1"), os.path.join(lib, "libnvidia-ml.so.580.95.05"))
    os.symlink("libnvidia-ml.so.580.95.05", os.path.join(lib, "libnvidia-ml.so.1"))
    for name in [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        open(os.path.join(root, "dev", name), "w").close()
    spec = os.path.join(work, "gpus.yaml")
    shutil.copy(SPEC, spec)
    writer = subprocess.Popen(
        [
            sys.executable,
            os.path.join(repo, "tests", "mock_nvml", "nvml_state.py"),
            "--watch",
            spec,
            os.path.join(lib, "gpuops-mock-nvml.state"),
        ]
    )
    kubelet = KubeletDouble(os.path.join(plugin_dir, "kubelet.sock"))
    kubelet.start()
    name = f"gdp-image-nvml-{os.getpid()}"
    try:
        run_as_the_daemonset_does(
            name,
            image,
            [f"{plugin_dir}:/var/lib/kubelet/device-plugins", f"{root}:/driver-root:ro"],
            [
                "--backend",
                "nvml",
                "--container-driver-root",
                "/driver-root",
                "--pass-device-specs",
                "--metrics-address",
                "",
            ],
        )
        registered = kubelet.wait(lambda: len(kubelet.devices(GPU) or []) == 8, timeout=30)
        logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=False)
        assert registered, logs.stdout + logs.stderr
        assert "library=/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in logs.stdout + logs.stderr
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[kubelet.devices(GPU)[5]["id"]])]
        )
        reply = kubelet.stub(GPU).Allocate(request, timeout=5).container_responses[0]
        assert [(d.container_path, d.host_path) for d in reply.devices] == [
            ("/dev/nvidia5", "/dev/nvidia5"),
            ("/dev/nvidiactl", "/dev/nvidiactl"),
            ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
        ]
        with open(spec) as handle:
            text = handle.read()
        with open(spec + ".tmp", "w") as handle:
            handle.write(text.replace("  numa_node: 0\n", "  numa_node: 0\n  xid: 79\n", 1))
        os.replace(spec + ".tmp", spec)
        first = kubelet.devices(GPU)[0]["id"]
        assert kubelet.wait(lambda: kubelet.health(GPU).get(first) == "Unhealthy", 5)
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, check=False)
        writer.kill()
        writer.wait()
        kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)
