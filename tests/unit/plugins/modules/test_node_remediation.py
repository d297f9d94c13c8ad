"""The module gpuops.k8s.node_remediation around its decisions (tested in module_utils/test__node_remediation.py):
its result and diff on a Node store test double, option checks and the last resort, each one sentence."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import unexpected_error_message
from ansible_collections.gpuops.k8s.plugins.modules import node_remediation
from ansible_collections.gpuops.k8s.tests.unit.plugins.module_utils.test__node_remediation import FakeApi, node
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import fail_module, run_module

NODE_ARGS = {"name": "gpu-a", "host": "http://127.0.0.1:9"}


@pytest.fixture
def store(patched, monkeypatch):
    """The module on a Node store test double instead of an API server (the client library is not needed)."""
    api = FakeApi(node())
    monkeypatch.setattr(node_remediation, "KUBERNETES_IMPORT_ERROR", None)
    monkeypatch.setattr(node_remediation, "api_client", lambda params: None)
    monkeypatch.setattr(node_remediation, "RemediationApi", lambda client, *lease: api)
    return api


def test_present_then_absent_with_their_diffs(store):
    args = dict(NODE_ARGS, remediation_class="reboot", gpus=["GPU-1"], reason="XID 79", now="2026-11-26T12:00:00Z")
    result = run_module(node_remediation.main, dict(args, _ansible_diff=True))
    assert result["changed"] is True and result["conflicts"] == 0
    assert result["before"] == {"unschedulable": False, "taint": None, "annotation": None}
    assert result["after"]["taint"] == {"key": "nvidia.com/gpu-remediation", "value": "reboot", "effect": "NoSchedule"}
    assert result["diff"] == {"before": result["before"], "after": result["after"]}
    again = run_module(node_remediation.main, args)
    assert again["changed"] is False and again["patch"] == {} and "diff" not in again
    back = run_module(node_remediation.main, dict(NODE_ARGS, state="absent"))
    assert back["changed"] is True and back["after"] == {"unschedulable": False, "taint": None, "annotation": None}


def test_check_mode_changes_nothing_and_says_what_it_would(store):
    result = run_module(node_remediation.main, dict(NODE_ARGS, remediation_class="reset", _ansible_check_mode=True))
    assert result["changed"] is True and result["after"]["unschedulable"] is True
    assert store.patches == []


def test_an_unexpected_exception_fails_the_module_with_one_sentence(patched, monkeypatch):
    monkeypatch.setattr(node_remediation, "KUBERNETES_IMPORT_ERROR", None)

    def boom(*args, **kwargs):
        raise KeyError("spec")

    monkeypatch.setattr(node_remediation, "api_client", boom)
    result = fail_module(node_remediation.main, dict(NODE_ARGS, remediation_class="reset"))
    assert result["msg"] == unexpected_error_message("node_remediation", KeyError("spec"))


def test_negative_retries_are_one_sentence(store):
    result = fail_module(node_remediation.main, dict(NODE_ARGS, remediation_class="reset", conflict_retries=-1))
    assert result["msg"] == "node_remediation: conflict_retries must be 0 or more, got -1."
