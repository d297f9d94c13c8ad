"""The module gpuops.k8s.pod_eviction around its decisions (tested in module_utils/test__pod_eviction.py): option
checks and the last resort, each one sentence."""

from __future__ import annotations

import types

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import unexpected_error_message
from ansible_collections.gpuops.k8s.plugins.modules import pod_eviction
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import fail_module


def test_an_unexpected_exception_fails_the_module_with_one_sentence(patched, monkeypatch):
    # The kubernetes client is not installed where the unit tests run; the module gets past its check here.
    monkeypatch.setattr(pod_eviction, "KUBERNETES_IMPORT_ERROR", None)
    # ... and the exception types its handlers name, which come from that client.
    monkeypatch.setattr(
        pod_eviction,
        "k8s_config",
        types.SimpleNamespace(ConfigException=type("ConfigException", (Exception,), {})),
        raising=False,
    )
    monkeypatch.setattr(
        pod_eviction,
        "urllib3_exceptions",
        types.SimpleNamespace(HTTPError=type("HTTPError", (Exception,), {})),
        raising=False,
    )

    def boom(*args, **kwargs):
        raise KeyError("uid")

    monkeypatch.setattr(pod_eviction, "api_client", boom)
    result = fail_module(pod_eviction.main, {"pods": [{"namespace": "ml", "name": "a"}], "host": "http://127.0.0.1:9"})
    assert result["msg"] == unexpected_error_message("pod_eviction", KeyError("uid"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"timeout": -1}, "pod_eviction: timeout must be 0 or more seconds, got -1."),
        ({"grace_period": -5}, "pod_eviction: grace_period must be 0 or more seconds, got -5."),
    ],
)
def test_negative_seconds_are_one_sentence(patched, monkeypatch, args, message):
    monkeypatch.setattr(pod_eviction, "KUBERNETES_IMPORT_ERROR", None)
    result = fail_module(
        pod_eviction.main, dict(args, pods=[{"namespace": "ml", "name": "a"}], host="http://127.0.0.1:9")
    )
    assert result["msg"] == message
