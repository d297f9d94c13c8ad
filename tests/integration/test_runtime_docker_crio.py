"""Docker and CRI-O outputs of the module, checked by parsing.

Neither dockerd nor CRI-O can run on these machines (no Docker Engine, CRI-O not packaged in
Debian 12), so the results are judged by Python's json and tomllib parsers, not by the daemons.
"""

from __future__ import annotations

import json
import shutil
import tomllib

from conftest import CONFIGS

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
        "crio": {"runtime": {"default_runtime": "nvidia", "runtimes": {"nvidia": {"runtime_path": RUNTIME, "runtime_type": "oci"}}}}
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
