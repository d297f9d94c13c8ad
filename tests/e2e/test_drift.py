"""Drift is always seen: on a converged lab node, the things the roles manage are changed, several at a time,
and the next `site.yml` must report a change by each drifted role and repair them all, and the run after it must
report none.

The node is the lab's first one, converged once for this module by `site.yml --limit NODE` in the default
deployment (the device plugin as a systemd service, device_plugin allocation). What "converged" means is read from
the node itself and from the API server right after that, with no help from Ansible (``observe``): each managed
file's type, mode, owner and content, the toolkit's and the plugin's packages with their dpkg state and the apt
hold, the units' enabled and active states, the plugin's virtual environment (its distributions, its interpreter
links, whether the daemon imports) and health endpoint, containerd's config as TOML reads it, the node's GPU
labels, taint and the nvidia RuntimeClass. Each round

1. changes, for each of its cases, one thing on the node, as a person or a half-finished job would, and checks
   that the observed state changed with it (so the case can see its own drift);
2. runs `site.yml`, which must succeed with a change reported by each drifted role and bring the observed state
   back to the converged one (each thing repaired, and nothing else disturbed);
3. runs `site.yml` again, which must report changed == 0.

How the cases are grouped into rounds:

- The core (the tests not marked full) runs the cases packed (``packed``): as few rounds as hold every case with no
  two in one round that ``conflict``: that change one thing (their ``keep`` paths equal, or one in the other, as the
  keyring directory and the key in it; or one unit, the dpkg database, one API object, named in ``touches``), or of
  which one's repair writes or starts what the other changed whatever its state (``repair_also``: the device plugin's
  restart handler starts a stopped service, cdi.yml writes the CDI specification for any drift of the refresh units,
  container_toolkit's key record creates the state directory device_plugin keeps). Several drifts of one role share a
  run, so a role's change report alone could come from another of its drifts; what catches a role that misses one is
  step 2: the observed state must equal the converged one, and no other drift in the round can have put that thing back.
  Five rounds today: as many as the largest set of cases that all conflict with one another (the CDI specification's
  content and mode, its directory removed, the refresh path unit stopped, and disabled).
- `make test-full` (GPUOPS_TEST_FULL=1) adds the rounds of at most one case per role (``per_role``, 21 rounds
  today, marked full): a role meets one drift per run, so its change report is that drift's, and no repair of one drift
  can hide the miss of another by the same role, whatever ``conflict`` says.

A drift the roles miss is put back by the test itself, so that the cases after it start from a converged node.

On the lab the nvidia_driver role installs nothing (the node has no NVIDIA PCI device) and cuda_toolkit is off by
default: their things are not here. The container toolkit's repository key is not pinned by fingerprint in the
lab's inventory, as by default.

The module runs last in the session (``last_in_session``): the modules before it expect a node the playbooks have
not touched yet (test_lab's allocatable, test_site's check run and RuntimeClass), and test_lab's last test only
needs a node with GPUs, which this module leaves.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Lab
from kubernetes import client
from playbook_run import PlaybookRun, inventory_hostvars, lab_inventory, run_playbook

# The whole module runs under make test-full (make test's budget on 2 cores leaves no room for its converges): the
# packed rounds and then the rounds of one case per role. make test keeps the driver's drift repaired in molecule
# `default` and a second run changing nothing after each converge in the other e2e modules.
pytestmark = [pytest.mark.last_in_session, pytest.mark.full]

GPU = "nvidia.com/gpu"
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
TOOLKIT_VERSION = "1.18.1-1"
PLUGIN_OS_PACKAGES = ("python3-venv", "python3-pip")
KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.asc"
SOURCES = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"
PREFERENCES = "/etc/apt/preferences.d/gpuops-nvidia-container-toolkit.pref"
UNATTENDED = "/etc/apt/apt.conf.d/51gpuops-container-toolkit-unattended-upgrades"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
CDI_DIR = "/var/run/cdi"
CDI_SPEC = f"{CDI_DIR}/nvidia.yaml"
CDI_REFRESH_ENV = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
PLUGIN_DIR = "/opt/gpuops/device-plugin"
VENV = f"{PLUGIN_DIR}/venv"
PLUGIN_CONFIG_DIR = "/etc/gpuops/device-plugin"
PLUGIN_CONFIG = f"{PLUGIN_CONFIG_DIR}/config.yaml"
PLUGIN_UNIT = "/etc/systemd/system/gpuops-device-plugin.service"
STATE_DIR = "/var/lib/gpuops"
ALLOCATION_RECORD = f"{STATE_DIR}/allocation-mode"
# Paths whose type, mode, owner and content (SHA-256) are compared with the converged node's.
FILES = (
    "/etc/apt/keyrings",
    KEYRING,
    SOURCES,
    PREFERENCES,
    UNATTENDED,
    TOOLKIT_CONFIG,
    CDI_DIR,
    CDI_SPEC,
    PLUGIN_DIR,
    f"{PLUGIN_DIR}/src",
    f"{PLUGIN_DIR}/src.tar",
    f"{PLUGIN_DIR}/src.tar.part",
    f"{VENV}/bin/gpu-device-plugin",
    f"{VENV}/bin/python",
    f"{VENV}/bin/python3",
    PLUGIN_CONFIG_DIR,
    PLUGIN_CONFIG,
    PLUGIN_UNIT,
    STATE_DIR,
    ALLOCATION_RECORD,
    "/var/lib/kubelet/device-plugins",
)
UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service", "gpuops-device-plugin.service", "containerd.service")
# Where the drifts keep what they changed, to put it back when a role does not.
SAVED = "/var/tmp/gpuops-drift"

# Run on the node with its python3 (3.11: tomllib); prints one JSON object. Only reads.
OBSERVE = r"""
import glob, grp, hashlib, json, os, pwd, re, stat, subprocess, sys, tomllib

files, packages, units, venv, containerd, env_file = json.loads(sys.argv[1])
out = {}

def describe(path, content=True):
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    owner = pwd.getpwuid(info.st_uid).pw_name + ":" + grp.getgrgid(info.st_gid).gr_name
    mode = "%04o" % stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return "link to %s (%s)" % (os.readlink(path), "resolves" if os.path.exists(path) else "dangling")
    if stat.S_ISDIR(info.st_mode):
        return "directory %s %s" % (mode, owner)
    if not content:
        return "file %s %s" % (mode, owner)
    with open(path, "rb") as handle:
        return "file %s %s sha256:%s" % (mode, owner, hashlib.sha256(handle.read()).hexdigest()[:16])

def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, check=False)

for path in files:
    out["path " + path] = describe(path)
listed = run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", *packages).stdout
found = {line.split(" ", 1)[0]: line.split(" ", 1)[1].strip() for line in listed.splitlines() if line.strip()}
held = run("apt-mark", "showhold").stdout.split()
for name in packages:
    out["package " + name] = found.get(name, "unknown to dpkg") + (" (dpkg hold)" if name in held else "")
shown = run("systemctl", "show", "-p", "UnitFileState,ActiveState", *units).stdout.strip().split("\n\n")
for name, block in zip(units, shown):
    out["unit " + name] = " ".join(sorted(block.split()))
out["venv distributions"] = sorted(
    os.path.basename(p) for p in glob.glob(venv + "/lib/python*/site-packages/*.dist-info"))
try:
    imported = run(venv + "/bin/python", "-c", "import gpu_device_plugin.cli, gpu_device_plugin.server")
    out["venv daemon import"] = "imports" if imported.returncode == 0 else "fails: " + (
        (imported.stderr.strip().splitlines() or ["exit %d" % imported.returncode])[-1])
except OSError as error:
    out["venv daemon import"] = "no interpreter: %s" % error
out["containerd config mode"] = describe(containerd, content=False)
try:
    with open(containerd, "rb") as handle:
        out["containerd config (TOML)"] = tomllib.load(handle)
except (OSError, tomllib.TOMLDecodeError) as error:
    out["containerd config (TOML)"] = "unreadable: %s" % error
try:
    with open(env_file, encoding="utf-8") as handle:
        paths = re.findall(r"(?m)^NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=(.*)$", handle.read())
    # Without the setting the service writes to /var/run/cdi/nvidia.yaml.
    out["CDI refresh output"] = paths[-1].strip() if paths else "/var/run/cdi/nvidia.yaml"
except FileNotFoundError:
    out["CDI refresh output"] = "no environment file"
print(json.dumps(out, sort_keys=True))
"""


@dataclass
class Converged:
    node: str
    inventory: Path
    health_url: str
    state: dict[str, Any]


def observe(lab: Lab, node: str, health_url: str) -> dict[str, Any]:
    """What the roles manage on the node, read from the node and the API server (see the module's docstring)."""
    args = json.dumps(
        [list(FILES), [*TOOLKIT_PACKAGES, *PLUGIN_OS_PACKAGES], list(UNITS), VENV, CONTAINERD_CONFIG, CDI_REFRESH_ENV]
    )
    state: dict[str, Any] = json.loads(lab.node_exec(node, "python3", "-", args, input_text=OBSERVE).stdout)
    try:
        with urllib.request.urlopen(health_url, timeout=5) as answer:
            state["plugin /healthz"] = answer.status
    except (urllib.error.URLError, OSError) as error:
        state["plugin /healthz"] = f"no answer ({type(error).__name__})"
    found = lab.node(node)
    state["node labels"] = {k: v for k, v in (found.metadata.labels or {}).items() if k.startswith("nvidia.com/")}
    state["node annotations"] = {
        k: v for k, v in (found.metadata.annotations or {}).items() if k.startswith("gpuops.k8s/")
    }
    state["node taints"] = sorted(f"{t.key}={t.value or ''}:{t.effect}" for t in found.spec.taints or [])
    try:
        state["RuntimeClass nvidia"] = client.NodeV1Api(lab.api).read_runtime_class("nvidia").handler
    except client.ApiException as error:
        state["RuntimeClass nvidia"] = f"absent ({error.status})"
    return state


def differences(state: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """key -> (now, converged) for every key that differs."""
    return {k: (state.get(k), wanted.get(k)) for k in sorted(set(state) | set(wanted)) if state.get(k) != wanted.get(k)}


def run_site(converged: Converged) -> PlaybookRun:
    return run_playbook("site.yml", converged.inventory, limit=converged.node)


@pytest.fixture(scope="module")
def converged(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Converged:
    """The lab's first node converged by site.yml (default deployment), confirmed by a run with no change."""
    node = lab.nodes[0]
    inventory = lab_inventory(tmp_path_factory.mktemp("drift") / "inventory.yml")
    health_url = f"http://{inventory_hostvars(inventory, node)['device_plugin_metrics_address']}/healthz"
    first = run_playbook("site.yml", inventory, limit=node)
    assert first.returncode == 0, first.summary()
    second = run_playbook("site.yml", inventory, limit=node)
    assert second.returncode == 0, second.summary()
    assert second.recap[node]["changed"] == 0, second.changed_tasks()
    lab.node_exec(node, "sh", "-c", f"rm -rf {SAVED} && mkdir -p {SAVED}")
    state = observe(lab, node, health_url)
    # What the cases compare with must be a working GPU node.
    assert state["plugin /healthz"] == 200, state
    assert state["venv daemon import"] == "imports", state
    assert state["node labels"].get("nvidia.com/gpu.present") == "true", state
    print(f"site.yml to converge {node}: {first.seconds:.0f}s, then a run with no change: {second.seconds:.0f}s")
    return Converged(node=node, inventory=inventory, health_url=health_url, state=state)


# The drifts. Each changes one thing, through the node's shell or the API, as an operator, a package upgrade or a
# killed job would; `keep` names the paths saved first, so that a drift a role misses can be put back.

Drift = Callable[[Lab, str], Any]


def shell(script: str) -> Drift:
    return lambda lab, node: lab.node_exec(node, "sh", "-ec", script)


def edit(path: str, change: Callable[[str], str]) -> Drift:
    """Rewrite a file's text in place (its inode, mode and owner stay)."""

    def drift(lab: Lab, node: str) -> None:
        text = lab.node_exec(node, "cat", path).stdout
        changed = change(text)
        assert changed != text, f"the drift does not change {path}"
        lab.node_exec(node, "sh", "-c", f"cat > {path}", input_text=changed)

    return drift


def api_patch_node(body: Callable[[client.V1Node], dict]) -> Drift:
    return lambda lab, node: lab.core.patch_node(node, body(lab.node(node)))


def without_gpu_taint(found: client.V1Node) -> dict:
    kept = [t.to_dict() for t in found.spec.taints or [] if t.key != GPU]
    return {"spec": {"taints": kept}}


def other_libnvidia_container1(lab: Lab, node: str) -> None:
    """libnvidia-container1 at 1.17.8-1 instead of the held 1.18.1-1: the lab's repository serves 1.18.1 only, so
    the older package is a test double built on the node (the lab's 1.18.1 package is an empty stand-in too);
    dpkg installs it over the held version as a manual downgrade would."""
    script = (
        "d=$(mktemp -d) && mkdir -p $d/DEBIAN"
        " && printf 'Package: libnvidia-container1\\nVersion: 1.17.8-1\\nArchitecture: amd64\\n"
        "Maintainer: gpuops.k8s tests <tests@example.invalid>\\n"
        "Description: TEST DOUBLE an older libnvidia-container1 (tests/e2e/test_drift.py)\\n' > $d/DEBIAN/control"
        f" && dpkg-deb -b $d {SAVED}/libnvidia-container1_1.17.8-1_amd64.deb >/dev/null"
        f" && dpkg --force-depends -i {SAVED}/libnvidia-container1_1.17.8-1_amd64.deb && rm -rf $d"
    )
    lab.node_exec(node, "sh", "-ec", script)


def interrupted_install(lab: Lab, node: str) -> None:
    """What a run killed in systemd_install.yml's 'Install the daemon into the virtual environment' leaves on a
    node the role installs for the first time: the package copied to src.tar.part and unpacked into src/, no
    src.tar (it is renamed only after the install), and pip stopped half-way, the daemon's files partly written
    (here: its server module missing, its entry point in place)."""
    script = (
        f"cd {PLUGIN_DIR} && mv src.tar src.tar.part"
        f" && rm {VENV}/lib/python3*/site-packages/gpu_device_plugin/server.py"
    )
    lab.node_exec(node, "sh", "-ec", script)


def runtime_class_back(lab: Lab, node: str) -> None:
    """The RuntimeClass as device_plugin creates it, where it is gone."""
    api = client.NodeV1Api(lab.api)
    try:
        api.read_runtime_class("nvidia")
    except client.ApiException as error:
        if error.status != 404:
            raise
        api.create_runtime_class(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "handler": "nvidia",
                "metadata": {"name": "nvidia", "labels": {"app.kubernetes.io/managed-by": "gpuops.k8s"}},
            }
        )


@dataclass
class Case:
    role: str
    thing: str
    drift: Drift
    keep: tuple[str, ...] = ()
    # Puts back what `keep` cannot (packages, units, API objects). Run for every case of a round that left a drift,
    # where the role may have put this one back already: it must leave a thing that is back as it is.
    undo: Drift | None = None
    # What the drift changes that `keep` does not name: a unit, the package database, an API object, or a path it
    # changes with the one it keeps (see `conflict`).
    touches: tuple[str, ...] = ()
    # What the role's repair of this drift writes or starts whatever its state, besides the drifted thing: a
    # handler's restart, a task that writes its file without asking first, a directory it creates on the way. A
    # drift of one of these in the same run would be repaired even by a role that missed it (see `conflict`).
    repair_also: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.role}.{self.thing}"


def mode_case(role: str, thing: str, path: str, mode: str, repair_also: tuple[str, ...] = ()) -> Case:
    return Case(role, thing, shell(f"chmod {mode} {path}"), keep=(path,), repair_also=repair_also)


def install_packages(*pairs: str) -> Drift:
    """Back to the held versions, from the node's apt cache (no index update)."""
    return shell(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades"
        f" --allow-change-held-packages {' '.join(pairs)} >/dev/null"
    )


TOOLKIT_PINS = tuple(f"{name}={TOOLKIT_VERSION}" for name in TOOLKIT_PACKAGES)

# The things the cases share that are not paths (`Case.touches`, `Case.repair_also`).
# dpkg's one database: apt refuses to act while a drift has broken its dependencies (the older libnvidia-container1),
# and container_toolkit's one install task puts all four toolkit packages back at their version.
DPKG = "the dpkg database"
CDI_REFRESH_PATH_UNIT = "unit nvidia-cdi-refresh.path"
CDI_REFRESH_SERVICE_UNIT = "unit nvidia-cdi-refresh.service"
PLUGIN_ACTIVE = "unit gpuops-device-plugin.service: active"
PLUGIN_ENABLED = "unit gpuops-device-plugin.service: enabled"
RUNTIME_CLASS = "API: RuntimeClass nvidia"
# gpu_node_labels patches the node's labels and taint in one request.
NODE_LABELS = "API: the node's labels and taint"
# container_toolkit's key record (tasks/key_record.yml, after a key is fetched) creates the state directory it shares
# with device_plugin, with its mode.
KEY_RECORD_REPAIR = (STATE_DIR,)
# cdi.yml, included for any drift of the specification, its directory or NVIDIA's refresh units, writes the
# specification without asking first.
CDI_REPAIR = (CDI_SPEC,)
# The device plugin's restart handler: a new config, unit, dependency or daemon restarts the service.
PLUGIN_RESTART = (PLUGIN_ACTIVE,)
# A new unit file is enabled and started as well (systemd_install.yml, 'Enable and start the service').
PLUGIN_UNIT_REPAIR = (PLUGIN_ACTIVE, PLUGIN_ENABLED)

CASES = [
    # container_toolkit: the repository, the hold, the packages.
    mode_case("container_toolkit", "keyring-dir-mode", "/etc/apt/keyrings", "0700"),
    Case(
        "container_toolkit",
        "keyring-content",
        shell(f": > {KEYRING}"),
        keep=(KEYRING,),
        repair_also=KEY_RECORD_REPAIR,
    ),
    mode_case("container_toolkit", "keyring-mode", KEYRING, "0600", repair_also=KEY_RECORD_REPAIR),
    Case(
        "container_toolkit",
        "sources-content",
        edit(SOURCES, lambda t: re.sub(r"(?m)^URIs: .*$", "URIs: http://127.0.0.1:9/elsewhere", t)),
        keep=(SOURCES,),
    ),
    mode_case("container_toolkit", "sources-mode", SOURCES, "0600"),
    Case(
        "container_toolkit",
        "hold-content",
        edit(PREFERENCES, lambda t: t.replace("Pin-Priority: 1001", "Pin-Priority: 500")),
        keep=(PREFERENCES,),
    ),
    mode_case("container_toolkit", "hold-mode", PREFERENCES, "0600"),
    Case(
        "container_toolkit",
        "unattended-upgrades-content",
        edit(UNATTENDED, lambda t: re.sub(r'(?m)^\s*"libnvidia-container1\$";\n', "", t)),
        keep=(UNATTENDED,),
    ),
    mode_case("container_toolkit", "unattended-upgrades-mode", UNATTENDED, "0600"),
    Case(
        "container_toolkit",
        "package-removed",
        shell("dpkg -r nvidia-container-toolkit >/dev/null"),
        undo=install_packages(*TOOLKIT_PINS),
        touches=(DPKG,),
    ),
    Case(
        "container_toolkit",
        "package-other-version",
        other_libnvidia_container1,
        undo=install_packages(*TOOLKIT_PINS),
        touches=(DPKG,),
    ),
    # container_toolkit: the runtime's mode, the CDI specification and its refresh units.
    Case(
        "container_toolkit",
        "runtime-mode-value",
        edit(TOOLKIT_CONFIG, lambda t: re.sub(r'(?m)^mode = "cdi"$', 'mode = "legacy"', t)),
        keep=(TOOLKIT_CONFIG,),
    ),
    mode_case("container_toolkit", "runtime-config-mode", TOOLKIT_CONFIG, "0600"),
    Case(
        "container_toolkit",
        "cdi-spec-content",
        edit(CDI_SPEC, lambda t: re.sub(r"/dev/nvidia0\b", "/dev/nvidia9", t)),
        keep=(CDI_SPEC,),
        repair_also=CDI_REPAIR,
    ),
    mode_case("container_toolkit", "cdi-spec-mode", CDI_SPEC, "0600", repair_also=CDI_REPAIR),
    mode_case("container_toolkit", "cdi-dir-mode", CDI_DIR, "0700", repair_also=CDI_REPAIR),
    Case(
        "container_toolkit",
        "cdi-dir-removed",
        shell(f"rm -rf {CDI_DIR}"),
        keep=(CDI_DIR,),
        touches=(CDI_SPEC,),
        repair_also=CDI_REPAIR,
    ),
    Case(
        "container_toolkit",
        "cdi-refresh-env-output",
        shell(f"echo NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/etc/cdi/elsewhere.yaml >> {CDI_REFRESH_ENV}"),
        keep=(CDI_REFRESH_ENV,),
        repair_also=CDI_REPAIR,
    ),
    Case(
        "container_toolkit",
        "cdi-refresh-path-stopped",
        shell("systemctl stop nvidia-cdi-refresh.path"),
        undo=shell("systemctl start nvidia-cdi-refresh.path"),
        touches=(CDI_REFRESH_PATH_UNIT,),
        repair_also=CDI_REPAIR,
    ),
    Case(
        "container_toolkit",
        "cdi-refresh-path-disabled",
        shell("systemctl disable -q nvidia-cdi-refresh.path"),
        undo=shell("systemctl enable -q nvidia-cdi-refresh.path"),
        touches=(CDI_REFRESH_PATH_UNIT,),
        repair_also=CDI_REPAIR,
    ),
    Case(
        "container_toolkit",
        "cdi-refresh-service-disabled",
        shell("systemctl disable -q nvidia-cdi-refresh.service"),
        undo=shell("systemctl enable -q nvidia-cdi-refresh.service"),
        touches=(CDI_REFRESH_SERVICE_UNIT,),
        repair_also=CDI_REPAIR,
    ),
    # nvidia_runtime: containerd's config.
    Case(
        "nvidia_runtime",
        "runtime-entry-removed",
        edit(
            CONTAINERD_CONFIG,
            lambda t: re.sub(
                r'(?ms)^\s*\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\.runtimes\.nvidia.*?'
                r'(?=^\s*\[plugins\."io\.containerd\.grpc\.v1\.cri"\.cni\])',
                "\n",
                t,
            ),
        ),
        keep=(CONTAINERD_CONFIG,),
    ),
    Case(
        "nvidia_runtime",
        "runtime-entry-binary",
        edit(
            CONTAINERD_CONFIG,
            # Where the GPU Operator's toolkit installs the runtime: an NVIDIA binary the role takes back. (An entry
            # named nvidia with another runtime's binary is not the role's to take: it stops with one sentence.)
            lambda t: t.replace(
                "/usr/bin/nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime"
            ),
        ),
        keep=(CONTAINERD_CONFIG,),
    ),
    Case(
        "nvidia_runtime",
        "default-runtime",
        edit(
            CONTAINERD_CONFIG, lambda t: re.sub(r'default_runtime_name = "nvidia"', 'default_runtime_name = "runc"', t)
        ),
        keep=(CONTAINERD_CONFIG,),
    ),
    mode_case("nvidia_runtime", "config-mode", CONTAINERD_CONFIG, "0666"),
    # device_plugin, systemd deployment.
    Case(
        "device_plugin",
        "config-content",
        edit(PLUGIN_CONFIG, lambda t: t.replace("migStrategy: none", "migStrategy: single")),
        keep=(PLUGIN_CONFIG,),
        repair_also=PLUGIN_RESTART,
    ),
    mode_case("device_plugin", "config-mode", PLUGIN_CONFIG, "0600", repair_also=PLUGIN_RESTART),
    mode_case("device_plugin", "config-dir-mode", PLUGIN_CONFIG_DIR, "0700"),
    Case(
        "device_plugin",
        "unit-content",
        edit(PLUGIN_UNIT, lambda t: t.replace("NoNewPrivileges=yes\n", "")),
        keep=(PLUGIN_UNIT,),
        repair_also=PLUGIN_UNIT_REPAIR,
    ),
    mode_case("device_plugin", "unit-mode", PLUGIN_UNIT, "0600", repair_also=PLUGIN_UNIT_REPAIR),
    # The service's one task enables and starts it: either repair puts the other state back as well.
    Case(
        "device_plugin",
        "service-stopped",
        shell("systemctl stop gpuops-device-plugin"),
        undo=shell("systemctl start gpuops-device-plugin"),
        touches=(PLUGIN_ACTIVE,),
        repair_also=(PLUGIN_ENABLED,),
    ),
    Case(
        "device_plugin",
        "service-disabled",
        shell("systemctl disable -q gpuops-device-plugin"),
        undo=shell("systemctl enable -q gpuops-device-plugin"),
        touches=(PLUGIN_ENABLED,),
        repair_also=(PLUGIN_ACTIVE,),
    ),
    Case(
        "device_plugin",
        "venv-dependency-removed",
        shell(f"{VENV}/bin/pip uninstall -q -y prometheus-client"),
        keep=(VENV,),
        repair_also=PLUGIN_RESTART,
    ),
    Case(
        "device_plugin",
        "venv-daemon-removed",
        shell(f"{VENV}/bin/pip uninstall -q -y gpu-device-plugin"),
        keep=(VENV,),
        repair_also=PLUGIN_RESTART,
    ),
    Case(
        "device_plugin",
        "venv-python-gone",
        shell(f"rm {VENV}/bin/python {VENV}/bin/python3 {VENV}/bin/python3.*"),
        keep=(VENV,),
    ),
    Case(
        "device_plugin",
        "install-interrupted",
        interrupted_install,
        keep=(PLUGIN_DIR,),
        repair_also=PLUGIN_RESTART,
    ),
    Case(
        "device_plugin",
        "os-package-removed",
        shell("DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq python3-venv >/dev/null"),
        undo=install_packages("python3-venv"),
        touches=(DPKG,),
    ),
    Case(
        "device_plugin",
        "allocation-record-changed",
        shell(f"echo dra > {ALLOCATION_RECORD}"),
        keep=(ALLOCATION_RECORD,),
    ),
    Case("device_plugin", "allocation-record-removed", shell(f"rm {ALLOCATION_RECORD}"), keep=(ALLOCATION_RECORD,)),
    mode_case("device_plugin", "allocation-record-mode", ALLOCATION_RECORD, "0600"),
    mode_case("device_plugin", "state-dir-mode", STATE_DIR, "0700"),
    Case(
        "device_plugin",
        "runtimeclass-removed",
        lambda lab, node: client.NodeV1Api(lab.api).delete_runtime_class("nvidia"),
        undo=runtime_class_back,
        touches=(RUNTIME_CLASS,),
    ),
    # gpu_node_labels, through the API.
    Case(
        "gpu_node_labels",
        "label-removed",
        api_patch_node(lambda found: {"metadata": {"labels": {"nvidia.com/gpu.product": None}}}),
        touches=(NODE_LABELS,),
    ),
    Case("gpu_node_labels", "taint-removed", api_patch_node(without_gpu_taint), touches=(NODE_LABELS,)),
]


def save_kept(lab: Lab, node: str, case: Case) -> None:
    """Copy the paths a drift changes to the node's SAVED directory (modes, owners and links kept)."""
    for index, path in enumerate(case.keep):
        kept = f"{SAVED}/{case.id}/{index}"
        lab.node_exec(node, "sh", "-ec", f"rm -rf {kept} && mkdir -p {kept} && cp -a {path} {kept}/")


def put_back(lab: Lab, converged: Converged, case: Case) -> None:
    """Undo a drift the roles left in place, so that the next case starts from the converged node."""
    node = converged.node
    for index, path in enumerate(case.keep):
        name = path.rstrip("/").rsplit("/", 1)[1]
        lab.node_exec(node, "sh", "-ec", f"rm -rf {path} && cp -a {SAVED}/{case.id}/{index}/{name} {path}")
    if case.undo is not None:
        case.undo(lab, node)
    if case.role == "gpu_node_labels":
        state = converged.state
        lab.core.patch_node(node, {"metadata": {"labels": state["node labels"]}})
        if "nvidia.com/gpu=present:NoSchedule" in state["node taints"]:
            found = lab.node(node)
            taints = [t.to_dict() for t in found.spec.taints or [] if t.key != GPU]
            lab.core.patch_node(
                node, {"spec": {"taints": [*taints, {"key": GPU, "value": "present", "effect": "NoSchedule"}]}}
            )


def per_role(cases: list[Case]) -> list[tuple[Case, ...]]:
    """The cases in rounds of at most one per role, in their order (`make test-full`): a role meets one drift per
    run, so no repair of one drift can hide the miss of another by the same role, and a round costs two runs of
    site.yml whatever the number of roles it drifts."""
    by_role: dict[str, list[Case]] = {}
    for case in cases:
        by_role.setdefault(case.role, []).append(case)
    return [
        tuple(role_cases[i] for role_cases in by_role.values() if i < len(role_cases))
        for i in range(max(len(role_cases) for role_cases in by_role.values()))
    ]


def related(one: str, other: str) -> bool:
    """The same thing, or paths of which one is in the other (a directory and a file under it)."""
    return one == other or other.startswith(one.rstrip("/") + "/") or one.startswith(other.rstrip("/") + "/")


def conflict(one: Case, other: Case) -> bool:
    """Whether two drifts must not meet in one run: they change one thing (`keep` paths equal or one in the other,
    or a `touches` in common), or the repair of one writes what the other changed (`repair_also`, named exactly),
    which would put it back even where its role missed it."""
    things = (*one.keep, *one.touches)
    others = (*other.keep, *other.touches)
    return (
        any(related(a, b) for a in things for b in others)
        or any(a in others for a in one.repair_also)
        or any(b in things for b in other.repair_also)
    )


def packed(cases: list[Case]) -> list[tuple[Case, ...]]:
    """The cases in as few rounds as a greedy colouring of `conflict` finds (DSatur: the case with the most rounds
    closed to it first), each round in the cases' order (the core, not marked full). Several drifts of one role may
    meet in a run; none that touch one thing, or that one's repair would put back."""
    closed: dict[int, set[int]] = {
        i: {j for j, other in enumerate(cases) if j != i and conflict(case, other)} for i, case in enumerate(cases)
    }
    round_of: dict[int, int] = {}
    while len(round_of) < len(cases):
        saturation = {i: len({round_of[j] for j in closed[i] if j in round_of}) for i in closed if i not in round_of}
        pick = max(saturation, key=lambda i: (saturation[i], len(closed[i]), -i))
        taken = {round_of[j] for j in closed[pick] if j in round_of}
        round_of[pick] = next(r for r in range(len(cases)) if r not in taken)
    return [tuple(case for i, case in enumerate(cases) if round_of[i] == r) for r in range(max(round_of.values()) + 1)]


def round_id(drifts: tuple[Case, ...]) -> str:
    """role.thing,thing+role.thing: the round's cases by role."""
    by_role: dict[str, list[str]] = {}
    for case in drifts:
        by_role.setdefault(case.role, []).append(case.thing)
    return "+".join(f"{role}.{','.join(things)}" for role, things in by_role.items())


PACKED = packed(CASES)
PER_ROLE = per_role(CASES)
ROUNDS = [pytest.param(drifts, id=f"packed-{round_id(drifts)}") for drifts in PACKED] + [
    pytest.param(drifts, id=f"per-role-{round_id(drifts)}", marks=pytest.mark.full) for drifts in PER_ROLE
]


def test_the_rounds_hold_every_case_once_and_packed_no_two_that_conflict() -> None:
    """Both ways of grouping the cases run each case once; a packed round holds no two cases that `conflict`,
    a per-role round no two of one role."""
    for grouping in (PACKED, PER_ROLE):
        assert sorted(case.id for drifts in grouping for case in drifts) == sorted(case.id for case in CASES)
    for drifts in PACKED:
        clashes = [(a.id, b.id) for i, a in enumerate(drifts) for b in drifts[i + 1 :] if conflict(a, b)]
        assert clashes == [], clashes
    for drifts in PER_ROLE:
        roles = [case.role for case in drifts]
        assert len(roles) == len(set(roles)), roles


@pytest.mark.parametrize("drifts", ROUNDS)
def test_drift_is_repaired_and_the_next_run_changes_nothing(
    lab: Lab, converged: Converged, drifts: tuple[Case, ...]
) -> None:
    node = converged.node
    seen = differences(observe(lab, node, converged.health_url), converged.state)
    assert seen == {}, f"the node is not converged before the drift (an earlier round left it so): {seen}"
    names = ", ".join(case.id for case in drifts)
    try:
        for case in drifts:
            save_kept(lab, node, case)
            case.drift(lab, node)
            now = differences(observe(lab, node, converged.health_url), converged.state)
            assert now != seen, f"{case.id}: the drift shows nowhere in what the test observes"
            seen = now

        repair = run_site(converged)
        assert repair.returncode == 0, repair.summary()
        missed = differences(observe(lab, node, converged.health_url), converged.state)
        assert missed == {}, (
            f"{names}: site.yml (changed={repair.recap[node]['changed']}) left a drift: {missed}; "
            f"changed tasks: {repair.changed_tasks()}"
        )
        for case in drifts:
            assert any(task.startswith(f"TASK [gpuops.k8s.{case.role} : ") for task in repair.changed_tasks()), (
                f"{case.id}: repaired without a change reported by {case.role}: {repair.changed_tasks()}"
            )
    finally:
        if differences(observe(lab, node, converged.health_url), converged.state):
            for case in drifts:
                put_back(lab, converged, case)

    after = run_site(converged)
    assert after.returncode == 0, after.summary()
    assert after.recap[node]["changed"] == 0, f"{names}: the run after the repair changed {after.changed_tasks()}"
    print(f"{names}: repair {repair.seconds:.0f}s, next run {after.seconds:.0f}s")
