"""One simulated-GPU format, two readers: the daemon's `simspec` and the discovery module's
`_simulated_spec` (plugins/module_utils) must agree on every sample spec and refuse every invalid one.
The daemon cannot import the collection's module_utils at run time (it is installed on its own), so
this test is what keeps the two readers of docs/simulated-gpus.md from drifting apart."""

from __future__ import annotations

import glob
import importlib.util
import os

import pytest
from gpu_device_plugin import simspec

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
VALID = sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "simulated", "*.yaml")))
INVALID = sorted(glob.glob(os.path.join(REPO, "tests", "unit", "fixtures", "simulated-invalid", "*.yaml")))


def _module_reader():
    path = os.path.join(REPO, "plugins", "module_utils", "_simulated_spec.py")
    spec = importlib.util.spec_from_file_location("gpuops_module_simulated_spec", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_fixtures_to_compare():
    assert len(VALID) >= 3
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_both_readers_see_the_same_gpus(path):
    ours = simspec.load(path)
    theirs = _module_reader().load_spec(path)
    assert ours.driver_version == theirs["driver_version"]
    assert ours.cuda_driver_version == theirs["cuda_driver_version"]
    assert len(ours.gpus) == len(theirs["gpus"])
    for gpu, other in zip(ours.gpus, theirs["gpus"]):
        assert gpu.index == other["index"]
        assert gpu.uuid == other["uuid"]
        assert gpu.name == other["name"]
        assert gpu.pci_bus_id == other["pci_bus_id"]
        assert gpu.memory_mib == other["memory_total_mib"]
        assert gpu.compute_capability == other["compute_capability"]
        assert gpu.numa_node == other["numa_node"]
        assert gpu.pcie_switch == other["pcie_switch"]
        assert gpu.minor_number == other["minor_number"]
        assert gpu.mig_mode == other["mig_mode"]
        assert sorted(gpu.nvlink_peers) == sorted(other["nvlink_peers"])
        assert [(m.uuid, m.profile, m.memory_mib) for m in gpu.mig_devices] == [
            (m["uuid"], m["profile"], m["memory_mib"]) for m in other["mig_devices"]
        ]


@pytest.mark.parametrize("path", INVALID, ids=os.path.basename)
def test_both_readers_refuse_each_invalid_spec_in_one_sentence_naming_the_file(path):
    module_reader = _module_reader()
    with pytest.raises(simspec.SpecError) as ours:
        simspec.load(path)
    with pytest.raises(module_reader.SpecError) as theirs:
        module_reader.load_spec(path)
    for message in (str(ours.value), str(theirs.value)):
        assert "\n" not in message
        assert os.path.basename(path) in message
    # Where the fixture says which GPU is at fault, both readers name it.
    with open(path) as handle:
        expected = [line.split(":", 1)[1] for line in handle if line.startswith("# expect:")]
    for fragment in (part.strip() for line in expected for part in line.split("|")):
        if fragment.startswith("GPU ") and fragment[4:].isdigit():
            assert fragment in str(ours.value)
            assert fragment in str(theirs.value)
