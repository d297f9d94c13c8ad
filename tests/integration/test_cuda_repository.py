# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CUDA repository's one owner, on a real Debian 12 node with a real, signed, locally served mirror.

nvidia_driver and cuda_toolkit both add NVIDIA's CUDA repository. The playbook here runs the driver's repository
step (roles/nvidia_driver/tasks/repository-apt.yml) and the toolkit's apt step (roles/cuda_toolkit/tasks/apt.yml,
which installs a package from the mirror) the way the roles run them, in a throwaway container of the local
Debian 12 image, with the mirror set once. The second run must change nothing: when each role wrote the source
from its own variable, the file flipped between the mirror and NVIDIA's servers on every run.

The whole driver role from the same mirror (which holds a stand-in for the driver's package) shows the CUDA
repository's files are part of the driver role's one read: a converged node costs one module run, and a source or a
key that drifted is repaired by the next run (under `make test` the key replaced; under `make test-full` also the source
edited and the key's mode).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = "/etc/apt/sources.list.d/nvidia-cuda.sources"
KEY = "/etc/apt/keyrings/nvidia-cuda.asc"
# The helper molecule's verify uses: the names of a json-callback run's role tasks that ran a module on a node.
_spec = importlib.util.spec_from_file_location("module_runs", REPO / "molecule" / "shared" / "module_runs.py")
module_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(module_runs)
TOOLS = ("podman", "gpg", "dpkg-deb", "apt-ftparchive")


@pytest.fixture(scope="module")
def image():
    """The local Debian 12 image (scripts/build-base-image.sh: built once, cached; molecule and the lab use it)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    assert not missing, f"needs {', '.join(missing)} (scripts/bootstrap.sh installs them)"
    built = subprocess.run(
        [str(REPO / "scripts" / "build-base-image.sh")], capture_output=True, text=True, check=False, timeout=1800
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.strip()


PLAYBOOK = """\
- name: The CUDA repository as nvidia_driver and cuda_toolkit add it
  hosts: node
  gather_facts: true
  gather_subset: [min]
  vars:
    nvidia_driver_source: cuda
    nvidia_driver_pin: false
    nvidia_driver_unattended_upgrades_exclude: false
    cuda_toolkit_source: cuda
    cuda_toolkit_unattended_upgrades_exclude: false
  tasks:
    # What each role's main.yml loads before it (vars/main.yml comes with the role).
    - name: Load the roles' Debian data
      ansible.builtin.include_vars:
        file: "{{ item }}"
      loop:
        - ROLES/nvidia_driver/vars/Debian.yml
        - ROLES/cuda_toolkit/vars/Debian.yml

    - name: The driver's repository step
      ansible.builtin.include_role:
        name: gpuops.k8s.nvidia_driver
        tasks_from: repository-apt

    - name: The toolkit's repository step and install
      ansible.builtin.include_role:
        name: gpuops.k8s.cuda_toolkit
        tasks_from: apt
"""


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)


def first_fingerprint(listing: str) -> str:
    """The first fingerprint in gpg's --with-colons listing."""
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DRIVER_PLAYBOOK = """\
- name: The driver role from the CUDA repository, given a PCI scan with a GPU as site.yml gives its discovery
  hosts: node
  gather_facts: true
  gather_subset: [min]
  tasks:
    - name: The driver role
      ansible.builtin.include_role:
        name: gpuops.k8s.nvidia_driver
"""
# One NVIDIA GPU, as nvidia_gpu_info reports it from sysfs. The node is a container: nothing is built or loaded.
GPU_SCAN = {
    "source": "sysfs",
    "pci_devices": [
        {"bus_id": "0000:18:00.0", "vendor_id": "0x10de", "device_id": "0x2330", "class": "0x030200",
         "numa_node": 0, "driver": None}
    ],
    "nvswitch_devices": [],
}  # fmt: skip


def stand_in(build: Path, repo: Path, name: str, version: str) -> None:
    """An empty package NAME at VERSION, built under BUILD, in the repository directory REPO."""
    package = build / name
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: gpuops test\n"
        "Description: stand-in for an NVIDIA package\n"
    )
    assert run("dpkg-deb", "--build", str(package), str(repo / f"{name}_{version}_all.deb")).returncode == 0


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A signed flat apt repository at <url>/debian12/x86_64 holding cuda-toolkit-12-9 and a stand-in for the 580
    driver (nvidia-open-580), and its key's fingerprint."""
    root = tmp_path_factory.mktemp("mirror")
    home = root / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--batch", "--homedir", str(home), "--pinentry-mode", "loopback", "--passphrase", ""]
    assert (
        run(*gpg, "--quick-gen-key", "gpuops test <test@example.invalid>", "ed25519", "sign", "never").returncode == 0
    )
    listing = run(*gpg, "--with-colons", "--list-keys").stdout
    fingerprint = first_fingerprint(listing)
    repo = root / "repos" / "debian12" / "x86_64"
    package = root / "cuda-toolkit-12-9"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: cuda-toolkit-12-9\nVersion: 12.9.0-1\nArchitecture: all\nMaintainer: gpuops test\n"
        "Description: stand-in for the CUDA toolkit\n"
    )
    repo.mkdir(parents=True)
    assert run("dpkg-deb", "--build", str(package), str(repo / "cuda-toolkit-12-9_12.9.0-1_all.deb")).returncode == 0
    stand_in(root, repo, "nvidia-open-580", "580.95.05-1")
    (repo / "Packages").write_text(run("apt-ftparchive", "packages", ".", cwd=repo).stdout)
    (repo / "Release").write_text(run("apt-ftparchive", "release", ".", cwd=repo).stdout)
    assert run(*gpg, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")).returncode == 0
    (repo / "3bf863cc.pub").write_text(run(*gpg, "--armor", "--export", fingerprint).stdout)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}/repos", fingerprint
    finally:
        server.terminate()
        server.wait()


@pytest.fixture
def node(tmp_path, collection_root, image):
    """A throwaway Debian 12 container on the host's network, with no other apt source; and a playbook runner."""
    name = f"gpuops-cuda-repository-{os.getpid()}-{tmp_path.name[-12:]}".replace("_", "-")
    started = run("podman", "run", "-d", "--rm", "--name", name, "--network", "host", "--entrypoint", "/bin/sleep",
                  image, "infinity")  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        assert run("podman", "exec", name, "sh", "-c",
                   "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*").returncode == 0  # fmt: skip
        (tmp_path / "inventory").write_text(
            f"node ansible_connection=containers.podman.podman ansible_host={name} "
            "ansible_python_interpreter=/usr/bin/python3\n"
        )
        (tmp_path / "site.yml").write_text(PLAYBOOK.replace("ROLES/", f"{REPO}/roles/"))
        (tmp_path / "driver.yml").write_text(DRIVER_PLAYBOOK)

        def play(*args: str, playbook: str = "site.yml", callback: str | None = None) -> subprocess.CompletedProcess:
            env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collection_root), ANSIBLE_NOCOLOR="1")
            if callback:
                env["ANSIBLE_STDOUT_CALLBACK"] = callback
            return run("ansible-playbook", "-i", str(tmp_path / "inventory"), str(tmp_path / playbook), *args,
                       env=env)  # fmt: skip

        def cat(path: str) -> str | None:
            shown = run("podman", "exec", name, "cat", path)
            return shown.stdout if shown.returncode == 0 else None

        def sh(command: str) -> subprocess.CompletedProcess:
            return run("podman", "exec", name, "sh", "-c", command)

        play.sh = sh
        yield play, cat
    finally:
        run("podman", "rm", "-f", "-t", "0", name)


def recap(result: subprocess.CompletedProcess) -> str:
    return next((line for line in result.stdout.splitlines() if line.startswith("node ")), result.stdout[-3000:])


# One spelling on a real node: the driver role's, the one a mirror was set in before and the toolkit role did not
# see (its source flipped back to NVIDIA's on every run). How each of the three spellings becomes the one URL is
# covered in tests/unit/roles/test_node_package_selection.py, without a node.
@pytest.mark.parametrize("spelling", ["nvidia_driver_cuda_repo_base_url"])
def test_a_mirror_set_once_gives_one_stable_source(node, mirror, spelling):
    play, cat = node
    url, fingerprint = mirror
    given = ["-e", f"{spelling}={url}", "-e", f"nvidia_driver_repo_key_fingerprint={fingerprint}"]

    checked = play("--check", *given)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr
    assert cat(SOURCE) is None, "check mode wrote the source"

    first = play(*given)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    assert f"URIs: {url}/debian12/x86_64/\n" in cat(SOURCE)
    assert cat("/var/lib/dpkg/info/cuda-toolkit-12-9.list") is not None, "the toolkit package was not installed"

    second = play(*given)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert "changed=0" in recap(second), recap(second)
    assert f"URIs: {url}/debian12/x86_64/\n" in cat(SOURCE)


def test_two_different_mirrors_stop_the_play_with_one_sentence(node, mirror):
    play, cat = node
    url = mirror[0]
    result = play(
        "-e", f"nvidia_driver_cuda_repo_base_url={url}", "-e", "cuda_toolkit_repo_base_url=http://other.invalid"
    )
    assert result.returncode != 0
    assert f"nvidia_driver_cuda_repo_base_url is {url} but cuda_toolkit_repo_base_url is http://other.invalid" in (
        result.stdout
    ), result.stdout[-3000:]
    assert cat(SOURCE) is None


def test_a_wrong_pinned_key_is_refused_naming_the_variable_set(node, mirror):
    play, cat = node
    url, fingerprint = mirror
    wrong = "0123456789ABCDEF0123456789ABCDEF01234567"
    result = play("-e", f"cuda_repository_base_url={url}", "-e", f"cuda_toolkit_repo_key_fingerprint={wrong}")
    assert result.returncode != 0
    assert (
        f"cuda_toolkit_repo_key_fingerprint is {wrong}, but the key at {url}/debian12/x86_64/3bf863cc.pub has the "
        f"fingerprint {fingerprint}, so it was not installed." in result.stdout.replace("\\n", " ")
    ), result.stdout[-3000:]
    assert cat(SOURCE) is None and cat("/etc/apt/keyrings/nvidia-cuda.asc") is None


def driver_run(play, url: str, fingerprint: str) -> tuple[dict, list[str]]:
    """The driver role's run from the mirror: its json-callback report and the tasks that ran a module on the node."""
    extra = {
        "nvidia_driver_source": "cuda",
        "cuda_repository_base_url": url,
        "cuda_repository_key_fingerprint": fingerprint,
        "nvidia_driver_gpu_info": GPU_SCAN,
        # The node has no Debian source for python3-pynvml, and no kmod (and so no /etc/modprobe.d) for the blacklist.
        "nvidia_driver_pynvml": False,
        "nvidia_driver_blacklist_nouveau": False,
    }
    result = play("-e", json.dumps(extra), playbook="driver.yml", callback="ansible.posix.json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    return report, module_runs.module_runs(report)


def changes(report: dict) -> int:
    return report["stats"]["node"]["changed"]


READ = "gpuops.k8s.nvidia_driver : Read what the role manages on the node"


def test_the_driver_role_reads_the_cuda_repository_once_and_repairs_its_drift(node, mirror):
    play, cat = node
    url, fingerprint = mirror

    first, _runs = driver_run(play, url, fingerprint)
    assert changes(first) > 0
    assert f"URIs: {url}/debian12/x86_64/\n" in cat(SOURCE)
    assert play.sh("dpkg-query -W -f '${Version}' nvidia-open-580").stdout == "580.95.05-1"

    converged, runs = driver_run(play, url, fingerprint)
    assert (changes(converged), runs) == (0, [READ])

    source, key = cat(SOURCE), cat(KEY)
    drifts = [
        ("the source edited", f"sed -i 's|^URIs: .*|URIs: http://elsewhere.invalid/|' {SOURCE}"),
        ("the key's mode", f"chmod 0600 {KEY}"),
        ("the key replaced", f"echo 'not the key' > {KEY}"),
    ]
    if os.environ.get("GPUOPS_TEST_FULL") != "1":
        # make test: the key replaced (the repair fetches and checks the key again); make test-full: each drift.
        drifts = drifts[2:]
    for what, change in drifts:
        assert play.sh(change).returncode == 0, what
        repaired, _runs = driver_run(play, url, fingerprint)
        assert changes(repaired) > 0, what
        assert (cat(SOURCE), cat(KEY)) == (source, key), what
        assert play.sh(f"stat -c %a {KEY} {SOURCE}").stdout.split() == ["644", "644"], what
        again, runs = driver_run(play, url, fingerprint)
        assert (changes(again), runs) == (0, [READ]), what
