import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.node_label_requests import FilterModule, node_label_requests

FACTS = {"source": "nvml", "gpus": [{"name": "NVIDIA H100"}]}
SYSFS = {"source": "sysfs", "gpus": []}
DEFAULTS = {
    "user_labels": {"team": "ml"},
    "taint": True,
    "taint_key": "nvidia.com/gpu",
    "taint_value": "present",
    "taint_effect": "NoSchedule",
    "delegate_to": "localhost",
    "kubeconfig": "/etc/kube/admin.conf",
    "context": "",
    "api_host": "",
    "api_key": "",
    "validate_certs": None,
}


def test_each_host_gets_its_own_facts_and_settings_and_the_defaults_fill_the_rest():
    # Plain dicts stand in for hostvars (a test double for Ansible's HostVars mapping).
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_taint": False},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_node_name": "node-2.example"},
    }
    out = node_label_requests(["gpu-1", "gpu-2"], hostvars, DEFAULTS)
    assert out["no_facts"] == []
    first, second = out["nodes"]
    assert first["name"] == "gpu-1" and first["taint"] is False and first["user_labels"] == {"team": "ml"}
    assert second["name"] == "node-2.example" and second["taint"] is True
    assert first["gpu_info"] is FACTS
    assert out["apis"] == [
        {
            **{k: DEFAULTS[k] for k in ("delegate_to", "kubeconfig", "context", "api_host", "validate_certs")},
            "api_key_sha256": "",
            "api_key_from": "",
            "k8s_options_sha256": "",
            "k8s_options_from": "",
        }
    ]


def test_the_named_discovery_wins_over_the_given_facts_unless_it_was_skipped():
    discovered = {"source": "nvml", "gpus": [{"name": "NVIDIA A100"}]}
    hostvars = {
        "gpu-1": {"gpuops_gpu_info": SYSFS, "found": discovered},
        "gpu-2": {"gpuops_gpu_info": FACTS, "found": {"skipped": True, "changed": False}},
    }
    out = node_label_requests(
        ["gpu-1", "gpu-2"], hostvars, DEFAULTS, gpu_info_var="gpuops_gpu_info", discovered_var="found"
    )
    assert [n["gpu_info"] for n in out["nodes"]] == [discovered, FACTS]
    # Without discovered_var only the facts variable is read.
    out = node_label_requests(["gpu-1", "gpu-2"], hostvars, DEFAULTS, gpu_info_var="gpuops_gpu_info")
    assert [n["gpu_info"] for n in out["nodes"]] == [SYSFS, FACTS]


def test_a_host_may_name_its_own_facts_variable():
    hostvars = {"gpu-1": {"gpu_node_labels_gpu_info_var": "my_facts", "my_facts": FACTS}}
    out = node_label_requests(["gpu-1"], hostvars, DEFAULTS)
    assert out["nodes"][0]["gpu_info"] is FACTS


def test_hosts_without_facts_are_named_and_left_out():
    hostvars = {"gpu-1": {"gpu_node_labels_gpu_info": FACTS}, "gpu-2": {}, "gpu-3": {"gpu_node_labels_gpu_info": {}}}
    out = node_label_requests(["gpu-1", "gpu-2", "gpu-3"], hostvars, DEFAULTS)
    assert [n["name"] for n in out["nodes"]] == ["gpu-1"]
    assert out["no_facts"] == ["gpu-2", "gpu-3"]


def test_hosts_with_different_api_settings_give_two_apis():
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_context": "other"},
        "gpu-3": {"gpu_node_labels_gpu_info": FACTS},
    }
    out = node_label_requests(["gpu-1", "gpu-2", "gpu-3"], hostvars, DEFAULTS)
    assert [api["context"] for api in out["apis"]] == ["", "other"]


def test_no_token_is_in_the_result_and_hosts_with_other_tokens_give_two_apis():
    """The batch becomes a fact, and a fact is in a job event whenever the task that sets it is not no_log:
    the tokens must not be in it, wherever they come from (a host's own variables or the role's value)."""
    first, second = "token-of-the-first-cluster-0123456789", "token-of-the-second-cluster-9876543210"
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_api_key": second},
        "gpu-3": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_api_key": second},
    }
    out = node_label_requests(["gpu-1", "gpu-2", "gpu-3"], hostvars, {**DEFAULTS, "api_key": first})
    assert first not in repr(out) and second not in repr(out)
    assert [(api["api_key_from"], len(api["api_key_sha256"])) for api in out["apis"]] == [("", 64), ("gpu-2", 64)]


def test_one_token_given_to_every_host_is_one_api_read_from_the_first_host():
    hostvars = {f"gpu-{i}": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_api_key": "same"} for i in (1, 2)}
    out = node_label_requests(["gpu-1", "gpu-2"], hostvars, DEFAULTS)
    assert len(out["apis"]) == 1 and out["apis"][0]["api_key_from"] == "gpu-1"
    assert "same" not in repr(out)


@pytest.mark.parametrize(
    "hosts, defaults, message",
    [
        ("gpu-1", DEFAULTS, "the input must be a list of inventory host names"),
        (["gpu-1"], [], "defaults must be a dict"),
        (["gpu-9"], DEFAULTS, "gpu-9 is not a host of the inventory"),
    ],
)
def test_bad_input_gets_one_sentence(hosts, defaults, message):
    with pytest.raises(AnsibleFilterError, match=message):
        node_label_requests(hosts, {"gpu-1": {}}, defaults)


def test_the_filter_is_registered():
    assert FilterModule().filters()["node_label_requests"] is node_label_requests


def test_sharing_follows_the_hosts_own_device_plugin_config_unless_it_sets_its_own():
    sliced = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}
    own = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}
    hostvars = {
        "plain": {"gpu_node_labels_gpu_info": FACTS},
        "sliced": {"gpu_node_labels_gpu_info": FACTS, "device_plugin_config": {"version": "v1", "sharing": sliced}},
        "both": {
            "gpu_node_labels_gpu_info": FACTS,
            "device_plugin_config": {"version": "v1", "sharing": sliced},
            "gpu_node_labels_sharing": own,
        },
        "no-sharing": {"gpu_node_labels_gpu_info": FACTS, "device_plugin_config": {"version": "v1"}},
    }
    out = node_label_requests(list(hostvars), hostvars, dict(DEFAULTS, sharing={"from": "defaults"}))
    assert [n["sharing"] for n in out["nodes"]] == [{"from": "defaults"}, sliced, own, {"from": "defaults"}]


def test_the_mig_roles_labels_join_the_user_labels_which_win():
    mig = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "pending"}
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS, "nvidia_mig_node_labels": mig},
        "gpu-2": {
            "gpu_node_labels_gpu_info": FACTS,
            "nvidia_mig_node_labels": mig,
            "gpu_node_labels_user_labels": {"nvidia.com/mig.config": "mine"},
        },
        "gpu-3": {"gpu_node_labels_gpu_info": FACTS},
    }
    first, second, third = node_label_requests(["gpu-1", "gpu-2", "gpu-3"], hostvars, DEFAULTS)["nodes"]
    assert first["user_labels"] == {**mig, "team": "ml"}
    assert second["user_labels"] == {**mig, "nvidia.com/mig.config": "mine"}
    assert third["user_labels"] == {"team": "ml"}


def test_the_mig_strategy_follows_the_hosts_own_device_plugin_config_unless_it_sets_its_own():
    hostvars = {
        "plain": {"gpu_node_labels_gpu_info": FACTS},
        "mixed": {"gpu_node_labels_gpu_info": FACTS, "device_plugin_config": {"flags": {"migStrategy": "mixed"}}},
        "both": {
            "gpu_node_labels_gpu_info": FACTS,
            "device_plugin_config": {"flags": {"migStrategy": "mixed"}},
            "gpu_node_labels_mig_strategy": "single",
        },
        "no-flag": {"gpu_node_labels_gpu_info": FACTS, "device_plugin_config": {"version": "v1", "flags": {}}},
    }
    out = node_label_requests(list(hostvars), hostvars, dict(DEFAULTS, mig_strategy="none"))
    assert [n["mig_strategy"] for n in out["nodes"]] == ["none", "mixed", "single", "none"]


MIG_LABELS = ["nvidia.com/mig.config", "nvidia.com/mig.config.state"]


def test_without_the_mig_stage_a_host_that_names_a_mig_config_keeps_its_mig_labels():
    """--tags labels: the MIG stage did not run, so it noted no labels; the node's layout is still its config's."""
    mig = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}
    hostvars = {
        "ran": {"gpu_node_labels_gpu_info": FACTS, "gpu_mig_config": "all-1g.10gb", "nvidia_mig_node_labels": mig},
        "named": {"gpu_node_labels_gpu_info": FACTS, "gpu_mig_config": "all-1g.10gb"},
        "role-var": {"gpu_node_labels_gpu_info": FACTS, "nvidia_mig_config_name": "all-balanced"},
        # The role's own variable decides over the user's: empty means no MIG config.
        "role-var-empty": {
            "gpu_node_labels_gpu_info": FACTS,
            "nvidia_mig_config_name": "",
            "gpu_mig_config": "all-1g.10gb",
        },
        "none": {"gpu_node_labels_gpu_info": FACTS},
        "empty": {"gpu_node_labels_gpu_info": FACTS, "gpu_mig_config": ""},
    }
    nodes = node_label_requests(list(hostvars), hostvars, DEFAULTS)["nodes"]
    assert {n["name"]: n.get("keep_labels") for n in nodes} == {
        "ran": None,
        "named": MIG_LABELS,
        "role-var": MIG_LABELS,
        "role-var-empty": None,
        "none": None,
        "empty": None,
    }
    # Where the stage ran, its labels are what the node gets.
    assert nodes[0]["user_labels"] == {**mig, "team": "ml"}


def test_a_mig_config_the_play_names_applies_to_hosts_without_their_own():
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS, "gpu_mig_config": ""},
    }
    nodes = node_label_requests(list(hostvars), hostvars, dict(DEFAULTS, mig_config="all-1g.10gb"))["nodes"]
    assert [n.get("keep_labels") for n in nodes] == [MIG_LABELS, None]


def test_the_callers_own_settings_are_not_the_defaults_of_the_other_hosts():
    """The step runs on the batch's first host, where the defaults it passes hold that host's own inventory values:
    the hosts without their own get the role's defaults for those."""
    role_defaults = {f"gpu_node_labels_{name}": value for name, value in DEFAULTS.items()}
    role_defaults["gpu_node_labels_user_labels"] = {}
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_user_labels": {"rack": "r1"}},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS},
    }
    seen_on_first = dict(DEFAULTS, user_labels={"rack": "r1"})
    first, second = node_label_requests(
        ["gpu-1", "gpu-2"], hostvars, seen_on_first, caller="gpu-1", role_defaults=role_defaults
    )["nodes"]
    assert first["user_labels"] == {"rack": "r1"} and second["user_labels"] == {}
    # Without the caller, the values it passes are everyone's (play variables: the same on every host).
    _first, second = node_label_requests(["gpu-1", "gpu-2"], hostvars, seen_on_first)["nodes"]
    assert second["user_labels"] == {"rack": "r1"}
    with pytest.raises(AnsibleFilterError, match="role_defaults has no gpu_node_labels_user_labels"):
        node_label_requests(["gpu-1"], hostvars, seen_on_first, caller="gpu-1", role_defaults={})


def test_the_rest_of_the_connection_is_told_apart_by_its_hash_and_read_from_the_host_that_set_it():
    """gpu_node_labels_k8s_options may hold credentials: the result names the host and a hash, never the options."""
    options = {"proxy": "http://proxy.example:3128", "password": "s3cret"}
    hostvars = {
        "gpu-1": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_k8s_options": options},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS, "gpu_node_labels_k8s_options": dict(options)},
    }
    out = node_label_requests(["gpu-1", "gpu-2"], hostvars, dict(DEFAULTS, k8s_options={}))
    (api,) = out["apis"]
    assert api["k8s_options_from"] == "gpu-1" and len(api["k8s_options_sha256"]) == 64
    assert "s3cret" not in repr(out)
    hostvars["gpu-2"]["gpu_node_labels_k8s_options"] = {"proxy": "http://other.example:3128"}
    assert len(node_label_requests(["gpu-1", "gpu-2"], hostvars, dict(DEFAULTS, k8s_options={}))["apis"]) == 2
    hostvars["gpu-2"]["gpu_node_labels_k8s_options"] = "http://proxy.example:3128"
    with pytest.raises(AnsibleFilterError, match="gpu-2's gpu_node_labels_k8s_options must be a dict"):
        node_label_requests(["gpu-1", "gpu-2"], hostvars, dict(DEFAULTS, k8s_options={}))


def test_a_host_that_leaves_needs_no_facts_and_asks_for_absent():
    hostvars = {
        "gpu-1": {"gpu_node_labels_state": "absent", "gpu_node_labels_node_name": "node-1.example"},
        "gpu-2": {"gpu_node_labels_gpu_info": FACTS},
        "gpu-3": {},
    }
    out = node_label_requests(list(hostvars), hostvars, DEFAULTS)
    assert out["nodes"][0] == {"name": "node-1.example", "state": "absent"}
    assert out["nodes"][1]["gpu_info"] is FACTS and "state" not in out["nodes"][1]
    assert out["no_facts"] == ["gpu-3"]
    assert len(out["apis"]) == 1
    # The play's state is every host's that does not set its own.
    out = node_label_requests(list(hostvars), hostvars, dict(DEFAULTS, state="absent"))
    assert [n["state"] for n in out["nodes"]] == ["absent", "absent", "absent"] and out["no_facts"] == []
    # A host's own state is its own, not the batch's, where the caller passes its values.
    role_defaults = {f"gpu_node_labels_{name}": value for name, value in DEFAULTS.items()}
    role_defaults["gpu_node_labels_state"] = "present"
    out = node_label_requests(
        ["gpu-1", "gpu-2"], hostvars, dict(DEFAULTS, state="absent"), caller="gpu-1", role_defaults=role_defaults
    )
    assert [n.get("state") for n in out["nodes"]] == ["absent", None]
    with pytest.raises(AnsibleFilterError, match="gpu-1's gpu_node_labels_state must be present or absent"):
        node_label_requests(["gpu-1"], {"gpu-1": {"gpu_node_labels_state": "gone"}}, DEFAULTS)
