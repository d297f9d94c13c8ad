"""The DRA API side's pure parts: devices as ResourceSlice entries, quantities and versions, the v1beta1
shape, and the publisher's generation and write logic against an in-memory API double.

The same behaviour against a real kube-apiserver is tests/integration/test_dra_api.py."""

from __future__ import annotations

import copy
import dataclasses
import os
import re

import pytest
from gpu_device_plugin import simspec
from gpu_device_plugin.dra import slices
from gpu_device_plugin.dra.devices import dra_devices
from gpu_device_plugin.dra.kubeapi import KubeApi, KubeApiError, claim_to_v1, slice_from_v1, slice_to_v1
from gpu_device_plugin.dra.slices import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    ResourceSlices,
    chunks,
    device_attributes,
    device_capacity,
    mib_quantity,
    pci_bus_id,
    quantity,
    semver,
    wanted_devices,
)
from harness import FIXTURES

DRIVER = "gpu.gpuops.k8s"
LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
QUALIFIED = re.compile(rf"^(?:{LABEL}(?:\.{LABEL})*/)?[A-Za-z_][A-Za-z0-9_]*$")


def _inventory(name):
    return simspec.load(os.path.join(FIXTURES, name))


@pytest.mark.parametrize(
    ("mib", "text"),
    [(81559, "81559Mi"), (81920, "80Gi"), (40960, "40Gi"), (4864, "4864Mi"), (1024 * 1024, "1Ti"), (0, "0")],
)
def test_memory_is_written_as_the_server_writes_the_quantity(mib, text):
    assert mib_quantity(mib) == text


@pytest.mark.parametrize(
    ("text", "version"),
    [("9.0", "9.0.0"), ("580.95.05", "580.95.5"), ("13.0", "13.0.0"), ("535.247.01", "535.247.1"), ("12", "12.0.0")],
)
def test_versions_become_semantic_versions(text, version):
    assert semver(text) == version


@pytest.mark.parametrize("text", ["", "abc", "1.2.3.4", "550.54.x", "1..2"])
def test_a_version_that_is_not_numeric_has_none(text):
    assert semver(text) is None


def test_pci_bus_ids_take_the_extended_bdf_form():
    assert pci_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert pci_bus_id("0000:2A:00.0") == "0000:2a:00.0"


def test_an_h100_carries_nvidia_s_attributes_with_nvidia_s_types():
    inventory = _inventory("h100x8.yaml")
    device = dra_devices(inventory)[4]
    assert device_attributes(device, inventory, healthy=True) == {
        "type": {"string": "gpu"},
        "uuid": {"string": "GPU-6f1c0a3e-0000-4000-8000-000000000005"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "health": {"string": "Healthy"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "resource.kubernetes.io/pciBusID": {"string": device.gpu.pci_bus_id},
    }
    assert device_capacity(device) == {"memory": {"value": "81559Mi"}}


def test_a_t4_is_a_tesla_of_the_turing_architecture():
    inventory = _inventory("t4x1.yaml")
    (device,) = dra_devices(inventory)
    attributes = device_attributes(device, inventory, healthy=True)
    assert (attributes["brand"], attributes["architecture"]) == ({"string": "Tesla"}, {"string": "Turing"})
    assert attributes["cudaComputeCapability"] == {"version": "7.5.0"}


def test_mig_devices_are_named_and_described_as_nvidia_s_driver_does():
    inventory = _inventory("a100-mig.yaml")
    devices = {d.name: d for d in dra_devices(inventory)}
    # gpu-<minor>-mig-<profile without dots>-<GPU-instance profile ID>-<first memory slice>: the 3g.20gb takes
    # slices 0-3, the two 1g.5gb the first free ones after it.
    assert sorted(devices) == ["gpu-0-mig-1g5gb-19-4", "gpu-0-mig-1g5gb-19-5", "gpu-0-mig-3g20gb-9-0", "gpu-1"]
    mig = device_attributes(devices["gpu-0-mig-1g5gb-19-4"], inventory, healthy=True)
    parent = devices["gpu-1"].gpu
    assert mig == {
        "type": {"string": "mig"},
        "uuid": {"string": "MIG-0a5e1c00-0000-4000-8000-0000000000a2"},
        "parentUUID": {"string": "GPU-0a5e1c00-0000-4000-8000-00000000a100"},
        "profile": {"string": "1g.5gb"},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"},
        "health": {"string": "Healthy"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "535.247.1"},
        "cudaDriverVersion": {"version": "12.2.0"},
        # The parent's: NVIDIA's driver gives a MIG device its GPU's PCI and NUMA attributes.
        "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 0},
    }
    assert parent.numa_node is None
    whole = device_attributes(devices["gpu-1"], inventory, healthy=True)
    assert "profile" not in whole and "parentUUID" not in whole
    assert "resource.kubernetes.io/numaNode" not in whole, "gpu-1's NUMA node is unknown: no attribute"
    entries = {e["name"]: e for e in wanted_devices(list(devices.values()), frozenset(), inventory, DRIVER, True)}
    assert entries["gpu-0-mig-3g20gb-9-0"]["capacity"] == {
        "memory": {"value": "19968Mi"},
        "multiprocessors": {"value": "42"},
        "copyEngines": {"value": "3"},
        "decoders": {"value": "2"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "0"},
        "ofaEngines": {"value": "0"},
        **{f"memorySlice{i}": {"value": "1"} for i in range(4)},
    }
    assert entries["gpu-0-mig-1g5gb-19-5"]["capacity"]["memorySlice5"] == {"value": "1"}
    assert entries["gpu-1"]["capacity"] == {"memory": {"value": "40Gi"}}


def test_a_mig_device_without_its_placement_keeps_the_name_of_earlier_versions():
    inventory = _inventory("a100-mig.yaml")
    gpu = inventory.gpus[0]
    unplaced = tuple(dataclasses.replace(m, profile_id=None, placement_start=None) for m in gpu.mig_devices)
    inventory = dataclasses.replace(
        inventory, gpus=(dataclasses.replace(gpu, mig_devices=unplaced), *inventory.gpus[1:])
    )
    assert [d.name for d in dra_devices(inventory)] == ["gpu-0-mig-0", "gpu-0-mig-1", "gpu-0-mig-2", "gpu-1"]
    assert all(d.legacy_name is None for d in dra_devices(inventory))


@pytest.mark.parametrize(("value", "text"), [(14, "14"), (0, "0"), (1024, "1Ki"), (1536, "1536"), (2 << 20, "2Mi")])
def test_counts_are_written_as_the_server_writes_binary_quantities(value, text):
    assert quantity(value) == text


@pytest.mark.parametrize("spec", ["h100x8.yaml", "a100-mig.yaml", "t4x1.yaml"])
def test_every_device_stays_within_the_api_limits(spec):
    inventory = _inventory(spec)
    for entry in wanted_devices(dra_devices(inventory), frozenset(), inventory, DRIVER, True):
        _within_the_api_limits(entry)


def _within_the_api_limits(entry):
    names = list(entry["attributes"]) + list(entry["capacity"])
    assert len(names) <= MAX_ATTRIBUTES_AND_CAPACITIES == 32
    for name in names:
        assert QUALIFIED.match(name) and len(name.rsplit("/", 1)[-1]) <= 32, name
    for value in entry["attributes"].values():
        assert len(value) == 1 and next(iter(value)) in ("int", "bool", "string", "version")
        if "string" in value or "version" in value:
            assert len(next(iter(value.values()))) <= 64


def test_the_largest_device_there_can_be_stays_within_32_attributes_and_capacities():
    """A MIG device of all 8 memory slices on a GPU whose every optional fact is known: the most this driver
    ever publishes for one device (NVIDIA's driver publishes as many; the limit is Kubernetes')."""
    inventory = _inventory("a100-mig.yaml")
    gpu = dataclasses.replace(inventory.gpus[0], pcie_root="pci0000:00", numa_node=1)
    seven = dataclasses.replace(
        gpu.mig_devices[0], profile="7g.40gb", profile_id=0, placement_start=0, placement_size=8, multiprocessors=98
    )
    inventory = dataclasses.replace(inventory, gpus=(dataclasses.replace(gpu, mig_devices=(seven,)),))
    (device,) = dra_devices(inventory)
    (entry,) = wanted_devices([device], frozenset({device.name}), inventory, DRIVER, True)
    _within_the_api_limits(entry)
    assert (len(entry["attributes"]), len(entry["capacity"])) == (14, 15)


def test_a_device_past_the_limit_is_refused_with_one_sentence(monkeypatch):
    inventory = _inventory("a100-mig.yaml")
    device = dra_devices(inventory)[0]
    monkeypatch.setattr(slices, "MAX_ATTRIBUTES_AND_CAPACITIES", 20)
    with pytest.raises(ValueError, match=r"^device gpu-0-mig-3g20gb-9-0 would have 13 attributes and 11 capacities"):
        wanted_devices([device], frozenset(), inventory, DRIVER, True)


def test_unhealthy_devices_are_tainted_or_else_left_out():
    inventory = _inventory("h100x8.yaml")
    devices = dra_devices(inventory)
    tainted = wanted_devices(devices, frozenset({"gpu-2"}), inventory, DRIVER, taints=True)
    assert [e["name"] for e in tainted] == [f"gpu-{i}" for i in range(8)]
    assert tainted[2]["attributes"]["health"] == {"string": "Unhealthy"}
    assert tainted[2]["taints"] == [{"key": "gpu.gpuops.k8s/unhealthy", "value": "Unhealthy", "effect": "NoSchedule"}]
    assert all("taints" not in e for i, e in enumerate(tainted) if i != 2)
    left_out = wanted_devices(devices, frozenset({"gpu-2"}), inventory, DRIVER, taints=False)
    assert [e["name"] for e in left_out] == [f"gpu-{i}" for i in range(8) if i != 2]


def test_slices_hold_at_most_128_devices_or_64_when_any_is_tainted():
    plain = [{"name": f"d{i}"} for i in range(130)]
    assert [len(c) for c in chunks(plain)] == [128, 2]
    tainted = [*plain[:129], {"name": "t", "taints": [{}]}]
    assert [len(c) for c in chunks(tainted)] == [64, 64, 2]
    assert chunks([]) == [[]], "an empty pool is still published"


# -- the v1beta1 shape -----------------------------------------------------------------------
def test_a_v1beta1_claim_is_read_in_the_v1_shape():
    beta = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "deviceClassName": "gpu.gpuops.k8s", "count": 2, "allocationMode": "ExactCount"},
                    {"name": "any", "firstAvailable": [{"name": "a", "deviceClassName": "x"}]},
                ]
            }
        },
        "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n"}]}}},
    }
    original = copy.deepcopy(beta)
    v1 = claim_to_v1(beta)
    assert beta == original, "the server's object is not changed in place"
    assert v1["apiVersion"] == "resource.k8s.io/v1"
    assert v1["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuops.k8s", "count": 2, "allocationMode": "ExactCount"}},
        {"name": "any", "firstAvailable": [{"name": "a", "deviceClassName": "x"}]},
    ]
    assert v1["status"] == beta["status"]
    already = claim_to_v1(v1)
    assert already["spec"] == v1["spec"]


def test_slices_go_under_basic_for_v1beta1_and_come_back_flat():
    v1 = {
        "metadata": {"name": "s"},
        "spec": {"driver": DRIVER, "devices": [{"name": "gpu-0", "attributes": {"a": {"int": 1}}, "capacity": {}}]},
    }
    beta = slice_from_v1(v1, "v1beta1")
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"
    assert beta["spec"]["devices"] == [{"name": "gpu-0", "basic": {"attributes": {"a": {"int": 1}}, "capacity": {}}}]
    assert slice_to_v1(beta)["spec"] == v1["spec"]
    assert slice_from_v1(v1, "v1beta2")["spec"] == v1["spec"]


# -- the publisher's logic against an in-memory API double -----------------------------------
class InMemoryApiDouble:
    """A test double of KubeApi: slices in a dict, resourceVersions counted, optionally dropping
    device taints as a server with DRADeviceTaints off does, or failing the next update with 409."""

    def __init__(self, drop_taints=False):
        self.node_uid = "node-5e1f0000-0000-4000-8000-000000000031"
        self.slices = {}
        self.drop_taints = drop_taints
        self.conflicts = 0
        self._serial = 0

    def get_node(self, name):
        return {"metadata": {"name": name, "uid": self.node_uid}}

    def list_resource_slices(self, node_name, driver):
        return [
            copy.deepcopy(s)
            for s in self.slices.values()
            if s["spec"]["nodeName"] == node_name and s["spec"]["driver"] == driver
        ]

    def _store(self, body, name):
        self._serial += 1
        stored = copy.deepcopy(body)
        stored["metadata"] = dict(stored["metadata"], name=name, resourceVersion=str(self._serial))
        stored["metadata"].pop("generateName", None)
        for device in stored["spec"]["devices"]:
            if self.drop_taints:
                device.pop("taints", None)
            for taint in device.get("taints", []):
                taint.setdefault("timeAdded", f"2026-01-01T00:00:{self._serial:02d}Z")
        self.slices[name] = stored
        return copy.deepcopy(stored)

    def create_resource_slice(self, body):
        return self._store(body, f"{body['metadata']['generateName']}{len(self.slices)}x")

    def update_resource_slice(self, body):
        name = body["metadata"]["name"]
        if self.conflicts:
            self.conflicts -= 1
            self.slices[name]["metadata"]["resourceVersion"] += "0"
            raise KubeApiError(f"cannot update ResourceSlice {name}: conflict.", 409)
        if name not in self.slices:
            return None
        if body["metadata"]["resourceVersion"] != self.slices[name]["metadata"]["resourceVersion"]:
            raise KubeApiError(f"cannot update ResourceSlice {name}: conflict.", 409)
        return self._store(body, name)

    def delete_resource_slice(self, name):
        self.slices.pop(name, None)


def _only(values):
    values = list(values)
    assert len(values) == 1, values
    return values[0]


def _generations(api):
    return sorted(s["spec"]["pool"]["generation"] for s in api.slices.values())


def test_the_generation_moves_on_every_change_and_only_then():
    inventory = _inventory("h100x8.yaml")
    devices = dra_devices(inventory)
    api = InMemoryApiDouble()
    slices = ResourceSlices(api, "node-a", DRIVER)
    assert slices.publish(devices, frozenset(), inventory) is True
    assert _generations(api) == [1] and slices.writes == 1
    stored = _only(api.slices.values())
    assert stored["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert stored["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "node-a",
            "uid": "node-5e1f0000-0000-4000-8000-000000000031",
            "controller": True,
        }
    ]
    assert slices.publish(devices, frozenset(), inventory) is False and slices.writes == 1
    assert slices.reconcile() is False

    assert slices.publish(devices, frozenset({"gpu-3"}), inventory) is True
    assert _generations(api) == [2]
    assert slices.publish(devices, frozenset({"gpu-3"}), inventory) is False, "the taint's timeAdded is no change"

    api.slices.clear()  # the kubelet wiped the node's slices
    assert slices.reconcile() is True
    assert _generations(api) == [3], "a pool published again continues from the last generation"
    assert slices.publish(devices[:4], frozenset(), inventory) is True
    assert _generations(api) == [4]
    stored = _only(api.slices.values())
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_every_slice_is_labelled_as_this_driver_s_and_a_slice_that_lost_the_label_gets_it_back():
    """The label is how a slice of ours is told from NVIDIA's driver's when both are called gpu.nvidia.com."""
    inventory = _inventory("t4x1.yaml")
    api = InMemoryApiDouble()
    slices = ResourceSlices(api, "node-a", "gpu.nvidia.com")
    slices.publish(dra_devices(inventory), frozenset(), inventory)
    stored = _only(api.slices.values())
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuops.k8s"}
    stored["metadata"]["labels"] = {"team": "ml"}
    assert slices.reconcile() is True
    assert _only(api.slices.values())["metadata"]["labels"] == {
        "team": "ml",
        "app.kubernetes.io/managed-by": "gpuops.k8s",
    }
    assert slices.reconcile() is False


def test_a_node_registered_again_gets_its_slices_owned_by_the_new_node_object():
    inventory = _inventory("h100x8.yaml")
    api = InMemoryApiDouble()
    slices = ResourceSlices(api, "node-a", DRIVER)
    slices.publish(dra_devices(inventory), frozenset(), inventory)
    api.node_uid = "node-5e1f0000-0000-4000-8000-000000000032"
    assert slices.reconcile() is True
    assert (
        _only(api.slices.values())["metadata"]["ownerReferences"][0]["uid"]
        == "node-5e1f0000-0000-4000-8000-000000000032"
    )


def test_a_pool_over_many_slices_is_counted_and_shrinks():
    inventory = _inventory("h100x8.yaml")
    many = dra_devices(inventory) * 20  # 160 entries: two slices
    api = InMemoryApiDouble()
    slices = ResourceSlices(api, "node-a", DRIVER)
    slices.publish(many, frozenset(), inventory)
    assert sorted(len(s["spec"]["devices"]) for s in api.slices.values()) == [32, 128]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.slices.values()} == {2}
    assert slices.publish(many, frozenset(), inventory) is False
    slices.publish(many[:8], frozenset(), inventory)
    assert [s["spec"]["pool"] for s in api.slices.values()] == [
        {"name": "node-a", "generation": 2, "resourceSliceCount": 1}
    ]


def test_a_server_that_drops_taints_gets_the_unhealthy_devices_left_out():
    inventory = _inventory("h100x8.yaml")
    api = InMemoryApiDouble(drop_taints=True)
    slices = ResourceSlices(api, "node-a", DRIVER)
    slices.publish(dra_devices(inventory), frozenset({"gpu-1"}), inventory)
    stored = _only(api.slices.values())
    assert [d["name"] for d in stored["spec"]["devices"]] == [f"gpu-{i}" for i in range(8) if i != 1]
    assert slices.taints is False
    assert slices.publish(dra_devices(inventory), frozenset({"gpu-1"}), inventory) is False


def test_a_conflicting_write_is_read_again_and_retried():
    inventory = _inventory("h100x8.yaml")
    api = InMemoryApiDouble()
    slices = ResourceSlices(api, "node-a", DRIVER)
    slices.publish(dra_devices(inventory), frozenset(), inventory)
    api.conflicts = 1
    assert slices.publish(dra_devices(inventory), frozenset({"gpu-0"}), inventory) is True
    assert _generations(api) == [2]


def test_delete_all_removes_the_pool_and_stops_reconciling():
    inventory = _inventory("h100x8.yaml")
    api = InMemoryApiDouble()
    slices = ResourceSlices(api, "node-a", DRIVER)
    slices.publish(dra_devices(inventory), frozenset(), inventory)
    slices.delete_all()
    assert api.slices == {}
    assert slices.reconcile() is False and api.slices == {}


# -- the client without a server ---------------------------------------------------------------
def test_a_missing_kubeconfig_is_one_sentence(tmp_path):
    with pytest.raises(KubeApiError) as error:
        KubeApi(str(tmp_path / "absent.conf"))
    message = str(error.value)
    assert message.startswith(f"cannot load the kubeconfig {tmp_path / 'absent.conf'}: ") and "\n" not in message


def test_a_server_that_is_down_is_an_oserror_naming_the_object(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]\n"
        "users: [{name: t, user: {token: x}}]\ncontexts: [{name: t, context: {cluster: t, user: t}}]\n"
    )
    api = KubeApi(str(kubeconfig), timeout=5)
    with pytest.raises(OSError) as error:
        api.get_node("node-a")
    assert str(error.value).startswith(f"cannot get Node node-a: the API server at https://127.0.0.1:{port} cannot be")
    assert "\n" not in str(error.value)
