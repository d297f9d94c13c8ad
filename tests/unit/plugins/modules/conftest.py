# The fixtures the module tests here share (module_harness.py).
import pytest
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.module_harness import patch_exits


@pytest.fixture
def patched(monkeypatch):
    patch_exits(monkeypatch)
