"""Docker and CRI-O outputs of the module, checked by parsing.

Neither dockerd nor CRI-O can run on these machines (no Docker Engine, CRI-O not packaged in
Debian 12), so the results are judged by Python's json and tomllib parsers, not by the daemons.
How CRI-O merges crio.conf and its drop-in directory is judged by tests/integration/crio_merge, a test
double of CRI-O's config loading built on the TOML library CRI-O itself uses.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import tomllib
from conftest import CONFIGS, go_tool

RUNTIME = "/usr/bin/nvidia-container-runtime"


def test_docker_daemon_json(tmp_path, run_module):
    for name in ("daemon-kubeadm.json", "daemon-tabs.json"):
        path = tmp_path / name
        shutil.copy(CONFIGS / name, path)
        original_text = path.read_text()
        original = json.loads(original_text)
        result = run_module(runtime="docker", config_path=str(path), diff=True)
        assert result["changed"] is True
        assert result["runtime_entry"] == {"path": RUNTIME, "args": []}
        text = path.read_text()
        data = json.loads(text)
        assert text.endswith("}\n")
        assert list(data)[: len(original)] == list(original)
        assert {k: v for k, v in data.items() if k not in ("runtimes", "default-runtime")} == {
            k: v for k, v in original.items() if k not in ("runtimes", "default-runtime")
        }
        assert data["default-runtime"] == "nvidia"
        indent = "\t" if "\t" in original_text else "  "
        assert "\n" + indent + '"' in text
        assert run_module(runtime="docker", config_path=str(path))["changed"] is False
        run_module(runtime="docker", config_path=str(path), state="absent")
        assert json.loads(path.read_text()) == original
        assert not (tmp_path / (name + ".nvidia-runtime-state")).exists()


def test_crio_drop_in(tmp_path, run_module):
    path = tmp_path / "crio.conf.d" / "99-nvidia.toml"
    result = run_module(runtime="crio", config_path=str(path))
    assert tomllib.loads(path.read_text()) == {
        "crio": {
            "runtime": {
                "default_runtime": "nvidia",
                "runtimes": {"nvidia": {"runtime_path": RUNTIME, "runtime_type": "oci"}},
            }
        }
    }
    assert result["changed"] is True
    site = tmp_path / "crio-site.toml"
    shutil.copy(CONFIGS / "crio-site.toml", site)
    original = tomllib.loads(site.read_text())
    run_module(runtime="crio", config_path=str(site))
    data = tomllib.loads(site.read_text())
    assert data["crio"]["runtime"]["runtimes"]["crun"] == original["crio"]["runtime"]["runtimes"]["crun"]
    assert data["crio"]["runtime"]["default_runtime"] == "nvidia"
    assert "# Site drop-in for CRI-O" in site.read_text()
    assert run_module(runtime="crio", config_path=str(site))["changed"] is False
    run_module(runtime="crio", config_path=str(site), state="absent")
    assert tomllib.loads(site.read_text()) == original


def test_crio_absent_removes_the_drop_in_present_created_and_keeps_one_with_other_settings(tmp_path, run_module):
    """The drop-in the module created goes with absent (the node as it was); a drop-in with other settings keeps
    them; a main file (not in a drop-in directory) left empty stays."""
    ours = tmp_path / "crio.conf.d" / "99-nvidia.toml"
    run_module(runtime="crio", config_path=str(ours))
    assert run_module(runtime="crio", config_path=str(ours), state="absent")["changed"] is True
    assert not ours.exists()
    assert run_module(runtime="crio", config_path=str(ours), state="absent")["changed"] is False
    shared = tmp_path / "crio.conf.d" / "10-site.toml"
    shared.write_text('[crio.runtime]\nlog_level = "info"\n')
    run_module(runtime="crio", config_path=str(shared))
    run_module(runtime="crio", config_path=str(shared), state="absent")
    assert tomllib.loads(shared.read_text()) == {"crio": {"runtime": {"log_level": "info"}}}
    main = tmp_path / "crio.conf"
    run_module(runtime="crio", config_path=str(main))
    run_module(runtime="crio", config_path=str(main), state="absent")
    assert main.exists()


# ------------------------------------------------ CRI-O: crio.conf and every file of crio.conf.d, merged

NVIDIA_CTK_DROP_IN = """\
# written by nvidia-ctk runtime configure --runtime=crio
[crio]

  [crio.runtime]
    default_runtime = "nvidia"

    [crio.runtime.runtimes]

      [crio.runtime.runtimes.nvidia]
        runtime_path = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
        runtime_type = "oci"
        monitor_path = "/usr/libexec/crio/conmon"
        monitor_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
"""


@pytest.fixture(scope="session")
def crio_merge():
    """tests/integration/crio_merge built with Go, cached by its source."""
    return go_tool("crio_merge", ("main.go", "go.mod", "go.sum"))


def crio_effective(crio_merge, etc):
    proc = subprocess.run(
        [crio_merge, str(etc / "crio.conf"), str(etc / "crio.conf.d")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"CRI-O would not start: {proc.stderr}"
    return json.loads(proc.stdout)["runtime"]


def test_the_crio_double_merges_like_crio(tmp_path, crio_merge):
    """The double's rules, pinned: later files replace a runtime's whole entry, any file name counts."""
    etc = tmp_path / "crio"
    (etc / "crio.conf.d").mkdir(parents=True)
    (etc / "crio.conf").write_text('[crio.runtime.runtimes.a]\nruntime_path = "/a"\nmonitor_path = "/m"\n')
    (etc / "crio.conf.d" / "10-b.conf").write_text('[crio.runtime.runtimes.a]\nruntime_path = "/b"\n')
    (etc / "crio.conf.d" / "20-c.whatever").write_text('[crio.runtime]\ndefault_runtime = "a"\n')
    merged = crio_effective(crio_merge, etc)
    assert merged["runtimes"] == {"a": {"runtime_path": "/b"}} and merged["default_runtime"] == "a"
    (etc / "crio.conf.d" / "30-d.toml").write_text('[crio.runtime]\ndefault_runtime = "x"\n')
    proc = subprocess.run(
        [crio_merge, str(etc / "crio.conf"), str(etc / "crio.conf.d")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1 and "no runtime entry table" in proc.stderr


def crio_node(tmp_path, files):
    etc = tmp_path / "crio"
    (etc / "crio.conf.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    return etc, etc / "crio.conf.d" / "99-nvidia.toml"


def test_crio_adopts_the_runtime_nvidia_ctk_left_in_99_nvidia_conf(tmp_path, run_module, crio_merge):
    etc, ours = crio_node(tmp_path, {"crio.conf.d/99-nvidia.conf": NVIDIA_CTK_DROP_IN})
    refused = run_module(runtime="crio", config_path=str(ours), adopt_existing=False, expect_failure=True)
    assert "99-nvidia.conf" in refused["msg"] and "adopt_existing" in refused["msg"]
    result = run_module(runtime="crio", config_path=str(ours))
    assert [(a["from"], a["to"]) for a in result["adopted"]] == [
        ("/usr/local/nvidia/toolkit/nvidia-container-runtime", RUNTIME)
    ]
    assert "99-nvidia.conf" in result["adopted"][0]["entry"]
    merged = crio_effective(crio_merge, etc)
    assert merged["default_runtime"] == "nvidia"
    nvidia = merged["runtimes"]["nvidia"]
    assert nvidia["runtime_path"] == RUNTIME
    assert nvidia["monitor_path"] == "/usr/libexec/crio/conmon"  # what nvidia-ctk set stays in force
    assert nvidia["monitor_env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert (etc / "crio.conf.d" / "99-nvidia.conf").read_text() == NVIDIA_CTK_DROP_IN
    assert run_module(runtime="crio", config_path=str(ours))["changed"] is False


def test_crio_refuses_another_runtime_of_that_name_in_crio_conf(tmp_path, run_module):
    etc, ours = crio_node(tmp_path, {"crio.conf": '[crio.runtime.runtimes.nvidia]\nruntime_path = "/opt/x/runc"\n'})
    refused = run_module(runtime="crio", config_path=str(ours), expect_failure=True)
    assert str(etc / "crio.conf") in refused["msg"] and "choose another runtime_name" in refused["msg"]
    assert not ours.exists()


def test_crio_absent_reports_a_runtime_left_in_another_file(tmp_path, run_module, crio_merge):
    etc, ours = crio_node(tmp_path, {"crio.conf.d/99-nvidia.conf": NVIDIA_CTK_DROP_IN})
    run_module(runtime="crio", config_path=str(ours))
    removed = run_module(runtime="crio", config_path=str(ours), state="absent")
    assert removed["changed"]
    assert "99-nvidia.conf still defines the runtime nvidia" in str(removed.get("warnings")), removed
    crio_effective(crio_merge, etc)  # CRI-O still starts


def test_crio_warns_about_a_later_file_that_overrides_the_default(tmp_path, run_module, crio_merge):
    etc, ours = crio_node(
        tmp_path,
        {
            "crio.conf": '[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n',
            "crio.conf.d/zz-site.conf": '[crio.runtime]\ndefault_runtime = "crun"\n',
        },
    )
    result = run_module(runtime="crio", config_path=str(ours))
    assert "zz-site.conf is read after" in str(result.get("warnings")), result
    assert result["default_runtime"] == "crun"
    assert crio_effective(crio_merge, etc)["default_runtime"] == "crun"
