"""The config file (NVIDIA's v1 fields we support), precedence, and the simulated-spec parser's rules."""

from __future__ import annotations

import os

import pytest
import yaml
from gpu_device_plugin import config, simspec
from harness import FIXTURES, fixture


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


FULL = """\
version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
gpuops:
  healthRecoverySeconds: 30
  mounts:
    devRoot: /host/dev
"""


def test_the_supported_v1_fields(tmp_path):
    values = config.load_file(write(tmp_path, FULL))
    settings = config.resolve({}, {}, values)
    assert settings.mig_strategy == "mixed"
    assert settings.fail_on_init_error is False
    assert settings.pass_device_specs is True
    assert settings.device_list_strategy == ("envvar", "cdi-cri")
    assert settings.device_id_strategy == "index"
    assert settings.time_slicing.rename_by_default and settings.time_slicing.fail_requests_greater_than_one
    assert settings.time_slicing.resources[0].replicas == 4
    assert settings.health_recovery_seconds == 30
    assert settings.mounts.driver_root == "/run/nvidia/driver" and settings.mounts.dev_root == "/host/dev"


def test_the_feature_flags_default_on_as_in_nvidias_plugin_and_can_be_turned_off(tmp_path):
    default = config.resolve({}, {})
    assert (default.gdrcopy_enabled, default.gds_enabled, default.mofed_enabled) == (True, True, True)
    path = write(tmp_path, "version: v1\nflags:\n  gdrcopyEnabled: false\n  gdsEnabled: false\n  mofedEnabled: true\n")
    from_file = config.resolve({}, {}, config.load_file(path))
    assert (from_file.gdrcopy_enabled, from_file.gds_enabled, from_file.mofed_enabled) == (False, False, True)
    from_env = config.resolve({}, {"MOFED_ENABLED": "false", "GDS_ENABLED": "true"}, config.load_file(path))
    assert (from_env.gdrcopy_enabled, from_env.gds_enabled, from_env.mofed_enabled) == (False, True, False)
    with pytest.raises(config.ConfigError, match=r"flags\.gdsEnabled must be true or false"):
        config.load_file(write(tmp_path, "version: v1\nflags:\n  gdsEnabled: sometimes\n"))


def test_precedence_is_flag_then_env_then_file(tmp_path):
    values = config.load_file(write(tmp_path, FULL))
    env = {"MIG_STRATEGY": "single", "DEVICE_ID_STRATEGY": "uuid", "FAIL_ON_INIT_ERROR": "true"}
    settings = config.resolve({"mig_strategy": "none"}, env, values)
    assert settings.mig_strategy == "none"  # flag over env over file
    assert settings.device_id_strategy == "uuid"  # env over file
    assert settings.fail_on_init_error is True
    assert settings.device_list_strategy == ("envvar", "cdi-cri")  # file over default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\n", "version must be v1, not 'v2'"),
        ("flags: {}\n", "version must be v1, not None"),
        ("version: v1\nresources: {}\n", "unknown field resources"),
        ("version: v1\nflags:\n  migStrategy: none\n  mpsRoot: /run/nvidia/mps\n", "unknown field flags.mpsRoot"),
        ("version: v1\nflags:\n  plugin:\n    bogus: 1\n", "unknown field flags.plugin.bogus"),
        ("version: v1\nflags:\n  failOnInitError: maybe\n", "flags.failOnInitError must be true or false"),
        ("version: v1\nflags:\n  migStrategy: half\n", "mig strategy must be one of"),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 0\n",
            "replicas must be an integer of 1 or more",
        ),
        ("version: v1\nsharing:\n  mps: {}\n", "unknown field sharing.mps"),
        ("version: v1\nflags: [\n", "line"),
    ],
)
def test_config_errors_are_one_sentence_naming_the_field(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as caught:
        config.resolve({}, {}, config.load_file(path))
    assert message in str(caught.value)
    assert path in str(caught.value) or "strategy" in str(caught.value)


def test_env_values_are_checked():
    with pytest.raises(config.ConfigError, match="PASS_DEVICE_SPECS must be true or false"):
        config.resolve({}, {"PASS_DEVICE_SPECS": "perhaps"})


# Every spec, those of the NVLink fabric shapes (fabric/) included.
@pytest.mark.parametrize(
    "name",
    sorted(
        os.path.relpath(os.path.join(top, file), FIXTURES)
        for top, _dirs, files in os.walk(FIXTURES)
        for file in files
        if file.endswith(".yaml")
    ),
)
def test_every_fixture_parses(name):
    inventory = simspec.load(os.path.join(FIXTURES, name))
    assert inventory.gpus
    for gpu in inventory.gpus:
        for peer in gpu.nvlink_peers:
            assert gpu.uuid in inventory.by_uuid()[peer].nvlink_peers


def _spec_error(change):
    spec = fixture("h100x8.yaml")
    change(spec)
    with pytest.raises(simspec.SpecError) as caught:
        simspec.parse(yaml.safe_dump(spec), "spec.yaml")
    return str(caught.value)


def test_spec_rules_name_the_file_and_the_gpu():
    # The collection's messages (plugins/module_utils/_simulated_spec.py), one sentence each.
    message = _spec_error(lambda s: s["gpus"][1].update(colour="green"))
    assert (
        message
        == "Simulated-GPU spec spec.yaml, GPU 1 (GPU-6f1c0a3e-0000-4000-8000-000000000002): unknown key 'colour'."
    )
    assert "already used by GPU 0" in _spec_error(lambda s: s["gpus"][3].update(uuid=s["gpus"][0]["uuid"]))
    assert "already used" in _spec_error(lambda s: s["gpus"][3].update(pci_bus_id="0000:18:00.0"))
    assert "nvlink_peers names GPU-nope" in _spec_error(lambda s: s["gpus"][0]["nvlink_peers"].append("GPU-nope"))
    assert "only allowed with mig_mode: enabled" in _spec_error(
        lambda s: s["gpus"][0].update(mig_devices=[{"uuid": "MIG-1", "profile": "1g.10gb", "memory_mib": 9984}])
    )
    assert "the required key 'memory_mib' is missing" in _spec_error(lambda s: s["gpus"][2].pop("memory_mib"))
    assert "unknown top-level key 'extra'" in _spec_error(lambda s: s.update(extra=1))
    assert "pci_bus_id" in _spec_error(lambda s: s["gpus"][2].update(pci_bus_id="18:00.0"))
    assert "xid must be a positive integer" in _spec_error(lambda s: s["gpus"][2].update(xid=0))


def test_peer_relation_is_symmetric_and_defaults_apply():
    text = """
driver_version: "1"
cuda_driver_version: "12.2"
gpus:
- {uuid: GPU-a, name: A, memory_mib: 1, pci_bus_id: "0000:01:00.0", compute_capability: "8.0", nvlink_peers: [GPU-b]}
- {uuid: GPU-b, name: B, memory_mib: 1, pci_bus_id: "0000:02:00.0", compute_capability: "8.0"}
"""
    a, b = simspec.parse(text, "x").gpus
    assert a.nvlink_peers == frozenset({"GPU-b"}) and b.nvlink_peers == frozenset({"GPU-a"})
    assert (b.minor_number, b.numa_node, b.mig_mode, b.lost) == (1, None, "disabled", False)
