"""The device_plugin role's plan: every state a node can record against every wanted state."""

import itertools
import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.device_plugin_plan import STEPS, FilterModule, device_plugin_plan

DP_RECORD = json.dumps({"namespace": "gpuops-system", "daemonset": "gpuops-device-plugin"}, indent=2) + "\n"
DRA_RECORD = (
    json.dumps({"namespace": "gpuops-system", "daemonset": "gpuops-dra-plugin", "allocation_mode": "dra"}, indent=2)
    + "\n"
)


def _node(deployment, allocation):
    """What the role reads on a node it converged to deployment.allocation (none: nothing of the role's there;
    unrecorded: no allocation record, as a release before the record left it)."""
    daemonset = deployment == "daemonset"
    return {
        "allocation_record": None if allocation == "unrecorded" else allocation + "\n",
        "daemonset_record": (DRA_RECORD if allocation == "dra" else DP_RECORD) if daemonset else None,
        "systemd_files": deployment == "systemd",
        "systemd_lacks": deployment != "systemd",
        "record_dir_ready": deployment != "none" or allocation != "unrecorded",
    }


CURRENT = list(itertools.product(["none", "systemd", "daemonset"], ["unrecorded", "device_plugin", "dra"]))
WANTED = [(d, a, "started") for d in ("systemd", "daemonset") for a in ("device_plugin", "dra")] + [
    (d, "device_plugin", "absent") for d in ("systemd", "daemonset")
]


def _run(observed, steps, deployment, allocation, state):
    """What each step leaves on the node (a model of the role's task files' effect on what the plan reads)."""
    node = dict(observed)
    for step in steps:
        if step == "daemonset_leave":
            node["daemonset_record"] = None
        elif step == "systemd_remove":
            node.update(systemd_files=False, systemd_lacks=True)
        elif step == "systemd_install":
            node.update(systemd_files=True, systemd_lacks=False)
        elif step == "daemonset":
            node["daemonset_record"] = None if state == "absent" else (DRA_RECORD if allocation == "dra" else DP_RECORD)
        elif step == "allocation_record":
            node.update(allocation_record=None if state == "absent" else allocation + "\n", record_dir_ready=True)
    return node


@pytest.mark.parametrize("current", CURRENT, ids=".".join)
@pytest.mark.parametrize("wanted", WANTED, ids=".".join)
def test_every_state_reaches_every_wanted_state_in_one_run_and_the_next_run_plans_nothing(current, wanted):
    observed = _node(*current)
    plan = device_plugin_plan(observed, *wanted)
    assert plan["current"]["name"] == ".".join(current)
    assert plan["transition"] == f"{'.'.join(current)} -> {plan['wanted']['name']}"
    assert plan["steps"] == [step for step in STEPS if step in plan["steps"]], "steps out of order"

    after = _run(observed, plan["steps"], *wanted)
    again = device_plugin_plan(after, *wanted)
    deployment, allocation, state = wanted
    # Daemonset deployment keeps its objects through the API on every run; nothing else runs twice.
    assert again["steps"] == (["daemonset"] if deployment == "daemonset" else [])
    if state == "absent":
        assert after["allocation_record"] is None and after["daemonset_record"] is None and not after["systemd_files"]
    else:
        assert again["current"]["name"] == again["wanted"]["name"] == f"{deployment}.{allocation}"
    # Never two deployments on a node: the one that goes comes before the one that comes.
    steps = plan["steps"]
    if "systemd_install" in steps and "daemonset_leave" in steps:
        assert steps.index("daemonset_leave") < steps.index("systemd_install")
    if "daemonset" in steps and "systemd_remove" in steps:
        assert steps.index("systemd_remove") < steps.index("daemonset")


@pytest.mark.parametrize("current", CURRENT, ids=".".join)
@pytest.mark.parametrize("wanted", WANTED, ids=".".join)
def test_the_allocation_switch_runs_exactly_when_a_started_node_changes_between_dra_and_not_dra(current, wanted):
    plan = device_plugin_plan(_node(*current), *wanted)
    moves = wanted[2] == "started" and (current[1] == "dra") != (wanted[1] == "dra")
    assert ("allocation_switch" in plan["steps"]) is moves
    if moves and wanted[0] == "systemd":
        assert "systemd_install" in plan["steps"], "the switch stops the service: the install starts it again"


# The transitions a reader meets first, written out: "current -> wanted", and the deployment asked for absent.
@pytest.mark.parametrize(
    ("transition", "steps", "absent_deployment"),
    [
        ("none.unrecorded -> systemd.device_plugin", ["systemd_install", "allocation_record"], None),
        ("none.unrecorded -> systemd.dra", ["allocation_switch", "systemd_install", "allocation_record"], None),
        ("systemd.device_plugin -> systemd.device_plugin", [], None),
        ("systemd.unrecorded -> systemd.device_plugin", ["allocation_record"], None),
        ("systemd.device_plugin -> systemd.dra", ["allocation_switch", "systemd_install", "allocation_record"], None),
        ("systemd.dra -> daemonset.dra", ["systemd_remove", "daemonset"], None),
        (
            "systemd.device_plugin -> daemonset.dra",
            ["allocation_switch", "systemd_remove", "daemonset", "allocation_record"],
            None,
        ),
        ("daemonset.dra -> daemonset.dra", ["daemonset"], None),
        ("daemonset.dra -> daemonset.device_plugin", ["allocation_switch", "daemonset", "allocation_record"], None),
        ("daemonset.device_plugin -> systemd.device_plugin", ["daemonset_leave", "systemd_install"], None),
        ("daemonset.dra -> absent", ["daemonset_leave", "allocation_record"], "systemd"),
        ("systemd.dra -> absent", ["systemd_remove", "allocation_record"], "systemd"),
        ("daemonset.device_plugin -> absent", ["daemonset", "allocation_record"], "daemonset"),
        ("none.unrecorded -> absent", [], "systemd"),
    ],
)
def test_named_transitions(transition, steps, absent_deployment):
    current, wanted = transition.split(" -> ")
    args = (absent_deployment, "device_plugin", "absent") if absent_deployment else (*wanted.split("."), "started")
    plan = device_plugin_plan(_node(*current.split(".")), *args)
    assert (plan["transition"], plan["steps"]) == (transition, steps)


def test_a_converged_systemd_node_that_lacks_something_installs_only_that():
    observed = dict(_node("systemd", "device_plugin"), systemd_lacks=True)
    assert device_plugin_plan(observed, "systemd", "device_plugin")["steps"] == ["systemd_install"]


def test_a_record_directory_that_is_not_as_the_role_makes_it_is_written_again():
    observed = dict(_node("systemd", "device_plugin"), record_dir_ready=False)
    assert device_plugin_plan(observed, "systemd", "device_plugin")["steps"] == ["allocation_record"]


def test_an_allocation_record_with_other_text_is_unrecorded_and_is_written_again():
    observed = dict(_node("systemd", "device_plugin"), allocation_record="gpu\n")
    plan = device_plugin_plan(observed, "systemd", "device_plugin")
    assert plan["current"]["name"] == "systemd.unrecorded"
    assert plan["steps"] == ["allocation_record"]


def test_a_record_without_its_newline_is_read_but_written_again():
    """Older releases and the role write the value and a newline; the text is compared as written."""
    observed = dict(_node("systemd", "dra"), allocation_record="dra")
    plan = device_plugin_plan(observed, "systemd", "dra")
    assert plan["current"]["name"] == "systemd.dra"
    assert plan["steps"] == ["allocation_record"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nonsense", "systemd", "dra"), "the input must be a dict of what the role read on the node."),
        (({"allocation_record": None}, "systemd", "dra"), "the input lacks daemonset_record, systemd_files"),
        ((_node("none", "unrecorded"), "podman", "dra"), "deployment is 'podman'; it must be one of systemd"),
        ((_node("none", "unrecorded"), "systemd", "mig"), "allocation is 'mig'; it must be one of device_plugin, dra."),
        ((_node("none", "unrecorded"), "systemd", "dra", "stopped"), "state is 'stopped'; it must be one of started"),
        ((dict(_node("none", "unrecorded"), allocation_record=3), "systemd", "dra"), "allocation_record must be"),
    ],
)
def test_bad_input_is_one_sentence(args, message):
    with pytest.raises(AnsibleFilterError) as error:
        device_plugin_plan(*args)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_filter_is_registered():
    assert FilterModule().filters() == {"device_plugin_plan": device_plugin_plan}
