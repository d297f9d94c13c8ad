"""What playbooks/site.yml needs on the lab's nodes, and an Ansible inventory that says so.

Nothing NVIDIA's servers or a package index would give a real node is fetched at run time: the container
toolkit comes from the signed local repository (scripts/build-toolkit-repo.sh) and the device plugin's
pinned wheels from a wheelhouse, both served on 127.0.0.1 (the nodes share the machine's network).
Debian's own packages come from the node's apt sources.

A node given a simulated-GPU spec is also shaped like a node with NVIDIA's driver installed: the mock
``libnvidia-ml.so.1`` (a TEST DOUBLE, tests/mock_nvml) where the driver puts its library, the device nodes
the driver makes, and NVML's state written from the spec on this machine by a background process
(``nvml-state``) that follows every edit of the spec.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from . import LabError
from .config import NODE_SPEC_PATH, NVML_STATE_NAME, REPO, SSH_USER, LabConfig
from .controlplane import curl, start_bg
from .nodes import node_exec_argv
from .util import log, run, succeeds, wait_for

SPECS = REPO / "tests" / "fixtures" / "simulated"
DEFAULT_SPEC = "h100x8"
NVML_STATE = REPO / "tests" / "mock_nvml" / "nvml_state.py"
# Where NVIDIA's driver packages put libnvidia-ml on Debian (amd64).
NODE_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# Device numbers as the driver makes them: major 195 for the GPUs (minor: the GPU's minor number) and
# nvidiactl (minor 255). nvidia-uvm's major is dynamic on a real host (the kernel gives it one when the
# module loads); 511 is the lab's choice.
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
UVM_MAJOR = 511
# The nvidia-caps devices through which a container is given a MIG device (its GPU instance and compute instance):
# their major is dynamic on a real host too; 510 is the lab's choice.
CAPS_MAJOR = 510
# NVIDIA's numbering of the MIG capabilities in /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, then per
# GPU (by minor number) 15 GPU instances of one access minor and 8 compute-instance access minors each.
MIG_GPU_INSTANCES = 15
MIG_COMPUTE_INSTANCES = 8
MIG_MINORS_PER_GPU = MIG_GPU_INSTANCES * (1 + MIG_COMPUTE_INSTANCES)
# Where the node's driver files the lab writes sit on this machine: the node's config directory, mounted at
# /etc/gpuops-lab in the node; the driver's /proc/driver tree is mounted from its proc-driver directory.
NODE_PROC_DRIVER = "/etc/gpuops-lab/proc-driver"
# A TEST DOUBLE of `nvidia-smi --gpu-reset -i UUID`, for the nvidia_mig role's nvidia_mig_gpu_reset_command and the
# gpu_remediation role's gpu_remediation_reset_command.
GPU_RESET = "/usr/local/sbin/gpuops-lab-gpu-reset"
# A TEST DOUBLE of `nvidia-smi -i UUID -pm MODE`, for the same roles' nvidia_mig_persistence_command and
# gpu_remediation_persistence_command: a GPU in persistence mode is not reset.
PERSISTENCE_MODE = "/usr/local/sbin/gpuops-lab-persistence-mode"
# At each boot of a lab node, what a reboot does to its GPUs' MIG state: a pending MIG mode becomes current and every
# GPU instance is gone (MIG devices do not survive a reboot, the MIG mode does). The node's mock library keeps its MIG
# layout in a file that a restart of the node's container keeps, so this unit (a TEST DOUBLE of the reboot's effect)
# resets, as a reboot does, each GPU whose MIG mode is on or pending, through the mock's test hook with force.
GPU_BOOT = "/usr/local/sbin/gpuops-lab-gpu-boot"
GPU_BOOT_UNIT = "gpuops-lab-gpu-boot.service"
# The lab node's own boot ID (tests/e2e/node/boot-id.sh).
LAB_BOOT_ID = "/run/gpuops-lab-boot-id"
DEVICES_UNIT = "gpuops-lab-nvidia-devices.service"
# At boot a host with NVIDIA's driver gets its CDI specification (on tmpfs, /var/run/cdi) written again by the
# toolkit's nvidia-cdi-refresh.service, whose conditions need the driver (nvidia-smi, nvidia.ko in modules.dep); a
# lab node has neither, so this unit runs the same command with the same settings in its place, where the toolkit
# has its refresh enabled: a lab node rebooted (docs/lab.md, "Rebooting a node") runs GPU pods again.
CDI_REFRESH_UNIT = "gpuops-lab-cdi-refresh.service"
# A TEST DOUBLE of DCGM's host engine, which keeps NVML open and so keeps a GPU from its reset: installed on every node,
# started only by the tests that need an NVML client the remediation must stop (tests/e2e/test_remediate.py).
DCGM_DOUBLE_UNIT = "nvidia-dcgm.service"
# Debian's python3-pynvml depends on `libnvidia-ml1 | ... | libnvidia-ml.so.1`; without a package that
# provides libnvidia-ml.so.1, apt would install Debian's libnvidia-ml1 (NVIDIA's real library, 535) over the
# mock. An empty package of this name provides it, at the spec's driver version.
PROVIDES_PACKAGE = "gpuops-lab-mock-nvml"

# Run with the lab's Python: write the node's mock NVML state from its spec once (the collection's spec
# reader validates the spec), and print what the node's driver files depend on.
_STATE_ONCE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import nvml_state, _simulated_spec
try:
    nvml_state.write_state(sys.argv[2], sys.argv[3])
    spec = _simulated_spec.load_spec(sys.argv[2])
except _simulated_spec.SpecError as exc:
    sys.exit(str(exc))
print(json.dumps({"driver_version": spec["driver_version"], "minors": [g["minor_number"] for g in spec["gpus"]]}))
"""

# The lab's GPU reset: a TEST DOUBLE of `nvidia-smi --gpu-reset -i UUID` (the lab has no nvidia-smi). It calls the
# mock libnvidia-ml.so.1's test hook gpuopsMockNvmlResetGpu, which does to the GPU's MIG state what a reset does (a
# pending MIG mode becomes current, the GPU instances are gone) and, like nvidia-smi, refuses with NVML's error
# while another process has NVML open (docs/mock-nvml.md, "MIG mode and the GPU reset").
_GPU_RESET_SCRIPT = f"""#!/usr/bin/env python3
# TEST DOUBLE of nvidia-smi --gpu-reset -i UUID, written by tests/e2e/lab.py (labs only): resets a GPU of the
# lab's mock libnvidia-ml.so.1 through its test hook gpuopsMockNvmlResetGpu.
import ctypes
import sys

if len(sys.argv) != 2:
    sys.exit("usage: {GPU_RESET} GPU-UUID")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.gpuopsMockNvmlResetGpu.argtypes = [ctypes.c_char_p, ctypes.c_uint]
nvml.nvmlErrorString.restype = ctypes.c_char_p
code = nvml.gpuopsMockNvmlResetGpu(sys.argv[1].encode(), 0)
if code != 0:
    sys.exit("Unable to reset GPU " + sys.argv[1] + ": " + nvml.nvmlErrorString(code).decode())
print("GPU " + sys.argv[1] + " was successfully reset.")
"""

# The lab's persistence-mode switch: a TEST DOUBLE of `nvidia-smi -i UUID -pm MODE` (the lab has no nvidia-smi),
# through NVML's nvmlDeviceSetPersistenceMode on the mock libnvidia-ml.so.1, which keeps it for every process on the
# node and refuses a GPU's reset while it is on (docs/mock-nvml.md, "Persistence mode").
_PERSISTENCE_MODE_SCRIPT = f"""#!/usr/bin/env python3
# TEST DOUBLE of nvidia-smi -i UUID -pm MODE, written by tests/e2e/lab.py (labs only): sets a GPU's persistence mode
# on the lab's mock libnvidia-ml.so.1.
import sys

import pynvml

if len(sys.argv) != 3 or sys.argv[2] not in ("0", "1"):
    sys.exit("usage: {PERSISTENCE_MODE} GPU-UUID 0|1")
pynvml.nvmlInit()
try:
    pynvml.nvmlDeviceSetPersistenceMode(pynvml.nvmlDeviceGetHandleByUUID(sys.argv[1]), int(sys.argv[2]))
except pynvml.NVMLError as error:
    sys.exit("Unable to set persistence mode of GPU " + sys.argv[1] + ": " + str(error))
finally:
    pynvml.nvmlShutdown()
print(("Enabled" if sys.argv[2] == "1" else "Disabled") + " persistence mode for GPU " + sys.argv[1] + ".")
"""

_GPU_BOOT_SCRIPT = f"""#!/usr/bin/env python3
# TEST DOUBLE of what a reboot does to a GPU's MIG state, written by tests/e2e/lab.py (labs only; {GPU_BOOT_UNIT} runs
# it at each boot of the node): each GPU whose MIG mode is on or pending is reset through the mock libnvidia-ml.so.1's
# test hook gpuopsMockNvmlResetGpu with force (a reboot resets whoever has NVML open).
import ctypes
import sys

import pynvml

pynvml.nvmlInit()
try:
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:
            continue
        if current or pending:
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
finally:
    pynvml.nvmlShutdown()
nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.gpuopsMockNvmlResetGpu.argtypes = [ctypes.c_char_p, ctypes.c_uint]
for uuid in gpus:
    code = nvml.gpuopsMockNvmlResetGpu(uuid.encode(), 1)
    if code != 0:
        sys.exit("Unable to reset GPU " + uuid + " at boot: NVML error " + str(code))
print("MIG devices gone at boot, as after a reboot: " + (", ".join(gpus) or "no GPU in MIG mode"))
"""

# The CUDA driver library a driver installs beside NVML: the build's empty libcuda.so.1 (a TEST DOUBLE that
# nothing calls), as libcuda.so.<version> with its soname link, for NVIDIA's CDI generator.
_CUDA_FILES = f"""set -eu
lib={NODE_LIB_DIR} version=$1
cat >"$lib/.libcuda.so.new"
chmod 0644 "$lib/.libcuda.so.new"
mv -f "$lib/.libcuda.so.new" "$lib/libcuda.so.$version"
for old in "$lib"/libcuda.so.*.*; do
  [ "$old" = "$lib/libcuda.so.$version" ] || rm -f "$old"
done
ln -sfn "libcuda.so.$version" "$lib/libcuda.so.1"
ldconfig
"""

# Run in the node as root with the mock library on stdin: install it as the driver's
# libnvidia-ml.so.<version> (replacing another version's; renamed into place, so a process that has the old
# one loaded keeps it), point it at its state, make the file by which it counts a node's NVML clients (a pod
# reads it through its read-only /driver-root and could not make it; docs/mock-nvml.md, "MIG"), record the
# package that provides it, and make the device nodes now and at every start of the node container, whose /dev
# is made anew each time.
_DRIVER_FILES = f"""set -eu
lib={NODE_LIB_DIR} version=$1
cat >"$lib/.libnvidia-ml.so.new"
chmod 0644 "$lib/.libnvidia-ml.so.new"
if cmp -s "$lib/.libnvidia-ml.so.new" "$lib/libnvidia-ml.so.$version"; then
  rm -f "$lib/.libnvidia-ml.so.new"
else
  mv -f "$lib/.libnvidia-ml.so.new" "$lib/libnvidia-ml.so.$version"
fi
for old in "$lib"/libnvidia-ml.so.*.*; do
  [ "$old" = "$lib/libnvidia-ml.so.$version" ] || rm -f "$old"
done
ln -sfn "libnvidia-ml.so.$version" "$lib/libnvidia-ml.so.1"
ln -sfn ../../../etc/gpuops-lab/simulated/{NVML_STATE_NAME} "$lib/gpuops-mock-nvml.state"
touch "$lib/gpuops-mock-nvml.mig.clients"
ldconfig
if [ "$(dpkg-query -W -f '${{Version}}' {PROVIDES_PACKAGE} 2>/dev/null)" != "$version" ]; then
  deb=$(mktemp -d)
  mkdir "$deb/DEBIAN"
  cat >"$deb/DEBIAN/control" <<CONTROL
Package: {PROVIDES_PACKAGE}
Version: $version
Architecture: amd64
Maintainer: gpuops.k8s lab <lab@gpuops.invalid>
Provides: libnvidia-ml.so.1 (= $version)
Section: misc
Priority: optional
Description: the gpuops.k8s lab's mock libnvidia-ml.so.1 (labs only)
 Written by tests/e2e/lab.py: a test double of NVIDIA's library, not NVIDIA software.
CONTROL
  dpkg-deb -Zgzip --build "$deb" "$deb.deb" >/dev/null
  dpkg -i "$deb.deb" >/dev/null
  rm -rf "$deb" "$deb.deb"
fi
cat >/etc/systemd/system/{DEVICES_UNIT} <<'UNIT'
[Unit]
Description=The NVIDIA device nodes of this lab node's simulated GPUs (tests/e2e/lab.py)
ConditionPathExists=/etc/gpuops-lab/nvidia-devices.sh
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh /etc/gpuops-lab/nvidia-devices.sh

[Install]
WantedBy=multi-user.target
UNIT
cat >/etc/systemd/system/{CDI_REFRESH_UNIT} <<'UNIT'
[Unit]
Description=This lab node's CDI specification, as nvidia-cdi-refresh writes it at boot (tests/e2e/lab.py)
ConditionPathExists=/usr/bin/nvidia-ctk
After={DEVICES_UNIT}
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecCondition=/bin/systemctl -q is-enabled nvidia-cdi-refresh.service
Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
EnvironmentFile=-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env
ExecStart=/usr/bin/nvidia-ctk cdi generate

[Install]
WantedBy=multi-user.target
UNIT
mkdir -p /etc/systemd/system/multi-user.target.wants
ln -sfn ../{DEVICES_UNIT} /etc/systemd/system/multi-user.target.wants/{DEVICES_UNIT}
ln -sfn ../{CDI_REFRESH_UNIT} /etc/systemd/system/multi-user.target.wants/{CDI_REFRESH_UNIT}
sh /etc/gpuops-lab/nvidia-devices.sh
cat >/etc/systemd/system/{DCGM_DOUBLE_UNIT} <<'UNIT'
[Unit]
Description=TEST DOUBLE of DCGM's host engine (tests/e2e/lab.py): holds the node's NVML open, as nv-hostengine does

[Service]
ExecStart=/usr/bin/python3 -c "import ctypes, time; assert ctypes.CDLL('libnvidia-ml.so.1').nvmlInit_v2() == 0; \\
  time.sleep(1e9)"
UNIT
cat >{GPU_RESET}.new <<'RESET'
{_GPU_RESET_SCRIPT}RESET
chmod 0755 {GPU_RESET}.new
mv -f {GPU_RESET}.new {GPU_RESET}
cat >{GPU_BOOT}.new <<'BOOT'
{_GPU_BOOT_SCRIPT}BOOT
chmod 0755 {GPU_BOOT}.new
mv -f {GPU_BOOT}.new {GPU_BOOT}
cat >/etc/systemd/system/{GPU_BOOT_UNIT} <<'UNIT'
[Unit]
Description=TEST DOUBLE of what a reboot does to this lab node's MIG devices (tests/e2e/lab.py)
ConditionPathExists=/etc/gpuops-lab/nvidia-devices.sh
After={DEVICES_UNIT}
Before=containerd.service kubelet.service gpuops-device-plugin.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={GPU_BOOT}

[Install]
WantedBy=multi-user.target
UNIT
ln -sfn ../{GPU_BOOT_UNIT} /etc/systemd/system/multi-user.target.wants/{GPU_BOOT_UNIT}
cat >{PERSISTENCE_MODE}.new <<'PERSISTENCE'
{_PERSISTENCE_MODE_SCRIPT}PERSISTENCE
chmod 0755 {PERSISTENCE_MODE}.new
mv -f {PERSISTENCE_MODE}.new {PERSISTENCE_MODE}
"""


def resolve_spec(spec: str, specs: Path = SPECS) -> Path:
    """A simulated-GPU spec given as a file, or as a name under tests/fixtures/simulated/."""
    if Path(spec).is_file():
        return Path(spec)
    if (specs / f"{spec}.yaml").is_file():
        return specs / f"{spec}.yaml"
    known = " ".join(sorted(p.stem for p in specs.glob("*.yaml")))
    raise LabError(f"no simulated-GPU spec '{spec}' (give a file, or one of: {known})")


# The Python of the lab's nodes: Debian 12's python3 (the local base image, scripts/build-base-image.sh).
NODE_PYTHON = "3.11"


def wheelhouse(cfg: LabConfig) -> Path:
    """The device plugin's pinned dependencies in both allocation modes (roles/device_plugin/defaults),
    with what they need, downloaded once into a wheelhouse keyed by the pins."""
    defaults = REPO / "roles" / "device_plugin" / "defaults" / "main.yml"
    read = subprocess.run(
        [
            cfg.python,
            "-c",
            "import sys, yaml; d = yaml.safe_load(open(sys.argv[1]));"
            ' print(" ".join(sorted(d["device_plugin_pip_packages"] + d["device_plugin_dra_pip_packages"])), end="")',
            str(defaults),
        ],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if read.returncode != 0:
        raise LabError(f"cannot read the plugin's pins with {cfg.python} (it needs PyYAML)")
    pins = read.stdout
    # For the nodes' python3 (Debian 12's), whichever Python runs the lab.
    for_nodes = ["--only-binary=:all:", "--implementation", "cp", "--python-version", NODE_PYTHON]
    key = hashlib.sha256(" ".join([pins, *for_nodes]).encode()).hexdigest()[:12]
    directory = cfg.cache / "wheels" / f"cluster-plugin-{key}"
    if not (directory / ".complete").is_file():
        log(f"downloading the device plugin's pinned wheels into {directory}")
        run(
            [cfg.python, "-m", "pip", "download", "-q", *for_nodes, "-d", directory, *pins.split()],
            what="pip download",
            stdout=sys.stderr,
        )
        (directory / ".complete").touch()
    return directory


def serve_up(cfg: LabConfig) -> None:
    """Serve the toolkit repository and the wheels on 127.0.0.1:31000+I."""
    toolkit = run([REPO / "scripts" / "build-toolkit-repo.sh"], what="scripts/build-toolkit-repo.sh").stdout.strip()
    wheels = wheelhouse(cfg)
    serve = cfg.lab / "serve"
    serve.mkdir(parents=True, exist_ok=True)
    for link, target in (("toolkit", Path(toolkit)), ("wheels", wheels)):
        path = serve / link
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)
    start_bg(
        cfg,
        "serve",
        [cfg.python, "-m", "http.server", "--bind", "127.0.0.1", "--directory", serve, str(cfg.serve_port)],
    )
    wait_for(
        f"the toolkit repository and the wheels served on 127.0.0.1:{cfg.serve_port}",
        30,
        lambda: succeeds(curl(f"http://127.0.0.1:{cfg.serve_port}/toolkit/gpgkey")),
        cfg.logs,
    )


def mock_nvml_library() -> Path:
    """The mock libnvidia-ml.so.1, built once (and cached) by scripts/build-mock-nvml.sh."""
    built = run([REPO / "scripts" / "build-mock-nvml.sh"], what="scripts/build-mock-nvml.sh").stdout.strip()
    return Path(built) / "libnvidia-ml.so.1"


def mig_minors(minors: list[int]) -> str:
    """/proc/driver/nvidia-caps/mig-minors as the driver writes it for GPUs of these minor numbers: each MIG
    capability (config, monitor, and per GPU every GPU instance's and compute instance's access file) and the minor
    of its /dev/nvidia-caps/nvidia-cap<minor>."""
    lines = ["config 1", "monitor 2"]
    for gpu in minors:
        for gi in range(MIG_GPU_INSTANCES):
            base = 3 + gpu * MIG_MINORS_PER_GPU + gi * (1 + MIG_COMPUTE_INSTANCES)
            lines.append(f"gpu{gpu}/gi{gi}/access {base}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(MIG_COMPUTE_INSTANCES)]
    return "".join(f"{line}\n" for line in lines)


def mig_capabilities(minors: list[int]) -> dict[str, str]:
    """/proc/driver/nvidia/capabilities as the driver writes it for GPUs of these minor numbers: per MIG capability of
    mig-minors (the same minors), its file, relative to that directory, and its content: the minor of its
    /dev/nvidia-caps/nvidia-cap<minor> and that node's mode (0444, written in decimal as the driver writes it).
    NVIDIA's DRA driver reads a MIG device's GPU-instance and compute-instance files to put their device nodes into
    the claim's CDI specification."""
    files = {}
    for line in mig_minors(minors).splitlines():
        capability, minor = line.split()
        path = f"mig/{capability}" if capability in ("config", "monitor") else capability.replace("/", "/mig/", 1)
        files[path] = f"DeviceFileMinor: {minor}\nDeviceFileMode: {0o444}\nDeviceFileModify: 1\n"
    return files


def nvidia_devices_script(minors: list[int]) -> str:
    """A shell script that makes the device nodes the driver makes for GPUs of these minor numbers
    (nvidiactl, nvidia-uvm, nvidia-uvm-tools, and nvidia<minor> for each GPU), mode 0666, and removes the
    /dev/nvidia<N> of GPUs the spec no longer has; and what the driver shows of MIG capabilities: the
    /dev/nvidia-caps/nvidia-cap<minor> of each, and /proc/driver/nvidia-caps/mig-minors (the node's proc-driver
    directory mounted read-only over /proc/driver), from which NVIDIA's nvidia-ctk writes a MIG device's nodes
    into the CDI specification."""
    devices = [
        ("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
        ("/dev/nvidia-uvm", UVM_MAJOR, 0),
        ("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
    ] + [(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor) for minor in minors]
    lines = [
        "#!/bin/sh",
        "# Written by tests/e2e/lab.py from this node's simulated-GPU spec (labs only): the device nodes",
        "# NVIDIA's driver makes. Run when the spec is given to the node, and at each start of the node.",
        "set -eu",
        "device() {",
        """  if [ "$(stat -c '%F %t:%T' "$1" 2>/dev/null)" != "character special file $2" ]; then""",
        '    rm -f "$1"',
        '    mknod -m 0666 "$1" c "$3" "$4"',
        "  fi",
        '  chmod 0666 "$1"',
        "}",
        *(f"device {path} {major:x}:{minor:x} {major} {minor}" for path, major, minor in devices),
        f'keep=" {" ".join(str(minor) for minor in minors)} "',
        "for gpu in /dev/nvidia[0-9]*; do",
        '  case "$keep" in *" ${gpu#/dev/nvidia} "*) ;; *) rm -f "$gpu" ;; esac',
        "done",
        f"if [ -f {NODE_PROC_DRIVER}/nvidia-caps/mig-minors ]; then",
        "  mkdir -p -m 0755 /dev/nvidia-caps",
        "  while read -r cap minor; do",
        '    [ -c "/dev/nvidia-caps/nvidia-cap$minor" ] ||'
        f' mknod -m 0444 "/dev/nvidia-caps/nvidia-cap$minor" c {CAPS_MAJOR} "$minor"',
        f"  done <{NODE_PROC_DRIVER}/nvidia-caps/mig-minors",
        f"  mountpoint -q /proc/driver || mount --bind -o ro {NODE_PROC_DRIVER} /proc/driver",
        "fi",
    ]
    return "".join(f"{line}\n" for line in lines)


def install_mock_driver(cfg: LabConfig, index: int, library: Path) -> None:
    """Shape node ``index`` like a node with NVIDIA's driver installed, for the spec it was given: its NVML
    state written from the spec now (the ``nvml-state`` process keeps it current), the mock library where
    the driver installs libnvidia-ml, and the driver's device nodes."""
    name = cfg.node_name(index)
    done = subprocess.run(
        [
            cfg.python,
            "-c",
            _STATE_ONCE,
            str(NVML_STATE.parent),
            str(cfg.spec_path(index)),
            str(cfg.nvml_state_path(index)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise LabError(f"{name}: cannot write the mock NVML state: {lines[-1] if lines else done.returncode}")
    facts = json.loads(done.stdout)
    caps = cfg.node_dir(index) / "proc-driver" / "nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    (caps / "mig-minors").write_text(mig_minors(facts["minors"]))
    capabilities = cfg.node_dir(index) / "proc-driver" / "nvidia" / "capabilities"
    shutil.rmtree(capabilities, ignore_errors=True)
    for path, content in mig_capabilities(facts["minors"]).items():
        (capabilities / path).parent.mkdir(parents=True, exist_ok=True)
        (capabilities / path).write_text(content)
    script = cfg.nvidia_devices_script(index)
    script.write_text(nvidia_devices_script(facts["minors"]))
    script.chmod(0o755)
    with open(library, "rb") as stdin:
        run(
            ["podman", "exec", "-i", name, "sh", "-c", _DRIVER_FILES, "sh", facts["driver_version"]],
            what=f"{name}: installing the mock NVML library and the NVIDIA device nodes",
            stdin=stdin,
            stdout=subprocess.DEVNULL,
        )
    with open(library.with_name("libcuda.so.1"), "rb") as stdin:
        run(
            ["podman", "exec", "-i", name, "sh", "-c", _CUDA_FILES, "sh", facts["driver_version"]],
            what=f"{name}: installing the empty libcuda.so.1",
            stdin=stdin,
            stdout=subprocess.DEVNULL,
        )


def nvml_state_up(cfg: LabConfig, count: int) -> None:
    """The ``nvml-state`` process (tests/mock_nvml/nvml_state.py --watch): rewrites a node's mock NVML
    state whenever its spec changes, for every node."""
    pairs = [path for index in range(1, count + 1) for path in (cfg.spec_path(index), cfg.nvml_state_path(index))]
    start_bg(cfg, "nvml-state", [cfg.python, NVML_STATE, "--watch", *pairs])


def specs_given(cfg: LabConfig, count: int) -> bool:
    """Whether every node of the lab has been given a simulated-GPU spec."""
    return count > 0 and all(cfg.spec_path(index).is_file() for index in range(1, count + 1))


def prepare_node_for_site(cfg: LabConfig, index: int, spec: Path, library: Path) -> None:
    """The node's simulated-GPU spec and the mock driver that serves it (install_mock_driver), and what a
    fresh Debian node has and the lab's image lacks: apt's package lists; plus PyYAML, with which
    nvidia_gpu_info reads the spec, and pynvml (Debian's python3-pynvml), with which it reads NVML."""
    name = cfg.node_name(index)
    target = cfg.spec_path(index)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written in place: the node sees the same file, and the plugin's watch sees the write.
    with open(target, "wb") as handle:
        handle.write(spec.read_bytes())
    install_mock_driver(cfg, index, library)
    if not succeeds(node_exec_argv(cfg, index, "python3", "-c", "import yaml, pynvml")):
        log(f"{name}: fetching apt's package lists and installing python3-yaml and python3-pynvml")
        install = (
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends"
            " python3-yaml python3-pynvml >/dev/null"
        )
        done = subprocess.run(node_exec_argv(cfg, index, "sh", "-c", install), stdout=sys.stderr, check=False)
        if done.returncode != 0:
            raise LabError(f"{name}: apt-get could not install python3-yaml and python3-pynvml")


def inventory_text(cfg: LabConfig, count: int) -> str:
    """The inventory YAML for ``count`` nodes, reached as ``cfg.connection`` says (ssh or podman)."""
    ssh = cfg.connection == "ssh"
    lines = [
        f"# Written by tests/e2e/lab.py inventory (lab instance {cfg.instance})"
        " for playbooks/site.yml and validate.yml.",
        "all:",
        "  hosts:",
        "    # The Kubernetes API is reached from the control host, with the Python that runs Ansible.",
        "    localhost:",
        "      ansible_connection: local",
        '      ansible_python_interpreter: "{{ ansible_playbook_python }}"',
        "  children:",
        "    gpu_nodes:",
        "      hosts:",
    ]
    for index in range(1, count + 1):
        name = cfg.node_name(index)
        lines += [
            f"        {name}:",
            f"          gpu_node_labels_node_name: {name}",
            f'          device_plugin_metrics_address: "127.0.0.1:{cfg.metrics_port(index)}"',
            f'          device_plugin_dcgm_metrics_address: "127.0.0.1:{cfg.dcgm_port(index)}"',
        ]
        if ssh:
            lines += ["          ansible_host: 127.0.0.1", f"          ansible_port: {cfg.ssh_port(index)}"]
    lines.append("      vars:")
    if ssh:
        # What a fleet uses: an unprivileged login with sudo, one pipelined SSH session per task, and the
        # connection kept open between tasks (ControlPersist). The host keys are checked.
        lines += [
            "        ansible_connection: ssh",
            f"        ansible_user: {SSH_USER}",
            f"        ansible_ssh_private_key_file: {cfg.ssh_key}",
            "        ansible_ssh_common_args: >-",
            f"          -o UserKnownHostsFile={cfg.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
            "        ansible_ssh_args: -o ControlMaster=auto -o ControlPersist=300s -o ServerAliveInterval=30",
            "        ansible_ssh_pipelining: true",
            "        ansible_become: true",
        ]
    else:
        lines.append("        ansible_connection: containers.podman.podman")
    kubeconfig = cfg.admin_kubeconfig
    lines += [
        "        ansible_python_interpreter: /usr/bin/python3",
        f"        # Simulated GPUs (labs and CI only): the spec at {NODE_SPEC_PATH} on each node,",
        f"        # {cfg.lab}/nodes/<node>/simulated/gpus.yaml on this machine.",
        f"        gpuops_simulate_from: {NODE_SPEC_PATH}",
        "        # The plugin and the DRA driver read the GPUs through NVML: the node's mock libnvidia-ml.so.1 serves",
        "        # the same spec. The plugin's own pod asks the nvidia runtime for no GPU; it reaches NVML through",
        "        # /driver-root.",
        "        device_plugin_backend: nvml",
        "        # The GPUs' dcgm metrics read every 2 s, so that a test sees a change within a few seconds.",
        "        device_plugin_dcgm_interval: 2",
        '        device_plugin_daemonset_visible_devices: ""',
        "        # The mock library reads its state through a link into /etc/gpuops-lab/simulated: the pod sees that",
        "        # directory too, beside the library's.",
        "        device_plugin_driver_extra_dirs: [/etc/gpuops-lab/simulated]",
        f'        container_toolkit_repo_base_url: "http://127.0.0.1:{cfg.serve_port}/toolkit"',
        '        container_toolkit_version: "1.18.1"',
        "        # nvidia-container-runtime injects the devices of the CDI specification nvidia-ctk writes from the",
        "        # node's NVML; the lab's nvidia-container-cli (legacy mode) is a stand-in that refuses every GPU.",
        "        container_toolkit_runtime_mode: cdi",
        f'        device_plugin_pip_extra_args: "--no-index --find-links http://127.0.0.1:{cfg.serve_port}/wheels/"',
        f"        gpu_node_labels_kubeconfig: {kubeconfig}",
        f"        device_plugin_kubeconfig: {kubeconfig}",
        "        # DRA nodes (gpu_allocation_mode: dra) reach the API server with the kubelet's own credentials.",
        "        device_plugin_dra_kubeconfig: /etc/gpuops-lab/kubelet.kubeconfig",
        "        # The lab has no nvidia-smi: a GPU whose MIG mode change is pending, or that remediate.yml resets, is",
        "        # reset by a TEST DOUBLE that calls the mock library's reset hook; another sets a GPU's persistence",
        "        # mode, which is turned off for the reset (the hook refuses a GPU in persistence mode).",
        f'        nvidia_mig_gpu_reset_command: ["{GPU_RESET}", "{{uuid}}"]',
        f'        gpu_remediation_reset_command: ["{GPU_RESET}", "{{uuid}}"]',
        f'        nvidia_mig_persistence_command: ["{PERSISTENCE_MODE}", "{{uuid}}", "{{mode}}"]',
        f'        gpu_remediation_persistence_command: ["{PERSISTENCE_MODE}", "{{uuid}}", "{{mode}}"]',
        "        # A node's boot ID is the lab's own (gpuops-lab-boot-id.service binds it over the kernel's); the",
        "        # daemon's ProtectKernelTunables gives it a /proc/sys of its own, where the same file is bound again,",
        "        # so that the health file names the boot the node is in (docs/remediation.md: a reboot's notice).",
        "        device_plugin_service_extra:",
        f'          - "BindReadOnlyPaths=-{LAB_BOOT_ID}:/proc/sys/kernel/random/boot_id"',
    ]
    return "".join(f"{line}\n" for line in lines)


def check_inventory_args(cfg: LabConfig, specs: list[str]) -> int:
    """The node count, once the lab is up, the specs fit it and the connection is known."""
    count = cfg.node_count()
    if count <= 0:
        raise LabError("the lab is not up (run: lab.py up)")
    if len(specs) > count:
        raise LabError(f"{len(specs)} specs given for {count} node(s)")
    if cfg.connection not in ("ssh", "podman"):
        raise LabError(f"GPUOPS_LAB_CONNECTION must be ssh or podman, got '{cfg.connection}'")
    return count


def simulate(cfg: LabConfig, specs: list[str]) -> int:
    """Give the running lab's nodes simulated GPUs (spec i on node i, h100x8 on the rest) and the mock
    driver that serves them; returns the node count."""
    count = check_inventory_args(cfg, specs)
    library = mock_nvml_library()
    for index in range(1, count + 1):
        spec = resolve_spec(specs[index - 1] if index <= len(specs) else DEFAULT_SPEC)
        prepare_node_for_site(cfg, index, spec, library)
    nvml_state_up(cfg, count)
    return count


def inventory(cfg: LabConfig, specs: list[str]) -> str:
    """Prepare the running lab's nodes for site.yml (spec i on node i, h100x8 on the rest); the inventory."""
    check_inventory_args(cfg, specs)
    serve_up(cfg)
    return inventory_text(cfg, simulate(cfg, specs))
