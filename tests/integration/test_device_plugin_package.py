"""The device plugin as the roles ship it: the systemd mode's source archive (roles/device_plugin/files/
pack_source.py) and the image reference the daemonset mode asks for by default.

The daemon's package links to three of the collection's module_utils files (gpu_device_plugin/_shared,
docs/architecture.md); the archive must carry the files themselves, or the node's copy would hold links
pointing nowhere. The image build (files/device_plugin/build-image.sh) and the role must name the same
image: the daemon-image tier checks that the built image carries the reference the script prints.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PLUGIN = os.path.join(REPO, "files", "device_plugin")
ROLE = os.path.join(REPO, "roles", "device_plugin")
SHARED = {
    "src/gpu_device_plugin/_shared/simulated_spec.py": "plugins/module_utils/_simulated_spec.py",
    "src/gpu_device_plugin/_shared/gpu_discovery.py": "plugins/module_utils/_gpu_discovery.py",
    "src/gpu_device_plugin/_shared/xid_classes.py": "plugins/module_utils/_xid_classes.py",
}


def _pack(cache: str) -> str:
    """The archive's path; checks the SHA-1 the packer prints after it (the role compares it with the node's copy)."""
    packed = subprocess.run(
        [sys.executable, os.path.join(ROLE, "files", "pack_source.py"), PLUGIN, cache],
        check=True,
        capture_output=True,
        text=True,
    )
    path, sha1 = packed.stdout.splitlines()
    with open(path, "rb") as handle:
        assert hashlib.sha1(handle.read()).hexdigest() == sha1
    return path


def test_the_source_archive_carries_the_shared_files_themselves(tmp_path):
    archive = _pack(str(tmp_path))
    with tarfile.open(archive) as tar:
        members = {member.name: member for member in tar.getmembers()}
        assert not [name for name, member in members.items() if member.issym() or member.islnk()]
        for inside, source in SHARED.items():
            assert members[inside].isfile(), inside
            with open(os.path.join(REPO, source), "rb") as handle:
                assert tar.extractfile(members[inside]).read() == handle.read()
    # The same tree packs to the same bytes (the role copies it only when it changed).
    again = _pack(str(tmp_path / "again"))
    with open(archive, "rb") as first, open(again, "rb") as second:
        assert first.read() == second.read()


def test_the_source_archive_installs_and_reads_a_spec(tmp_path):
    # pip installs the unpacked archive as the role does; the installed daemon reads a spec through the
    # collection's reader.
    archive = _pack(str(tmp_path / "cache"))
    source = tmp_path / "src"
    source.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
    )
    spec = os.path.join(REPO, "tests", "fixtures", "simulated", "a100-mig.yaml")
    code = (
        "import sys; from gpu_device_plugin import simspec; inv = simspec.load(sys.argv[1]); "
        "print(simspec.__file__); print(inv.gpus[0].architecture, len(inv.gpus[0].mig_devices)); "
        "from gpu_device_plugin._shared import xid_classes; print(xid_classes.classify(79)[0])"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run(
        [sys.executable, "-c", code, spec], check=True, capture_output=True, text=True, env=env, cwd=tmp_path
    )
    where, facts, xid79 = out.stdout.splitlines()
    assert where.startswith(str(target))
    assert facts.split()[0] == "ampere" and int(facts.split()[1]) > 0
    assert xid79 == "reboot"
    for name in ("gpu_discovery.py", "xid_classes.py"):
        assert not os.path.islink(target / "gpu_device_plugin" / "_shared" / name)


def test_the_role_default_image_is_the_reference_the_build_script_tags():
    reference = subprocess.run(
        [os.path.join(PLUGIN, "build-image.sh"), "--reference"], check=True, capture_output=True, text=True
    ).stdout.strip()
    with open(os.path.join(ROLE, "defaults", "main.yml")) as handle:
        default = yaml.safe_load(handle)["device_plugin_image"]
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]["device_plugin_image"]["default"]
    assert reference == default == spec
    import tomllib

    with open(os.path.join(PLUGIN, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    assert reference == f"localhost/{project['name']}:{project['version']}"
