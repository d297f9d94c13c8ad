"""One source for each fact the collection and the daemon share (docs/architecture.md).

The simulated-GPU spec format and the NVML-to-facts mapping live in the collection's
plugins/module_utils (_simulated_spec.py, _gpu_discovery.py); the daemon carries them as
gpu_device_plugin/_shared. These tests load the collection's files from the repository, run the same
spec through both sides (the module's reader and the daemon's backends, simulated and through the
pynvml double), and compare the facts field by field. Under `make daemon-py39` the daemon side is the
package as pip installed it, so they also show that packaging carried the collection's files unchanged.
"""

from __future__ import annotations

import filecmp
import glob
import importlib.util
import os
from types import ModuleType
from typing import Any

import pytest
from conftest import SRC
from gpu_device_plugin import simspec
from gpu_device_plugin.discovery import NvmlBackend, SimulatedBackend
from gpu_device_plugin.inventory import Gpu, Inventory
from pynvml_double import PynvmlDouble

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")
VALID = sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "simulated", "*.yaml")))
INVALID = sorted(glob.glob(os.path.join(REPO, "tests", "unit", "fixtures", "simulated-invalid", "*.yaml")))
SHARED = {
    "simulated_spec.py": "_simulated_spec.py",
    "gpu_discovery.py": "_gpu_discovery.py",
    "xid_classes.py": "_xid_classes.py",
}


def _collection_module(name: str) -> ModuleType:
    """A module_utils file of the collection, loaded from the repository under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"collection{name}", os.path.join(MODULE_UTILS, name + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC = _collection_module("_simulated_spec")
FACTS = _collection_module("_gpu_discovery")


def _compare(gpu: Gpu, fact: dict[str, Any]) -> None:
    """Every fact of one GPU against the daemon's view of it, field by field."""
    assert set(fact) == set(FACTS.GPU_FACT_KEYS)
    pairs = {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "memory_total_mib": gpu.memory_mib,
        "compute_capability": gpu.compute_capability,
        "architecture": gpu.architecture,
        "numa_node": gpu.numa_node,
        "pcie_switch": gpu.pcie_switch,
        "nvlink_peers": sorted(gpu.nvlink_peers),
        "minor_number": gpu.minor_number,
        "xid": gpu.xid,
        "lost": gpu.lost,
        "mig_mode": gpu.mig_mode,
        "mig_devices": [
            {"index": m.index, "uuid": m.uuid, "profile": m.profile, "memory_mib": m.memory_mib}
            for m in gpu.mig_devices
        ],
    }
    # The daemon keeps what it allocates by; the attributes NVML gives a MIG device (SMs, slices, engines) are
    # the labels' and stay in the facts.
    fact = dict(
        fact, mig_devices=[{k: m[k] for k in ("index", "uuid", "profile", "memory_mib")} for m in fact["mig_devices"]]
    )
    for key, daemon_value in pairs.items():
        module_value = sorted(fact[key]) if key == "nvlink_peers" else fact[key]
        assert daemon_value == module_value, (
            f"{gpu.uuid}: {key} is {daemon_value!r} in the daemon, {module_value!r} in the module"
        )


def _compare_all(inventory: Inventory, facts: dict[str, Any]) -> None:
    assert (inventory.driver_version, inventory.cuda_driver_version) == (
        facts["driver_version"],
        facts["cuda_driver_version"],
    )
    assert len(inventory.gpus) == len(facts["gpus"])
    for gpu, fact in zip(inventory.gpus, facts["gpus"]):
        _compare(gpu, fact)


def test_there_are_fixtures_to_compare() -> None:
    assert len(VALID) >= 3
    assert len(INVALID) >= 10


@pytest.mark.parametrize("name", sorted(SHARED))
def test_the_daemon_carries_the_collection_files_unchanged(name: str) -> None:
    # In the repository a link, in an installed package a copy: either way the same bytes.
    carried = os.path.join(SRC, "gpu_device_plugin", "_shared", name)
    assert filecmp.cmp(carried, os.path.join(MODULE_UTILS, SHARED[name]), shallow=False)


@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_a_simulated_spec_gives_the_same_facts_on_both_sides(path: str) -> None:
    module_facts = FACTS.facts_from_spec(SPEC.load_spec(path))
    backend = SimulatedBackend(path)
    backend.init()
    _compare_all(backend.snapshot(), module_facts)
    # The facts are the whole spec: every GPU-level key of the format reaches them.
    assert {gpu["architecture"] for gpu in module_facts["gpus"]} <= {"turing", "ampere", "hopper"}


@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_nvml_answers_give_the_same_facts_on_both_sides(path: str, tmp_path: Any) -> None:
    # The same NVML (the pynvml double answering from the spec) read by the module's discovery and by
    # the daemon's nvml backend.
    sysfs = str(tmp_path)
    module_facts = FACTS.nvml_discover(PynvmlDouble.from_spec(path), sysfs)
    backend = NvmlBackend(PynvmlDouble.from_spec(path), sysfs=sysfs)
    backend.init()
    try:
        _compare_all(backend.snapshot(), module_facts)
    finally:
        backend.stop()
    # And NVML's facts are the spec's where NVML can tell them (not the standing health conditions a
    # spec can set, which NVML reports as events; nor persistence, which the double does not answer).
    simulated = FACTS.facts_from_spec(SPEC.load_spec(path))
    for through_nvml, from_spec in zip(module_facts["gpus"], simulated["gpus"]):
        for key in FACTS.GPU_FACT_KEYS:
            if key not in ("xid", "lost", "persistence_mode"):
                assert through_nvml[key] == from_spec[key], f"{from_spec['uuid']}: {key}"


@pytest.mark.parametrize("path", INVALID, ids=os.path.basename)
def test_both_sides_refuse_each_invalid_spec_with_the_same_sentence(path: str) -> None:
    with pytest.raises(simspec.SpecError) as daemon_error:
        simspec.load(path)
    with pytest.raises(SPEC.SpecError) as module_error:
        SPEC.load_spec(path)
    assert str(daemon_error.value) == str(module_error.value)
    message = str(daemon_error.value)
    assert "\n" not in message and message.endswith(".")
    assert path in message
    # Where the fixture says what the sentence names, it does.
    with open(path) as handle:
        expected = [line.split(":", 1)[1] for line in handle if line.startswith("# expect:")]
    for fragment in (part.strip() for line in expected for part in line.split("|")):
        assert fragment in message
