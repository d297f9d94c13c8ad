"""The filter plugins load without the kubernetes client.

Ansible loads a filter plugin in the worker process it forks for each task that uses the filter, so whatever the
plugin imports is imported again for every such task. The client's import costs most of a CPU-second; the filters
need only the plain-data helpers of module_utils, and the Node calls beside those import the client when a module
first uses them (module_utils/_k8s_nodes.py, dynamic_client).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

FILTERS = sorted(
    path.stem
    for path in (pathlib.Path(__file__).resolve().parents[4] / "plugins" / "filter").glob("*.py")
    if path.stem != "__init__"
)

PROBE = """
import importlib, importlib.util, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps({
    "client_installed": importlib.util.find_spec("kubernetes") is not None,
    "imported": sorted(m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")),
}))
"""


def _load_in_a_fresh_interpreter(module):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_filter_plugin_is_probed():
    assert "gpu_labels" in FILTERS and "remediation_plan" in FILTERS and len(FILTERS) >= 10, FILTERS


@pytest.mark.parametrize("name", FILTERS)
def test_the_filter_plugin_loads_without_the_kubernetes_client(name):
    seen = _load_in_a_fresh_interpreter(f"ansible_collections.gpuops.k8s.plugins.filter.{name}")
    # The client is installed here (tests/unit/requirements.txt), so an import of it would show.
    assert seen["client_installed"]
    assert seen["imported"] == []
