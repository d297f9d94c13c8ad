"""gpuops.k8s.nvidia_mig run by the real `ansible` command on localhost, partitioning the GPUs of an 8 x H100
simulated-GPU spec (tests/fixtures/simulated/h100x8.yaml) through the real pynvml on the lab's mock
libnvidia-ml.so.1 (tests/mock_nvml; a TEST DOUBLE of NVIDIA's driver library that models MIG as a driver does:
profiles, placements, mode changes that wait for a GPU reset while another process has NVML, fault injection).

What the module did is read back by another process through NVML (the collection's own discovery, the
nvidia_gpu_info module), and the mock library's layout file (what clients changed) shows what was written.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pynvml
import pytest
import yaml
from adhoc import ansible_environment, run_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
# The lab's TEST DOUBLES of `nvidia-smi --gpu-reset -i UUID` and `nvidia-smi -i UUID -pm MODE` (on the mock library).
from gpuops_lab.inventory import _GPU_RESET_SCRIPT, _PERSISTENCE_MODE_SCRIPT  # noqa: E402

SPEC = os.path.join(REPO, "tests", "fixtures", "simulated", "h100x8.yaml")
UUIDS = [f"GPU-6f1c0a3e-0000-4000-8000-00000000000{n}" for n in range(1, 9)]

CONFIGS = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": [
            {"devices": "all", "device-filter": "0x233010DE", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
        ],
        # GPUs 0 and 1 keep all-1g.10gb; 2 and 3 get mig-parted's all-balanced; 4 compute instances sharing a
        # 3g.40gb beside a 4g.40gb; 5 MIG mode without devices; 6 and 7 no MIG.
        "mixed": [
            {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
            {
                "devices": [2, 3],
                "device-filter": ["0x233010DE"],
                "mig-enabled": True,
                "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
            },
            {"devices": [4], "mig-enabled": True, "mig-devices": {"1c.3g.40gb": 1, "2c.3g.40gb": 1, "4g.40gb": 1}},
            {"devices": [5], "mig-enabled": True, "mig-devices": {}},
            {"devices": [6, 7], "mig-enabled": False, "mig-devices": {}},
        ],
        "all-balanced": [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
        ],
        "not-offered": [{"devices": [3], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
        # By index, MIG on the T4 of a mixed node (GPU 1) and on a node of one T4 (GPU 0): refused.
        "gpu1-balanced": [
            {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
        ],
        "gpu0-balanced": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
        ],
        # Whole-GPU and compute-instance forms whose compute-instance profiles have variants (see variants()).
        "variants": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
            {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
            {"devices": [2], "mig-enabled": True, "mig-devices": {"1c.3g.40gb": 1, "2c.3g.40gb": 1, "4g.40gb": 1}},
        ],
        "too-many-1g": [{"devices": [3], "mig-enabled": True, "mig-devices": {"1g.10gb": 8}}],
        "two-4g": [{"devices": [3], "mig-enabled": True, "mig-devices": {"4g.40gb": 2}}],
        "too-much-memory": [{"devices": [3], "mig-enabled": True, "mig-devices": {"3g.40gb": 2, "1g.10gb": 1}}],
    },
}
MIXED = {
    0: {"1g.10gb": 7},
    1: {"1g.10gb": 7},
    2: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
    3: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
    4: {"4g.40gb": 1, "1c.3g.40gb": 1, "2c.3g.40gb": 1},
    5: {},
}


@pytest.fixture(scope="module")
def library_dir():
    """The lab's mock libnvidia-ml.so.1 (built once, cached by content)."""
    built = subprocess.run(
        [os.path.join(REPO, "scripts", "build-mock-nvml.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return built.stdout.strip()


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory):
    return ansible_environment(str(tmp_path_factory.mktemp("ansible-tmp")))


class Node:
    """One simulated node: the spec's state for the mock library, its layout file, and the MIG config file."""

    def __init__(self, tmp_path, library_dir, ansible_env, spec=SPEC):
        self.state = str(tmp_path / "nvml.state")
        self.layout = self.state + ".mig"  # where the library keeps what clients changed (docs/mock-nvml.md)
        self.library = os.path.join(library_dir, "libnvidia-ml.so.1")
        self.config_file = str(tmp_path / "mig-config.yaml")
        with open(self.config_file, "w") as handle:
            yaml.safe_dump(CONFIGS, handle)
        subprocess.run(
            [sys.executable, os.path.join(REPO, "tests", "mock_nvml", "nvml_state.py"), spec, self.state], check=True
        )
        self.env = dict(ansible_env, LD_LIBRARY_PATH=library_dir, GPUOPS_MOCK_NVML_STATE=self.state)

    def run(self, module, args, *flags, env=None):
        """(rc, the task's result) of an ad hoc run of a module on localhost."""
        rc, result, _stats = run_module(dict(self.env, **(env or {})), module, args, *flags, timeout=300)
        return rc, result

    def mig(self, config_name, *flags, env=None, **extra):
        return self.run(
            "gpuops.k8s.nvidia_mig",
            dict(config_file=self.config_file, config_name=config_name, **extra),
            *flags,
            env=env,
        )

    def apply(self, config_name):
        rc, result = self.mig(config_name)
        assert rc == 0, result.get("msg")
        return result

    def seen(self):
        """What another NVML client sees: per GPU, its MIG mode and its MIG devices' profiles and UUIDs."""
        rc, result = self.run("gpuops.k8s.nvidia_gpu_info", {"sysfs_root": os.path.dirname(self.state)}, "--check")
        assert rc == 0 and result["source"] == "nvml", result
        return [
            (
                gpu["mig_mode"],
                sorted(mig["profile"] for mig in gpu["mig_devices"]),
                [m["uuid"] for m in gpu["mig_devices"]],
            )
            for gpu in result["gpus"]
        ]

    def layout_bytes(self):
        try:
            with open(self.layout, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def gpu_instances(self):
        """Per GPU UUID, its GPU instances as the layout file records them: (ID, profile ID, first memory slice,
        memory slices)."""
        found, uuid = {}, None
        for line in (self.layout_bytes() or b"").decode().splitlines():
            fields = line.split()
            if fields[:1] == ["gpu"]:
                uuid = fields[1]
                found[uuid] = []
            elif fields[:1] == ["gi"]:
                found[uuid].append(tuple(int(field) for field in fields[1:5]))
        return found

    def reset_gpu(self, uuid):
        """`nvidia-smi --gpu-reset` as the mock library models it (its test hook, called in a process of its own
        that finds this node's state as the module does); the NVML code."""
        code = (
            "import ctypes, sys\n"
            f"lib = ctypes.CDLL({self.library!r})\n"
            "lib.gpuopsMockNvmlResetGpu.argtypes = [ctypes.c_char_p, ctypes.c_uint]\n"
            f"print(lib.gpuopsMockNvmlResetGpu({uuid.encode()!r}, 0))\n"
        )
        done = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True, check=True)
        return int(done.stdout)

    def other_client(self):
        """Another process with NVML initialised on this node (a monitoring agent), until its stdin is closed
        (communicate())."""
        code = "import sys, pynvml; pynvml.nvmlInit(); print('ready', flush=True); sys.stdin.read()"
        other = subprocess.Popen(
            [sys.executable, "-c", code],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert other.stdout.readline().strip() == "ready"
        return other

    def set_persistence_mode(self, uuid, mode):
        """`nvidia-smi -i UUID -pm MODE` as NVML does it, in a process of its own."""
        code = (
            "import pynvml as nvml\n"
            "nvml.nvmlInit()\n"
            f"nvml.nvmlDeviceSetPersistenceMode(nvml.nvmlDeviceGetHandleByUUID({uuid!r}), {mode})\n"
        )
        subprocess.run([sys.executable, "-c", code], env=self.env, check=True)

    def persistence_modes(self):
        code = (
            "import json, pynvml as nvml\n"
            "nvml.nvmlInit()\n"
            "handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]\n"
            "print(json.dumps([nvml.nvmlDeviceGetPersistenceMode(handle) for handle in handles]))\n"
        )
        done = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    def reset_tasks(self, tmp_path, uuids):
        """The role's reset.yml run by ansible-playbook on this machine for UUIDS, the GPUs reset and their persistence
        mode set by the lab's doubles; (rc, {task name: its result})."""
        doubles = {}
        for name, text in (("gpu-reset", _GPU_RESET_SCRIPT), ("persistence-mode", _PERSISTENCE_MODE_SCRIPT)):
            doubles[name] = tmp_path / name
            doubles[name].write_text(text)
        role = {"name": "gpuops.k8s.nvidia_mig", "tasks_from": "reset"}
        play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": role}]}]
        (tmp_path / "reset.yml").write_text(yaml.safe_dump(play))
        extra = {
            "__nvidia_mig_reset_uuids": uuids,
            "nvidia_mig_gpu_reset_command": [sys.executable, str(doubles["gpu-reset"]), "{uuid}"],
            "nvidia_mig_persistence_command": [sys.executable, str(doubles["persistence-mode"]), "{uuid}", "{mode}"],
            "ansible_python_interpreter": sys.executable,
        }
        playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        argv = [playbook, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(tmp_path / "reset.yml")]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=300, check=False)
        tasks = json.loads(done.stdout)["plays"][0]["tasks"]
        return done.returncode, {t["task"]["name"].split(" : ")[-1]: t["hosts"]["localhost"] for t in tasks}


@pytest.fixture
def node(tmp_path, library_dir, ansible_env):
    return Node(tmp_path, library_dir, ansible_env)


def profiles(counts):
    return sorted(name for name, count in counts.items() for _copy in range(count))


def test_none_to_all_1g_10gb_to_mixed_to_none_and_each_second_run_changes_nothing(node):
    assert node.seen() == [("disabled", [], [])] * 8

    result = node.apply("all-1g.10gb")
    assert result["changed"] is True
    assert result["changed_gpus"] == UUIDS and result["reset_required"] == []
    first = result["gpus"][0]
    assert (first["index"], first["uuid"], first["name"], first["device_id"]) == (
        0,
        UUIDS[0],
        "NVIDIA H100 80GB HBM3",
        "0x233010DE",
    )
    assert first["before"] == {"mig_enabled": False, "mig_pending": False, "devices": {}}
    assert first["after"] == {"mig_enabled": True, "mig_pending": False, "devices": {"1g.10gb": 7}}
    assert result["previous_config"] == {
        "version": "v1",
        "mig-configs": {"previous": [{"devices": [i], "mig-enabled": False} for i in range(8)]},
    }
    seen = node.seen()
    assert [(mode, names) for mode, names, _u in seen] == [("enabled", ["1g.10gb"] * 7)] * 8
    assert node.apply("all-1g.10gb")["changed"] is False

    result = node.apply("mixed")
    assert result["changed_gpus"] == UUIDS[2:]
    assert [gpu["after"]["devices"] for gpu in result["gpus"][:6]] == [MIXED[i] for i in range(6)]
    assert [gpu["after"]["mig_enabled"] for gpu in result["gpus"]] == [True] * 6 + [False] * 2
    now = node.seen()
    # GPUs 0 and 1 kept their layout, so they were not touched: the same MIG devices (UUIDs) as before.
    assert now[:2] == seen[:2]
    assert [(mode, names) for mode, names, _u in now[2:]] == [
        ("enabled", profiles(MIXED[2])),
        ("enabled", profiles(MIXED[3])),
        ("enabled", profiles(MIXED[4])),
        ("enabled", []),
        ("disabled", []),
        ("disabled", []),
    ]
    assert result["previous_config"]["mig-configs"]["previous"][0] == {
        "devices": [2],
        "mig-enabled": True,
        "mig-devices": {"1g.10gb": 7},
    }
    assert node.apply("mixed")["changed"] is False

    result = node.apply("all-disabled")
    assert result["changed_gpus"] == UUIDS[:6]
    assert node.seen() == [("disabled", [], [])] * 8
    assert node.apply("all-disabled")["changed"] is False


def test_check_mode_writes_nothing_and_diff_shows_each_gpus_layout_before_and_after(node):
    node.apply("all-1g.10gb")
    before_bytes, before_seen = node.layout_bytes(), node.seen()
    rc, result = node.mig("mixed", "--check", "--diff")
    assert rc == 0, result
    assert result["changed"] is True and result["changed_gpus"] == UUIDS[2:]
    assert [gpu["after"]["devices"] for gpu in result["gpus"][:6]] == [MIXED[i] for i in range(6)]
    assert node.layout_bytes() == before_bytes
    assert node.seen() == before_seen
    diffs = result["diff"]
    assert [d["before_header"] for d in diffs] == [f"GPU {i} ({UUIDS[i]}) NVIDIA H100 80GB HBM3" for i in range(2, 8)]
    assert diffs[0]["before"] == "mig-enabled: true\nmig-devices:\n  1g.10gb: 7\n"
    assert diffs[0]["after"] == "mig-enabled: true\nmig-devices:\n  1g.10gb: 2\n  2g.20gb: 1\n  3g.40gb: 1\n"
    assert diffs[-1]["after"] == "mig-enabled: false\n"


def test_check_mode_from_no_mig_writes_nothing_and_says_the_profiles_were_not_checked(node):
    rc, result = node.mig("all-1g.10gb", "--check")
    assert rc == 0, result
    assert result["changed_gpus"] == UUIDS
    assert node.layout_bytes() is None
    assert any("NVML lists none of its MIG profiles" in warning for warning in result.get("warnings", []))


def test_a_mode_change_while_another_process_has_nvml_waits_for_a_gpu_reset(node):
    other = node.other_client()
    try:
        result = node.apply("all-1g.10gb")
        assert result["changed"] is True
        assert result["reset_required"] == UUIDS
        assert all(gpu["after"] == {"mig_enabled": False, "mig_pending": True, "devices": {}} for gpu in result["gpus"])
        assert all(gpu["reset_required"] for gpu in result["gpus"])
        # Nothing more can happen before the reset: the second run changes nothing and says so again.
        again = node.apply("all-1g.10gb")
        assert again["changed"] is False and again["reset_required"] == UUIDS
        assert node.reset_gpu(UUIDS[0]) != 0  # the reset itself waits while the other process has the GPU
    finally:
        other.communicate(timeout=30)
    # Nor while a GPU is in persistence mode (the spec's GPUs are), as nvidia-smi says: "In use by another client".
    assert node.reset_gpu(UUIDS[0]) == 19  # NVML_ERROR_IN_USE
    for uuid in UUIDS:
        node.set_persistence_mode(uuid, 0)
    assert [node.reset_gpu(uuid) for uuid in UUIDS] == [0] * 8
    assert [(mode, names) for mode, names, _u in node.seen()] == [("enabled", [])] * 8
    result = node.apply("all-1g.10gb")
    assert result["changed"] is True and result["reset_required"] == []
    assert [(mode, names) for mode, names, _u in node.seen()] == [("enabled", ["1g.10gb"] * 7)] * 8
    assert node.apply("all-1g.10gb")["changed"] is False


def test_a_failure_half_way_puts_every_touched_gpu_back(node):
    node.apply("all-1g.10gb")
    seen, placed = node.seen(), node.gpu_instances()
    # all-balanced makes four GPU instances per GPU: the 6th creation is GPU 1's second (its 2g.20gb).
    rc, result = node.mig(
        "all-balanced", env={"GPUOPS_MOCK_NVML_FAIL": "nvmlDeviceCreateGpuInstanceWithPlacement:23@6"}
    )
    assert rc != 0
    assert result["msg"] == (
        "MIG config all-balanced could not be applied: creating a 2g.20gb GPU instance on GPU 1 "
        f"({UUIDS[1]}) failed (nvmlDeviceCreateGpuInstanceWithPlacement: Ran out of critical resources, other than "
        "memory), "
        "and the 2 GPU(s) it had touched have the layout they had again."
    )
    assert result["rolled_back"] == UUIDS[:2]
    assert [gpu["after"] for gpu in result["gpus"]] == [gpu["before"] for gpu in result["gpus"]]
    now = node.seen()
    assert [(mode, names) for mode, names, _u in now] == [(mode, names) for mode, names, _u in seen]
    assert now[2:] == seen[2:]  # the GPUs after the failing one were never touched
    # The GPU instances are back where they were (their MIG devices are new ones: new UUIDs).
    assert node.gpu_instances() == placed


def test_a_failure_without_rollback_leaves_the_gpus_as_the_failure_did(node):
    node.apply("all-1g.10gb")
    rc, result = node.mig(
        "all-balanced", env={"GPUOPS_MOCK_NVML_FAIL": "nvmlDeviceCreateGpuInstanceWithPlacement:23@2"}, rollback=False
    )
    assert rc != 0
    assert result["msg"].endswith("and the GPUs it had touched were left as they are (rollback is false).")
    assert result["rolled_back"] == []
    assert node.seen()[0][1] == ["3g.40gb"]


def test_a_failure_while_mig_goes_on_turns_it_off_again(node):
    rc, result = node.mig("all-1g.10gb", env={"GPUOPS_MOCK_NVML_FAIL": "nvmlDeviceCreateGpuInstanceWithPlacement:23@3"})
    assert rc != 0
    assert f"on GPU 0 ({UUIDS[0]}) failed" in result["msg"]
    assert result["rolled_back"] == [UUIDS[0]]
    assert node.seen() == [("disabled", [], [])] * 8


@pytest.mark.parametrize(
    ("config_name", "reason"),
    [
        ("not-offered", "the product offers no MIG profile 1g.5gb (it offers 1g.10gb, 1g.10gb+me, 1g.20gb, "),
        ("too-many-1g", "it allows at most 7 GPU instance(s) of profile 1g.10gb and the layout needs 8."),
        ("two-4g", "it allows at most 1 GPU instance(s) of profile 4g.40gb and the layout needs 2."),
        ("too-much-memory", "the layout needs 90880 MiB and the GPU has 81559 MiB."),
    ],
)
def test_an_impossible_layout_is_refused_before_anything_is_written(node, config_name, reason):
    node.apply("all-1g.10gb")
    before_bytes = node.layout_bytes()
    rc, result = node.mig(config_name)
    assert rc != 0
    assert result["msg"].startswith(
        f"MIG config {config_name} (entry 0) cannot be applied to GPU 3 ({UUIDS[3]}, NVIDIA H100 80GB HBM3): {reason}"
    )
    assert result["changed"] is False and result["rolled_back"] == []
    assert node.layout_bytes() == before_bytes


def test_an_impossible_layout_on_a_product_without_mig_on_is_refused_and_mig_goes_off_again(node):
    rc, result = node.mig("not-offered")
    assert rc != 0
    assert "the product offers no MIG profile 1g.5gb" in result["msg"]
    assert result["rolled_back"] == [UUIDS[3]]
    assert node.seen() == [("disabled", [], [])] * 8


def test_an_inline_config_and_one_sentence_for_a_bad_one(node):
    inline = {
        "version": "v1",
        "mig-configs": {"one": [{"devices": [7], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}]},
    }
    rc, result = node.run("gpuops.k8s.nvidia_mig", {"config": inline, "config_name": "one"})
    assert rc == 0, result
    assert result["changed_gpus"] == [UUIDS[7]]
    assert node.seen()[7][1] == ["7g.80gb"]
    inline["mig-configs"]["one"][0]["mig-device"] = {}
    rc, result = node.run("gpuops.k8s.nvidia_mig", {"config": inline, "config_name": "one"})
    assert rc != 0
    assert result["msg"] == (
        "The config option, MIG config one, entry 0 has the unknown key(s) mig-device; an entry has devices, "
        "device-filter, mig-enabled, mig-devices."
    )


def test_under_python_3_9_the_oldest_a_node_may_have(node, tmp_path):
    """The node's Python runs the module (Ansible ships it there); 3.9 with only the real pynvml on its path."""
    pythons = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9.*/bin/python3.9")))
    assert pythons, "no Python 3.9 under pyenv (the daemon-py39 tier needs it too)"
    bindings = tmp_path / "bindings"
    bindings.mkdir()
    (bindings / "pynvml.py").symlink_to(pynvml.__file__)
    inline = {"version": "v1", "mig-configs": {"balanced": CONFIGS["mig-configs"]["all-balanced"]}}
    flags = ("-e", f"ansible_python_interpreter={pythons[-1]}")
    env = {"PYTHONPATH": str(bindings)}
    rc, result = node.run("gpuops.k8s.nvidia_mig", {"config": inline, "config_name": "balanced"}, *flags, env=env)
    assert rc == 0, result
    assert result["changed_gpus"] == UUIDS
    rc, again = node.run("gpuops.k8s.nvidia_mig", {"config": inline, "config_name": "balanced"}, *flags, env=env)
    assert rc == 0 and again["changed"] is False, again
    assert [names for _mode, names, _u in node.seen()] == [["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]] * 8


T4_UUID = "GPU-7e570000-0000-4000-8000-0000000000f4"


def t4_spec(tmp_path, mig_mode, with_h100=False):
    """The T4 of t4x1.yaml, reporting MIG mode as ``mig_mode`` says, alone or as GPU 1 beside the first H100 of
    h100x8.yaml (a node that mixes the two); the path of the spec written."""
    with open(os.path.join(REPO, "tests", "fixtures", "simulated", "t4x1.yaml")) as handle:
        t4 = yaml.safe_load(handle)
    t4["gpus"][0]["mig_mode"] = mig_mode
    spec = t4
    if with_h100:
        with open(SPEC) as handle:
            spec = yaml.safe_load(handle)
        h100 = dict(spec["gpus"][0], nvlink_peers=[])
        h100.pop("pcie_switch", None)
        spec["gpus"] = [h100, t4["gpus"][0]]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


# The mock library, as NVML does for some products, reports MIG mode off on a GPU without MIG; setting it answers
# Not Supported. Otherwise NVML answers Not Supported for the mode itself.
WITHOUT_MIG = [
    ("unsupported", "NVML reports no MIG mode for it", "the product does not support MIG"),
    (
        "disabled",
        "setting its MIG mode failed without a change (nvmlDeviceSetMigMode answers Not Supported)",
        "the product does not support MIG (nvmlDeviceSetMigMode answers Not Supported)",
    ),
]


@pytest.mark.parametrize(("mig_mode", "skipped_because", "refused_because"), WITHOUT_MIG)
def test_a_gpu_without_mig_is_skipped_under_devices_all_and_refused_by_index(
    tmp_path, library_dir, ansible_env, mig_mode, skipped_because, refused_because
):
    t4 = Node(tmp_path, library_dir, ansible_env, spec=t4_spec(tmp_path, mig_mode))
    rc, result = t4.mig("all-disabled")
    assert rc == 0, result
    assert result["changed"] is False
    assert [gpu["before"] for gpu in result["gpus"]] == [gpu["after"] for gpu in result["gpus"]]
    # all-balanced names every GPU (devices: all): as mig-parted, the GPU without MIG is skipped, and says so.
    rc, result = t4.mig("all-balanced", "--diff")
    assert rc == 0, result
    assert result["changed"] is False and result["gpus"] == [] and result["changed_gpus"] == []
    assert result["skipped_gpus"] == [
        {
            "index": 0,
            "uuid": T4_UUID,
            "name": "Tesla T4",
            "device_id": "0x1EB810DE",
            "entry": 0,
            "reason": f"the product has no MIG ({skipped_because})",
        }
    ]
    assert result["diff"] == [
        {
            "prepared": f"GPU 0 ({T4_UUID}) Tesla T4: skipped, left as it is: entry 0 names it by devices: all and "
            f"the product has no MIG ({skipped_because})\n"
        }
    ]
    assert t4.layout_bytes() is None
    # Named by its index, it is refused: the config says this GPU, and it cannot have MIG.
    rc, result = t4.mig("gpu0-balanced")
    assert rc != 0
    assert result["msg"] == (
        f"MIG config gpu0-balanced (entry 0) cannot be applied to GPU 0 ({T4_UUID}, Tesla T4): {refused_because}, "
        "and an entry that names it by index cannot skip it as devices: all does."
    )
    assert result["rolled_back"] == [] and result["changed"] is False
    assert t4.layout_bytes() is None
    # all-1g.10gb filters on the H100's PCI ID: the T4 is not named, so it is left alone and not listed.
    rc, result = t4.mig("all-1g.10gb")
    assert rc == 0 and result["gpus"] == [] and result["skipped_gpus"] == [] and result["changed"] is False
    # Said, though: a node whose products the config does not name is told so, not left to guess.
    assert result["warnings"] == [
        "MIG config all-1g.10gb has no entry for any GPU of this host (Tesla T4 (0x1EB810DE)): no GPU's layout "
        "changes. Its entries name other products by device-filter; a config file of your own can name these."
    ]


@pytest.mark.parametrize(("mig_mode", "skipped_because", "refused_because"), WITHOUT_MIG)
def test_a_node_mixing_an_h100_with_a_t4_takes_all_balanced_on_the_h100(
    tmp_path, library_dir, ansible_env, mig_mode, skipped_because, refused_because
):
    node = Node(tmp_path, library_dir, ansible_env, spec=t4_spec(tmp_path, mig_mode, with_h100=True))
    rc, result = node.mig("all-balanced", "--check", "--diff")
    assert rc == 0, result
    assert node.layout_bytes() is None
    if mig_mode == "unsupported":
        assert result["changed_gpus"] == [UUIDS[0]]
        assert [d.get("before_header") for d in result["diff"]] == [f"GPU 0 ({UUIDS[0]}) NVIDIA H100 80GB HBM3", None]
        assert "skipped, left as it is" in result["diff"][1]["prepared"]
    else:
        # A GPU that reports a MIG mode shows it has none only when the mode is set: check mode cannot know.
        assert result["changed_gpus"] == [UUIDS[0], T4_UUID] and result["skipped_gpus"] == []
    result = node.apply("all-balanced")
    assert result["changed_gpus"] == [UUIDS[0]]
    assert [gpu["index"] for gpu in result["gpus"]] == [0]
    assert result["gpus"][0]["after"]["devices"] == MIXED[2]
    assert [(gpu["index"], gpu["reason"]) for gpu in result["skipped_gpus"]] == [
        (1, f"the product has no MIG ({skipped_because})")
    ]
    assert [names for _mode, names, _u in node.seen()] == [profiles(MIXED[2]), []]
    again = node.apply("all-balanced")
    assert again["changed"] is False and len(again["skipped_gpus"]) == 1
    # By index, MIG on the T4 is refused before anything is written.
    before = node.layout_bytes()
    rc, result = node.mig("gpu1-balanced")
    assert rc != 0
    assert result["msg"].startswith(
        f"MIG config gpu1-balanced (entry 0) cannot be applied to GPU 1 ({T4_UUID}, Tesla T4): {refused_because}, "
    )
    assert node.layout_bytes() == before


def test_instances_are_created_where_the_plan_placed_them_whatever_the_drivers_placement_policy(node):
    """A driver that puts a GPU instance on the lowest free placement makes 3g, 2g, 1g, 1g fail at the last 1g
    when the driver places them; created at the placements the plan found, all-balanced fits."""
    lowest = {"GPUOPS_MOCK_NVML_PLACEMENT": "lowest"}
    rc, result = node.mig("all-balanced", env=lowest)
    assert rc == 0, result.get("msg")
    assert [names for _mode, names, _u in node.seen()] == [profiles(MIXED[2])] * 8
    # (GPU-instance ID, profile index, first memory slice, memory slices): 3g.40gb on the upper half.
    assert node.gpu_instances()[UUIDS[0]] == [(2, 2, 4, 4), (3, 1, 0, 2), (9, 0, 2, 1), (10, 0, 3, 1)]
    rc, again = node.mig("all-balanced", env=lowest)
    assert rc == 0 and again["changed"] is False


def variants(node):
    """Make the node's driver offer, beside the plain compute-instance profiles, NVML's variants of the same slices:
    1_SLICE_REV1 (7) in the 1g.10gb and the 3g.40gb, 7_SLICE_NVL (8) in the 7g.80gb."""
    extra = {"ci_profile 0 0 ": "ci_profile 0 7 1 1 16 0", "ci_profile 2 0 ": "ci_profile 2 7 1 3 16 0,1,2"}
    extra["ci_profile 4 4 "] = "ci_profile 4 8 7 1 132 0"
    lines = []
    with open(node.state) as handle:
        for line in handle.read().splitlines():
            lines.append(line)
            lines += [added for prefix, added in extra.items() if line.startswith(prefix)]
    with open(node.state, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def test_where_the_driver_offers_profile_variants_the_plain_compute_instance_profile_is_made(node):
    """mig-parted takes, for 1g.10gb, the first compute-instance profile of NVML's order whose name matches:
    1_SLICE (0), not 1_SLICE_REV1 (7); 7_SLICE (4), not 7_SLICE_NVL (8)."""
    variants(node)
    node.apply("variants")
    compute = {}
    uuid = None
    for line in node.layout_bytes().decode().splitlines():
        fields = line.split()
        if fields[0] == "gpu":
            uuid = fields[1]
        elif fields[0] == "ci":
            compute.setdefault(uuid, []).append(int(fields[3]))  # ci GI CI PROFILE ...
    assert compute == {UUIDS[0]: [4], UUIDS[1]: [0] * 7, UUIDS[2]: [3, 1, 0]}
    assert [names for _mode, names, _u in node.seen()[:3]] == [
        ["7g.80gb"],
        ["1g.10gb"] * 7,
        ["1c.3g.40gb", "2c.3g.40gb", "4g.40gb"],
    ]
    assert node.apply("variants")["changed"] is False


def test_without_a_driver_and_without_the_config_file_one_sentence_each(node):
    rc, result = node.mig("all-disabled", env={"GPUOPS_MOCK_NVML_STATE": node.state + ".absent"})
    assert rc != 0
    assert result["msg"] == "NVML could not be initialised (Driver Not Loaded), so no MIG layout can be read or made."
    rc, result = node.mig("all-disabled", env={"GPUOPS_MOCK_NVML_FAIL": "nvmlDeviceGetMigMode:15@4"})
    assert rc != 0
    assert result["msg"] == "Reading GPU 3 through NVML failed (nvmlDeviceGetMigMode: GPU is lost)."
    rc, result = node.run("gpuops.k8s.nvidia_mig", {"config_file": node.config_file + ".absent", "config_name": "x"})
    assert rc != 0
    assert result["msg"] == f"MIG config file {node.config_file}.absent cannot be read (No such file or directory)."
    rc, result = node.mig("all-7g")
    assert rc != 0
    assert result["msg"].startswith(
        f"MIG config file {node.config_file} has no MIG config named all-7g (it has all-1g.10gb, "
    )


def test_the_roles_reset_turns_persistence_mode_off_for_the_reset_and_on_again_whatever_it_did(node, tmp_path):
    """The spec's GPUs are in persistence mode, in which a GPU is not reset; another process had NVML open when the
    MIG mode was set, so every GPU waits for its reset."""
    other = node.other_client()
    try:
        assert node.apply("all-1g.10gb")["reset_required"] == UUIDS
        # While it still has NVML open, the reset fails: persistence mode is back on all the same.
        rc, tasks = node.reset_tasks(tmp_path, UUIDS[:1])
        assert rc != 0
        assert tasks["Reset the GPUs whose MIG mode change is pending"]["failed"] is True
        assert tasks["Turn persistence mode on again where it was"]["changed"] is True
    finally:
        other.communicate(timeout=30)
    assert node.persistence_modes() == [1] * 8
    rc, tasks = node.reset_tasks(tmp_path, UUIDS[:2])
    assert rc == 0, tasks
    for name in ("Turn persistence mode off on the GPUs to reset", "Turn persistence mode on again where it was"):
        assert [item["item"] for item in tasks[name]["results"]] == UUIDS[:2], name
    assert [mode for mode, _names, _u in node.seen()] == ["enabled"] * 2 + ["disabled"] * 6
    assert node.persistence_modes() == [1] * 8
