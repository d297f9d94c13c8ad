import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.nvidia_runtime_plan import FilterModule, nvidia_runtime_plan

# The role's tables (roles/nvidia_runtime/vars/main.yml).
KNOWN = ["containerd", "docker", "crio"]
BINARIES = {"containerd": "containerd", "docker": "dockerd", "crio": "crio", "k3s": "k3s", "rke2": "rke2"}
UNITS = {
    "containerd": ["containerd"],
    "docker": ["docker"],
    "crio": ["crio"],
    "k3s": ["k3s", "k3s-agent"],
    "rke2": ["rke2-server", "rke2-agent"],
}
SERVICES = {"containerd": "containerd", "docker": "docker", "crio": "crio"}
ALL_UNITS = [unit for names in UNITS.values() for unit in names]


def node_state(binaries=(), units=None):
    """A node_state result: the binaries that exist (in /usr/bin), units name -> (load_state, active_state)."""
    paths = {f"/usr/{d}/{b}": {"type": "absent"} for d in ("bin", "local/bin") for b in BINARIES.values()}
    paths["/etc/containerd/config.toml"] = {"type": "absent"}
    for binary in binaries:
        paths[f"/usr/bin/{binary}"] = {"type": "file"}
    known = units or {}
    return {
        "paths": paths,
        "units": {
            f"{unit}.service": {
                "load_state": known.get(unit, ("not-found", "inactive"))[0],
                "active_state": known.get(unit, ("not-found", "inactive"))[1],
                "unit_file_state": "",
            }
            for unit in ALL_UNITS
        },
    }


def plan(node, **options):
    return nvidia_runtime_plan(node, known_engines=KNOWN, binaries=BINARIES, units=UNITS, services=SERVICES, **options)


def test_a_runtime_is_found_by_its_binary_or_its_unit_in_the_roles_order():
    # crio only by its unit (a binary elsewhere), containerd only by its binary.
    found = plan(node_state(binaries=["containerd"], units={"crio": ("loaded", "active")}))
    assert found["detected"] == ["containerd", "crio"]
    assert found["selected"] == ["containerd", "crio"]
    assert found["rancher"] == ""
    assert found["containerd_how"] == "auto"


def test_units_systemd_does_not_know_do_not_count_and_known_ones_do_even_when_stopped():
    assert plan(node_state(units={"docker": ("not-found", "inactive")}))["detected"] == []
    stopped = plan(node_state(units={"docker": ("loaded", "inactive")}))
    assert stopped["detected"] == ["docker"]
    assert stopped["service_state"]["docker"] == "inactive"
    assert stopped["active_units"] == []


def test_the_service_state_and_the_active_units_come_from_the_units():
    found = plan(node_state(units={"containerd": ("loaded", "active"), "docker": ("loaded", "failed")}))
    assert found["service_state"] == {"containerd": "active", "docker": "failed", "crio": "inactive"}
    assert found["active_units"] == ["containerd"]


def test_k3s_brings_containerd_and_containerd_is_configured_through_it():
    found = plan(node_state(binaries=["k3s"], units={"k3s-agent": ("loaded", "active")}))
    assert found["detected"] == ["containerd"]
    assert (found["rancher"], found["found_rancher"], found["containerd_how"]) == ("k3s", ["k3s"], "k3s")
    assert found["active_units"] == ["k3s-agent"]


def test_rke2_is_found_by_its_server_unit_alone():
    found = plan(node_state(units={"rke2-server": ("loaded", "active")}))
    assert (found["detected"], found["rancher"], found["containerd_how"]) == (["containerd"], "rke2", "rke2")


def test_with_both_k3s_and_rke2_rke2_comes_first_and_both_are_named():
    found = plan(node_state(binaries=["k3s", "rke2"]))
    assert (found["rancher"], found["found_rancher"]) == ("rke2", ["rke2", "k3s"])


def test_a_containerd_mode_other_than_auto_wins_over_k3s():
    assert plan(node_state(binaries=["k3s"]), containerd_mode="drop_in")["containerd_how"] == "drop_in"
    assert plan(node_state(binaries=["containerd"]), containerd_mode="file")["containerd_how"] == "file"


def test_a_list_of_engines_is_selected_as_given_and_detection_is_still_reported():
    found = plan(node_state(binaries=["dockerd"]), engines=["crio"])
    assert (found["detected"], found["selected"]) == (["docker"], ["crio"])


def test_nothing_found_selects_nothing():
    found = plan(node_state())
    assert (found["detected"], found["selected"], found["found_rancher"]) == ([], [], [])


def test_a_binary_is_recognised_in_any_directory_read():
    node = node_state()
    node["paths"]["/usr/local/bin/crio"] = {"type": "link"}
    assert plan(node)["detected"] == ["crio"]


@pytest.mark.parametrize("node", [None, [], {"paths": {}}, {"units": {}}, {"paths": [], "units": {}}])
def test_an_input_that_is_not_a_node_state_result_is_one_sentence(node):
    with pytest.raises(AnsibleFilterError, match=r"^nvidia_runtime_plan: the input must be a gpuops.k8s.node_state"):
        plan(node)


def test_a_table_that_is_not_a_dict_is_one_sentence():
    with pytest.raises(AnsibleFilterError, match="units must be a dict keyed by runtime"):
        nvidia_runtime_plan(node_state(), known_engines=KNOWN, binaries=BINARIES, units=[], services=SERVICES)


def test_the_filter_is_registered():
    assert FilterModule().filters()["nvidia_runtime_plan"] is nvidia_runtime_plan
