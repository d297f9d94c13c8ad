# Unit tests of the gpuops.k8s.node_state module. Files are real (a temporary directory); dpkg-query, rpm and
# systemctl are replaced by a command double (run_command answering with recorded output), since what they
# print is what the module parses.
from __future__ import annotations

import hashlib
import os

import pytest
from ansible.module_utils import basic
from ansible_collections.gpuops.k8s.plugins.modules import node_state
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import fail_module, run_module


class CommandDouble:
    """Stands in for dpkg-query/rpm/systemctl: answers each argv[0] basename with (rc, stdout, stderr)."""

    def __init__(self, answers, binaries):
        self.answers, self.binaries, self.calls = answers, binaries, []

    def get_bin_path(self, name, *args, **kwargs):
        return f"/usr/bin/{name}" if name in self.binaries else None

    def run_command(self, argv, *args, **kwargs):
        self.calls.append(argv)
        return self.answers[os.path.basename(argv[0])]


pytestmark = pytest.mark.usefixtures("patched")


def commands(monkeypatch, answers, binaries):
    double = CommandDouble(answers, binaries)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", double.get_bin_path)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", double.run_command)
    return double


def run(args, check=False):
    return run_module(node_state.main, dict(args, _ansible_check_mode=check))


def fail(args):
    return fail_module(node_state.main, args)


def test_paths_are_described_so_that_a_task_can_compare_them_whole(tmp_path):
    directory = tmp_path / "etc"
    directory.mkdir(mode=0o750)
    os.chmod(directory, 0o750)
    config = directory / "config.yaml"
    config.write_text("a: 1\n")
    os.chmod(config, 0o640)
    link = tmp_path / "link"
    link.symlink_to(config)
    absent = tmp_path / "absent"
    result = run({"paths": [str(directory), str(config), str(link), str(absent)]}, check=True)
    assert result["changed"] is False
    paths = result["paths"]
    owner, group = paths[str(config)]["owner"], paths[str(config)]["group"]
    assert paths[str(directory)] == {"type": "directory", "mode": "0750", "owner": owner, "group": group}
    assert paths[str(config)] == {
        "type": "file",
        "mode": "0640",
        "owner": owner,
        "group": group,
        "checksum": hashlib.sha1(b"a: 1\n").hexdigest(),
    }
    assert paths[str(link)]["type"] == "link", "a symbolic link must not be followed"
    assert paths[str(absent)] == {"type": "absent"}


def test_checksums_can_be_left_out(tmp_path):
    binary = tmp_path / "containerd"
    binary.write_bytes(b"\0" * 10)
    assert "checksum" not in run({"paths": [str(binary)], "checksum": False})["paths"][str(binary)]


def test_contents_are_read_as_text_and_a_missing_file_is_null(tmp_path):
    record = tmp_path / "allocation-mode"
    record.write_text("dra\n")
    result = run({"contents": [str(record), str(tmp_path / "none")]})
    assert result["contents"] == {str(record): "dra\n", str(tmp_path / "none"): None}


def test_a_large_file_gets_one_sentence(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (node_state.MAX_CONTENT + 1))
    assert fail({"contents": [str(big)]})["msg"] == (
        f"node_state: {big} is larger than 65536 bytes; node_state reads only small files."
    )


DPKG = (
    "nvidia-container-toolkit\t1.17.8-1\tinstall ok installed\n"
    "libnvidia-container1\t1.17.8-1\thold ok installed\n"
    "python3-pip\t23.0.1+dfsg-1\tdeinstall ok config-files\n"
)


def test_dpkg_versions_holds_and_unknown_packages(monkeypatch):
    double = commands(
        monkeypatch, {"dpkg-query": (1, DPKG, "dpkg-query: no packages found matching nope\n")}, {"dpkg-query"}
    )
    names = ["nvidia-container-toolkit", "libnvidia-container1", "python3-pip", "nope"]
    result = run({"packages": names})
    assert result["packages"] == {
        "nvidia-container-toolkit": {"version": "1.17.8-1", "held": False},
        "libnvidia-container1": {"version": "1.17.8-1", "held": True},
        # Removed with its config files left: not installed.
        "python3-pip": {"version": None, "held": False},
        "nope": {"version": None, "held": False},
    }
    assert double.calls[0][-4:] == names and double.calls[0][-5] == "--"


def test_a_dpkg_failure_gets_one_sentence(monkeypatch):
    commands(monkeypatch, {"dpkg-query": (2, "", "dpkg-query: error: database locked\n")}, {"dpkg-query"})
    assert (
        fail({"packages": ["x"]})["msg"] == "node_state: dpkg-query failed (exit 2): dpkg-query: error: database locked"
    )


def test_rpm_versions_where_there_is_no_dpkg(monkeypatch):
    rpm = "python3-pip\t21.3.1-1.el9\npackage nope is not installed\n"
    commands(monkeypatch, {"rpm": (1, rpm, "")}, {"rpm"})
    assert run({"packages": ["python3-pip", "nope"]})["packages"] == {
        "python3-pip": {"version": "21.3.1-1.el9", "held": None},
        "nope": {"version": None, "held": None},
    }


def test_no_package_manager_gets_one_sentence(monkeypatch):
    commands(monkeypatch, {}, set())
    assert "neither dpkg-query nor rpm is installed" in fail({"packages": ["x"]})["msg"]


SYSTEMCTL = (
    "Id=containerd.service\nLoadState=loaded\nActiveState=active\nUnitFileState=enabled\n\n"
    "Id=k3s.service\nLoadState=not-found\nActiveState=inactive\nUnitFileState=\n"
)


@pytest.fixture
def systemd(monkeypatch):
    """The host runs systemd (whatever the machine running the tests does)."""
    monkeypatch.setattr(node_state, "systemd_running", lambda: True)


def test_without_systemd_running_no_unit_is_known_and_nothing_is_asked(monkeypatch):
    monkeypatch.setattr(node_state, "systemd_running", lambda: False)
    double = commands(monkeypatch, {}, {"systemctl"})
    result = run({"units": ["containerd.service"]})
    assert result["units"] == {
        "containerd.service": {"load_state": "not-found", "active_state": "inactive", "unit_file_state": ""}
    }
    assert result["systemd"] is False
    assert double.calls == []


@pytest.mark.usefixtures("systemd")
def test_units_are_read_with_one_systemctl_show(monkeypatch):
    double = commands(monkeypatch, {"systemctl": (0, SYSTEMCTL, "")}, {"systemctl"})
    result = run({"units": ["containerd.service", "k3s.service"]})
    assert result["units"] == {
        "containerd.service": {"load_state": "loaded", "active_state": "active", "unit_file_state": "enabled"},
        "k3s.service": {"load_state": "not-found", "active_state": "inactive", "unit_file_state": ""},
    }
    assert len(double.calls) == 1


@pytest.mark.usefixtures("systemd")
def test_an_answer_for_fewer_units_than_asked_is_refused(monkeypatch):
    commands(monkeypatch, {"systemctl": (0, SYSTEMCTL.split("\n\n", maxsplit=1)[0], "")}, {"systemctl"})
    assert fail({"units": ["containerd.service", "k3s.service"]})["msg"] == (
        "node_state: systemctl show answered for 1 units, not the 2 asked for."
    )


@pytest.mark.usefixtures("systemd")
def test_no_systemctl_gets_one_sentence(monkeypatch):
    commands(monkeypatch, {}, set())
    assert fail({"units": ["containerd.service"]})["msg"] == (
        "node_state: systemctl is not installed, so the state of containerd.service cannot be read."
    )


def test_a_virtual_environment_and_its_exact_pins(tmp_path):
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    for dist in ("grpcio-1.85.1", "PyYAML-6.0.3", "nvidia_ml_py-13.615.71", "setuptools-79.0.0"):
        (site / f"{dist}.dist-info").mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_text("")
    wanted = [
        "grpcio==1.85.1",
        "pyyaml==6.0.3",
        "nvidia-ml-py == 13.615.71",
        "setuptools==80.9.0",
        "protobuf>=6",
        "kubernetes==35.0.0",
    ]
    env = run({"python_env": str(venv), "python_requirements": wanted})["python_env"]
    assert env["exists"] is True
    assert env["distributions"]["nvidia-ml-py"] == "13.615.71"
    # A wrong version, a range (never satisfied by what is installed) and a missing distribution.
    assert env["unsatisfied"] == ["setuptools==80.9.0", "protobuf>=6", "kubernetes==35.0.0"]


def test_a_missing_virtual_environment_satisfies_nothing(tmp_path):
    env = run({"python_env": str(tmp_path / "none"), "python_requirements": ["grpcio==1.85.1"]})["python_env"]
    assert env == {"exists": False, "distributions": {}, "unsatisfied": ["grpcio==1.85.1"]}


def test_a_command_is_run_and_a_missing_program_is_null(tmp_path):
    script = tmp_path / "print-spec"
    script.write_text('#!/bin/sh\necho "spec for $1"\necho warning >&2\nexit 3\n')
    script.chmod(0o755)
    result = run({"commands": {"spec": [str(script), "gpu0"], "absent": [str(tmp_path / "nvidia-ctk"), "cdi"]}})
    assert result["commands"] == {"spec": {"rc": 3, "stdout": "spec for gpu0\n", "stderr": "warning\n"}, "absent": None}


def test_a_command_that_is_not_an_argv_gets_one_sentence():
    assert fail({"commands": {"spec": "nvidia-ctk cdi generate"}})["msg"] == (
        "node_state: commands: spec must be a list of strings (the program and its arguments)."
    )


def test_a_record_is_current_until_a_recorded_path_changes(tmp_path):
    conf = tmp_path / "config.toml"
    conf.write_text("version = 2\n")
    mode = os.stat(conf).st_mode & 0o777
    dropins = tmp_path / "conf.d"
    dropins.mkdir()
    (dropins / "99-nvidia.toml").write_text("[a]\n")
    record = tmp_path / "record.json"
    written = run({"record_paths": [str(conf), str(dropins), str(tmp_path / "absent")], "record_key": "k1"})
    record.write_text(written["record_text"])
    assert run({"record": str(record)})["record"] == {"key": "k1", "current": True, "differs": []}

    # Content, mode, a file added to a recorded directory, an absent path that appears: each is seen.
    conf.write_text("version = 3\n")
    assert run({"record": str(record)})["record"]["differs"] == [str(conf)]
    conf.write_text("version = 2\n")
    os.chmod(conf, 0o600)
    assert run({"record": str(record)})["record"]["differs"] == [str(conf)]
    os.chmod(conf, mode)
    record.write_text(
        run({"record_paths": [str(conf), str(dropins), str(tmp_path / "absent")], "record_key": "k2"})["record_text"]
    )
    assert run({"record": str(record)})["record"] == {"key": "k2", "current": True, "differs": []}
    (dropins / "50-other.toml").write_text("[b]\n")
    assert run({"record": str(record)})["record"]["differs"] == [str(dropins)]
    (dropins / "50-other.toml").unlink()
    (dropins / "99-nvidia.toml").write_text("[c]\n")
    assert run({"record": str(record)})["record"]["differs"] == [str(dropins)]
    (dropins / "99-nvidia.toml").write_text("[a]\n")
    (tmp_path / "absent").write_text("")
    result = run({"record": str(record)})["record"]
    assert result == {"key": "k2", "current": False, "differs": [str(tmp_path / "absent")]}


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"key": "k"}'])
def test_a_missing_or_unreadable_record_is_not_current(tmp_path, text):
    record = tmp_path / "record.json"
    if text is not None:
        record.write_text(text)
    assert run({"record": str(record)})["record"] == {"key": None, "current": False, "differs": []}
