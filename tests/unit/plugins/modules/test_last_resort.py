"""Every module's last resort: an exception the module did not expect reaches Ansible as fail_json with one
sentence naming the module and the exception, the traceback kept in the result's ``exception`` field."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import unexpected_error_message
from ansible_collections.gpuops.k8s.plugins.modules import node_labels, node_state, nvidia_gpu_info, nvidia_runtime
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import fail_module, run_module


def boom(*args, **kwargs):
    raise KeyError("pci_bus_id")


# module, the function inside it made to raise, arguments that reach that function
CASES = [
    (node_state, "describe", {"paths": ["/"]}),
    (nvidia_gpu_info, "discover", {}),
    (nvidia_runtime, "_containerd", {"runtime": "containerd", "config_path": "/nonexistent/config.toml"}),
]


@pytest.mark.parametrize(
    ("module", "function", "args"), CASES, ids=[case[0].__name__.rsplit(".", 1)[-1] for case in CASES]
)
def test_an_unexpected_exception_fails_the_module_with_one_sentence(patched, monkeypatch, module, function, args):
    monkeypatch.setattr(module, function, boom)
    result = fail_module(module.main, args)
    name = module.__name__.rsplit(".", 1)[-1]
    assert result["msg"] == (
        f"{name} failed on an unexpected KeyError ('pci_bus_id'); this is a bug in the module, and -vvv shows where."
    )
    assert "Traceback (most recent call last)" in result["exception"]
    assert "\n" not in result["msg"]


def test_node_labels_too(patched, monkeypatch):
    # The kubernetes client is not installed where the unit tests run; the module gets past its check here.
    monkeypatch.setattr(node_labels, "KUBERNETES_IMPORT_ERROR", None)
    monkeypatch.setattr(node_labels, "_label", boom)
    result = fail_module(node_labels.main, {"nodes": [{"name": "gpu-node-1"}], "host": "http://127.0.0.1:9"})
    assert result["msg"] == unexpected_error_message("node_labels", KeyError("pci_bus_id"))
    assert result["msg"].startswith("node_labels failed on an unexpected KeyError ('pci_bus_id'); this is a bug")


def test_exit_and_fail_pass_through_the_last_resort(patched, tmp_path):
    # exit_json (a SystemExit) is not taken for an unexpected error.
    result = run_module(node_state.main, {"paths": [str(tmp_path)]})
    assert result["paths"][str(tmp_path)]["type"] == "directory"


def test_the_message_names_an_exception_without_text():
    assert unexpected_error_message("node_state", ValueError()) == (
        "node_state failed on an unexpected ValueError (no detail); this is a bug in the module, and -vvv shows where."
    )
