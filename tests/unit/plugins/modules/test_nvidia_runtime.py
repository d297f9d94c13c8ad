# Unit tests of the gpuops.k8s.nvidia_runtime module: arguments in, files on disk and results out.
# AnsibleModule.exit_json/fail_json are replaced by exceptions so a test can read the result;
# everything else (files, atomic_move, backup_local) is real and works in a temporary directory.
from __future__ import annotations

import json
import os
import stat

import pytest
import tomllib
from ansible.module_utils import basic
from ansible_collections.gpuops.k8s.plugins.modules import nvidia_runtime
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import fail_module, run_module

RUNTIME = "/usr/bin/nvidia-container-runtime"
V2 = """\
version = 2
# comment kept
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""


pytestmark = pytest.mark.usefixtures("patched")


def run(args, check=False, diff=False):
    args = dict(args)
    if check:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    return run_module(nvidia_runtime.main, args)


def fail(args):
    return fail_module(nvidia_runtime.main, args)


def snapshot(path):
    st = os.stat(path)
    with open(path, "rb") as handle:
        return handle.read(), st.st_mtime_ns, st.st_ino


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(V2)
    return path


def test_present_changes_then_is_idempotent(config):
    first = run({"runtime": "containerd", "config_path": str(config)})
    assert first["changed"] is True
    assert first["config_version"] == 2
    assert first["default_runtime"] == "nvidia"
    assert first["runtime_entry"]["options"] == {"SystemdCgroup": True, "BinaryName": RUNTIME}
    assert "backup_file" not in first
    assert "diff" not in first
    data = tomllib.loads(config.read_text())
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "nvidia"
    assert "# comment kept" in config.read_text()
    before = snapshot(config)
    second = run({"runtime": "containerd", "config_path": str(config)})
    assert second["changed"] is False
    assert snapshot(config) == before


def test_check_mode_writes_nothing_and_reports_the_diff(config):
    before = snapshot(config)
    result = run({"runtime": "containerd", "config_path": str(config)}, check=True, diff=True)
    assert result["changed"] is True
    assert snapshot(config) == before
    diff = result["diff"]
    assert diff["before"] == V2
    assert diff["before_header"] == diff["after_header"] == str(config)
    assert "runtimes.nvidia]" in diff["after"]
    # what check mode announced is what a real run writes
    run({"runtime": "containerd", "config_path": str(config)})
    assert config.read_text() == diff["after"]


def test_diff_of_a_no_change_run_is_empty(config):
    run({"runtime": "containerd", "config_path": str(config)})
    result = run({"runtime": "containerd", "config_path": str(config)}, diff=True)
    assert result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]


def test_backup_and_mode_and_owner_are_kept(config):
    os.chmod(config, 0o640)
    result = run({"runtime": "containerd", "config_path": str(config), "backup": True})
    assert result["changed"]
    with open(result["backup_file"]) as handle:
        assert handle.read() == V2
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o640
    leftovers = [p for p in os.listdir(config.parent) if p.startswith(".config.toml.")]
    assert leftovers == []


def test_no_backup_when_nothing_changes(config):
    run({"runtime": "containerd", "config_path": str(config)})
    result = run({"runtime": "containerd", "config_path": str(config), "backup": True})
    assert "backup_file" not in result


def test_absent_restores_the_default(config):
    run({"runtime": "containerd", "config_path": str(config)})
    result = run({"runtime": "containerd", "config_path": str(config), "state": "absent"})
    assert result["changed"]
    assert result["runtime_entry"] is None
    assert result["default_runtime"] == "runc"
    assert tomllib.loads(config.read_text()) == tomllib.loads(V2)
    assert run({"runtime": "containerd", "config_path": str(config), "state": "absent"})["changed"] is False


def test_parse_error_leaves_the_file_byte_for_byte(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b"version = 2\n[plugins\n")
    before = snapshot(path)
    result = fail({"runtime": "containerd", "config_path": str(path), "backup": True})
    assert result["msg"].startswith(f"{path} could not be parsed as TOML: line 2, column")
    assert snapshot(path) == before
    assert os.listdir(tmp_path) == ["config.toml"]


def test_unknown_version_fails_cleanly(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("version = 1\n")
    assert "declares containerd config version 1" in fail({"runtime": "containerd", "config_path": str(path)})["msg"]


def test_clobber_is_refused(config):
    config.write_text(
        V2
        + '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\nruntime_type = "io.containerd.kata.v2"\n'
    )
    before = snapshot(config)
    result = fail({"runtime": "containerd", "config_path": str(config)})
    assert "already has a runtime" in result["msg"]
    assert snapshot(config) == before


def test_missing_containerd_file_uses_containerd_config_default(tmp_path, monkeypatch):
    path = tmp_path / "etc" / "containerd" / "config.toml"
    calls = []

    def run_command(self, args, **kwargs):
        calls.append(args)
        return 0, V2, ""

    # A double of the containerd binary: the real one is exercised by the integration tests.
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/containerd")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    result = run({"runtime": "containerd", "config_path": str(path)}, diff=True)
    assert calls == [["/usr/bin/containerd", "config", "default"]]
    assert result["changed"]
    assert result["diff"]["before"] == ""
    assert result["diff"]["before_header"] == f"{path} (absent)"
    text = path.read_text()
    assert "# comment kept" in text
    assert tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]["options"][
        "SystemdCgroup"
    ]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_missing_containerd_file_without_binary_gets_minimal_v2(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    result = run({"runtime": "containerd", "config_path": str(path)})
    assert result["config_version"] == 2
    data = tomllib.loads(path.read_text())
    assert data["version"] == 2
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": RUNTIME},
    }


def test_failing_containerd_config_default_warns_and_uses_minimal(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    warnings = []
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/containerd")
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda self, args, **k: (1, "", "boom"))
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg: warnings.append(msg))
    run({"runtime": "containerd", "config_path": str(path)})
    assert "boom" in warnings[0]
    assert tomllib.loads(path.read_text())["version"] == 2


def test_missing_file_check_mode_creates_nothing(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    result = run({"runtime": "containerd", "config_path": str(path)}, check=True)
    assert result["changed"]
    assert not path.exists()


@pytest.mark.parametrize("runtime", ["containerd", "docker", "crio"])
def test_absent_on_a_missing_file_creates_nothing(tmp_path, runtime):
    path = tmp_path / "missing.conf"
    result = run({"runtime": runtime, "config_path": str(path), "state": "absent"})
    assert result["changed"] is False
    assert not path.exists()


def test_empty_containerd_file_absent(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("")
    assert run({"runtime": "containerd", "config_path": str(path), "state": "absent"})["changed"] is False


def test_missing_toml_parser_gives_missing_required_lib(config, monkeypatch):
    monkeypatch.setattr(nvidia_runtime, "HAS_TOML_PARSER", False)
    result = fail({"runtime": "containerd", "config_path": str(config)})
    assert "Failed to import the required Python library (tomli" in result["msg"]
    assert config.read_text() == V2


def test_docker_does_not_need_a_toml_parser(tmp_path, monkeypatch):
    monkeypatch.setattr(nvidia_runtime, "HAS_TOML_PARSER", False)
    path = tmp_path / "daemon.json"
    result = run({"runtime": "docker", "config_path": str(path)})
    assert result["changed"]
    assert json.loads(path.read_text())["default-runtime"] == "nvidia"


@pytest.mark.parametrize("name", ["", 'nv"idia', "a\nb"])
def test_bad_runtime_name(config, name):
    assert (
        "runtime_name must be"
        in fail({"runtime": "containerd", "config_path": str(config), "runtime_name": name})["msg"]
    )


def test_config_path_that_is_a_directory(tmp_path):
    assert "is a directory" in fail({"runtime": "docker", "config_path": str(tmp_path)})["msg"]


def test_default_paths():
    assert nvidia_runtime.DEFAULT_PATHS == {
        "containerd": "/etc/containerd/config.toml",
        "docker": "/etc/docker/daemon.json",
        "crio": "/etc/crio/crio.conf.d/99-nvidia.toml",
    }


def test_docker_round_trip_with_state_document(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{\n  "default-runtime": "crun",\n  "log-level": "warn"\n}\n')
    state = tmp_path / "daemon.json.nvidia-runtime-state"
    first = run({"runtime": "docker", "config_path": str(path)})
    assert first["changed"]
    assert first["default_runtime"] == "nvidia"
    assert json.loads(state.read_text()) == {"added_runtimes": True, "previous_default_runtime": "crun"}
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
    assert path.read_text().startswith('{\n  "default-runtime": "nvidia",\n  "log-level": "warn",\n  "runtimes"')
    assert run({"runtime": "docker", "config_path": str(path)})["changed"] is False
    absent = run({"runtime": "docker", "config_path": str(path), "state": "absent"})
    assert absent["changed"]
    assert json.loads(path.read_text()) == {"default-runtime": "crun", "log-level": "warn"}
    assert not state.exists()


def test_docker_bad_state_document(tmp_path):
    path = tmp_path / "daemon.json"
    (tmp_path / "daemon.json.nvidia-runtime-state").write_text("{")
    assert "is not valid JSON; remove it or fix it" in fail({"runtime": "docker", "config_path": str(path)})["msg"]


def test_docker_non_object(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("[]\n")
    result = fail({"runtime": "docker", "config_path": str(path)})
    assert result["msg"] == f"{path} must hold a JSON object at the top level, but it holds a array."
    assert path.read_text() == "[]\n"


def test_crio_drop_in_directory_is_created(tmp_path):
    path = tmp_path / "crio.conf.d" / "99-nvidia.toml"
    result = run({"runtime": "crio", "config_path": str(path), "runtime_path": "/opt/nvidia/bin/runtime"})
    assert result["runtime_entry"] == {"runtime_path": "/opt/nvidia/bin/runtime", "runtime_type": "oci"}
    assert tomllib.loads(path.read_text())["crio"]["runtime"]["default_runtime"] == "nvidia"


def test_crio_refuses_to_add_the_runtime_beside_a_crio_conf_it_cannot_parse(tmp_path):
    # CRI-O would not start with it, and the runtimes it defines cannot be checked against ours: nothing is written
    # (as nvidia-ctk does). Removing our own entry still works.
    (tmp_path / "crio.conf").write_text("[crio.runtime\n")
    path = tmp_path / "crio.conf.d" / "99-nvidia.toml"
    result = fail({"runtime": "crio", "config_path": str(path)})
    assert result["msg"] == (
        f"{tmp_path / 'crio.conf'} could not be parsed as TOML: line 1, column 14: Expected ']' at the end of a table "
        f"declaration; CRI-O reads it with {path} and would not start, so nothing was written."
    )
    assert not path.parent.exists()
    path.parent.mkdir()
    path.write_text('[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n')
    assert run({"runtime": "crio", "config_path": str(path), "state": "absent"})["changed"] is True
    # Left with nothing in it, the drop-in goes.
    assert not path.exists()


def test_write_failure_is_reported(config, monkeypatch):
    def broken(self, src, dest, unsafe_writes=False, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(basic.AnsibleModule, "atomic_move", broken)
    result = fail({"runtime": "containerd", "config_path": str(config)})
    assert result["msg"].startswith(f"Cannot write {config}:")
    assert config.read_text() == V2
    assert os.listdir(config.parent) == ["config.toml"]


def test_unreadable_file_is_reported(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b"\xff\xfe")
    assert fail({"runtime": "containerd", "config_path": str(path)})["msg"].startswith(f"Cannot read {path}:")


def test_warns_when_an_import_overrides_the_cri_section(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg: warnings.append(msg))
    confd = tmp_path / "conf.d"
    confd.mkdir()
    (confd / "a.toml").write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "x"\n')
    (confd / "b.toml").write_text('version = 2\n[debug]\nlevel = "warn"\n')
    (confd / "c.toml").write_text("not toml [\n")
    path = tmp_path / "config.toml"
    path.write_text('version = 2\nimports = ["conf.d/*.toml", 3, "config.toml"]\n' + V2.split("\n", 1)[1])
    run({"runtime": "containerd", "config_path": str(path), "config_mode": "file"})
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{confd / 'a.toml'} also configures the plugin io.containerd.grpc.v1.cri")
    warnings.clear()
    path.write_text('version = 3\nimports = ["conf.d/*.toml"]\n')
    run({"runtime": "containerd", "config_path": str(path), "config_mode": "file"})
    assert warnings == []


def test_drop_in_mode_check_mode_and_diff_of_both_files(tmp_path, config):
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    args = {"runtime": "containerd", "config_path": str(config), "config_mode": "drop_in", "drop_in_path": str(drop_in)}
    checked = run(args, check=True, diff=True)
    assert checked["changed"] and config.read_text() == V2 and not drop_in.exists()
    # The drop-in comes first: it is written before the import that makes containerd read it.
    assert [d["after_header"] for d in checked["diff"]] == [str(drop_in), str(config)]
    assert checked["diff"][0]["before_header"] == f"{drop_in} (absent)"
    done = run(args)
    assert done["changed_files"] == [str(drop_in), str(config)]
    assert drop_in.read_text() == checked["diff"][0]["after"]
    assert config.read_text() == checked["diff"][1]["after"]
    assert tomllib.loads(config.read_text())["imports"] == [str(tmp_path / "conf.d" / "*.toml")]
    # auto sees the imported directory now, and the drop-in goes into it without being named.
    again = run({"runtime": "containerd", "config_path": str(config)})
    assert again["changed"] is False and again["config_mode"] == "drop_in" and again["config_path"] == str(drop_in)
    removed = run({"runtime": "containerd", "config_path": str(config), "state": "absent"})
    assert removed["changed_files"] == [str(drop_in)] and not drop_in.exists()


def test_drop_in_of_another_version_is_refused(tmp_path, config):
    drop_in = tmp_path / "99-nvidia.toml"
    drop_in.write_text("version = 3\n")
    args = {"runtime": "containerd", "config_path": str(config), "config_mode": "drop_in", "drop_in_path": str(drop_in)}
    result = fail(args)
    assert "must agree" in result["msg"] and drop_in.read_text() == "version = 3\n"


def test_template_mode_needs_a_generated_config(tmp_path):
    result = fail({"runtime": "containerd", "config_path": str(tmp_path / "config.toml"), "config_mode": "template"})
    assert "start k3s or RKE2 once" in result["msg"]


def test_config_mode_is_for_containerd_only(tmp_path):
    result = fail({"runtime": "docker", "config_path": str(tmp_path / "d.json"), "config_mode": "drop_in"})
    assert result["msg"] == "config_mode drop_in applies to containerd only."


def test_docker_operator_entry_is_adopted_and_cdi_switched_on(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(
        '{\n  "runtimes": {\n    "nvidia": {"path": "/usr/local/nvidia/toolkit/nvidia-container-runtime"}\n  }\n}\n'
    )
    result = run({"runtime": "docker", "config_path": str(path), "enable_cdi": True})
    data = json.loads(path.read_text())
    assert data["runtimes"]["nvidia"]["path"] == RUNTIME
    assert data["features"] == {"cdi": True}
    assert "cdi-spec-dirs" not in data  # Docker's own default directories; Docker 20.10 rejects the key
    assert result["adopted"] == [
        {"entry": "runtimes.nvidia", "from": "/usr/local/nvidia/toolkit/nvidia-container-runtime", "to": RUNTIME}
    ]
    assert run({"runtime": "docker", "config_path": str(path), "enable_cdi": True})["changed"] is False


def test_crio_operator_entry_and_cdi(tmp_path):
    path = tmp_path / "99-nvidia.toml"
    path.write_text(
        "[crio.runtime]\n\n[crio.runtime.runtimes.nvidia]\n"
        'runtime_path = "/usr/local/nvidia/toolkit/nvidia-container-runtime"\n'
        'runtime_type = "oci"\nmonitor_path = "/usr/libexec/crio/conmon"\n'
    )
    refused = fail({"runtime": "crio", "config_path": str(path), "adopt_existing": False})
    assert "set adopt_existing to true" in refused["msg"]
    run({"runtime": "crio", "config_path": str(path), "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi"]})
    data = tomllib.loads(path.read_text())["crio"]["runtime"]
    assert data["runtimes"]["nvidia"] == {
        "runtime_path": RUNTIME,
        "runtime_type": "oci",
        "monitor_path": "/usr/libexec/crio/conmon",
    }
    assert data["cdi_spec_dirs"] == ["/etc/cdi"]
    assert data["default_runtime"] == "nvidia"


@pytest.mark.parametrize(
    ("runtime", "directory"),
    [("crio", "crio.conf.d"), ("containerd", "conf.d"), ("containerd", "config-v3.toml.d")],
)
def test_a_backup_never_lands_in_a_directory_the_runtime_reads(tmp_path, runtime, directory):
    """CRI-O applies every file of crio.conf.d in lexical order, and containerd and k3s import every *.toml of
    their drop-in directories: a backup there (99-nvidia.toml.<pid>.<date>~ sorts after the drop-in) would
    be read as configuration. It goes to a directory beside the drop-ins instead."""
    path = tmp_path / directory / "99-nvidia.toml"
    if runtime == "crio":  # a drop-in of the site's too: absent keeps it, with that setting
        path.parent.mkdir()
        path.write_text('[crio.runtime]\nlog_level = "info"\n')
    run({"runtime": runtime, "config_path": str(path)})
    result = run({"runtime": runtime, "config_path": str(path), "state": "absent", "backup": True})
    assert result["changed"]
    backup = result["backup_file"]
    assert os.path.dirname(backup) == str(tmp_path / f"{directory}.gpuops-backup")
    assert os.path.basename(backup).startswith("99-nvidia.toml.")
    assert sorted(os.listdir(tmp_path / directory)) == ["99-nvidia.toml"]
    with open(backup, encoding="utf-8") as handle:
        assert "nvidia" in handle.read()


def test_the_directory_is_flushed_after_the_rename(config, monkeypatch):
    """A rename is durable only once its directory is on disk: write_atomic fsyncs the directory after it."""
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode) and os.path.samefile(f"/proc/self/fd/{fd}", config.parent))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run({"runtime": "containerd", "config_path": str(config)})
    assert synced[-1] is True


def test_crio_files_are_read_in_crios_order(tmp_path):
    """CRI-O walks crio.conf.d with Go's filepath.Walk: names in lexical order, a directory where its name sorts
    (so 10-a/ before 10-a.conf), files of any extension; crio.conf comes first."""
    etc = tmp_path / "crio"
    (etc / "crio.conf.d" / "10-a").mkdir(parents=True)
    for name in ("crio.conf", "crio.conf.d/10-a.conf", "crio.conf.d/10-a/x.toml", "crio.conf.d/zz.whatever"):
        (etc / name).write_text("")

    class Module:
        def warn(self, message):
            raise AssertionError(message)

    before, after = nvidia_runtime._crio_neighbours(Module(), str(etc / "crio.conf.d" / "99-nvidia.toml"))
    names = [os.path.relpath(path, etc) for path, _data in before + after]
    assert names == ["crio.conf", "crio.conf.d/10-a/x.toml", "crio.conf.d/10-a.conf", "crio.conf.d/zz.whatever"]
    assert [os.path.relpath(path, etc) for path, _data in after] == ["crio.conf.d/zz.whatever"]
