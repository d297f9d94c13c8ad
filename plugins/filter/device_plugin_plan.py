# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: device_plugin_plan
short_description: The device_plugin role's state machine, from what a node records to the steps that move it
version_added: 0.1.0
description:
  - Takes what the C(device_plugin) role found on a node (its records and its systemd deployment) and what the role
    is asked for, and returns the node's current state, the wanted state, the transition between them and the ordered
    steps (the role's task files) that make the move. A node already in the wanted state gets no steps, except the
    C(daemonset) step in daemonset deployment, which keeps the cluster's objects in shape through the API.
  - A state has two parts. The B(deployment) says how the daemon runs (C(systemd) or C(daemonset); C(none) when the
    node has neither). The B(allocation) says how the node's GPUs reach pods (C(device_plugin) or C(dra);
    C(unrecorded) when the node has no allocation record, as after a release that wrote none). A state is written
    C(deployment.allocation), for example C(systemd.device_plugin) or C(daemonset.dra).
  - The records on the node keep the names older releases gave them, so a node converged by one of those moves with
    no change. The allocation record is the file C(allocation-mode) (C(device_plugin) or C(dra)). The daemonset
    record is the file C(device-plugin-daemonset.json), whose C(allocation_mode) key is C(dra) on a node of the DRA
    driver's DaemonSet and missing on one of the device plugin's.
options:
  _input:
    description:
      - What the role read on the node.
      - C(allocation_record) is the text of the allocation record, or null where there is none.
      - C(daemonset_record) is the text of the daemonset record, or null where there is none.
      - C(systemd_files) says whether the systemd deployment's unit, config or install directory is on the node.
      - C(systemd_lacks) says whether the systemd deployment lacks anything the role would write (packages,
        directories, the daemon, its config or unit, a running service); it is read only for a wanted systemd
        deployment.
      - C(record_dir_ready) says whether the directory of the records, and the allocation record where there is one,
        are there as the role writes them (type, owner and mode).
    type: dict
    required: true
  deployment:
    description: The wanted deployment (the role's C(device_plugin_mode)).
    type: str
    choices: [systemd, daemonset]
    required: true
  allocation:
    description: The wanted allocation (the role's C(device_plugin_allocation_mode)).
    type: str
    choices: [device_plugin, dra]
    required: true
  state:
    description: The role's C(device_plugin_state).
    type: str
    choices: [started, absent]
    default: started
"""

EXAMPLES = r"""
- name: Plan the node's transition
  ansible.builtin.set_fact:
    device_plugin_plan: >-
      {{ {'allocation_record': 'device_plugin\n', 'daemonset_record': none, 'systemd_files': true,
          'systemd_lacks': false, 'record_dir_ready': true}
         | gpuops.k8s.device_plugin_plan('systemd', 'dra') }}
# device_plugin_plan.transition is "systemd.device_plugin -> systemd.dra", and device_plugin_plan.steps is
# [allocation_switch, systemd_install, allocation_record].
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    current:
      description: The node's state as its records say (C(deployment), C(allocation), C(name)).
      type: dict
    wanted:
      description: >-
        The wanted state (C(deployment), C(allocation), C(state), C(name)); its name is C(absent) for state
        absent.
      type: dict
    transition:
      description: The current state's name, an arrow and the wanted state's name.
      type: str
    steps:
      description: The role's task files to run, in this order (see STEPS).
      type: list
      elements: str
"""

from ansible.errors import AnsibleFilterError

DEPLOYMENTS = ("systemd", "daemonset")
ALLOCATIONS = ("device_plugin", "dra")
STATES = ("started", "absent")
OBSERVED = ("allocation_record", "daemonset_record", "systemd_files", "systemd_lacks", "record_dir_ready")

# The steps in the order they run; each is a task file of the role. A step runs when its rule holds:
#   allocation_switch  started, and the recorded allocation is dra where dra is not wanted or the other way round:
#                      stop the current deployment's allocator and wait until the node is free for the other one
#   daemonset_leave    systemd wanted, and the node has a daemonset record: leave that DaemonSet first
#   systemd_remove     the node has systemd files, and daemonset or absent is wanted
#   systemd_install    systemd started wanted, and the systemd deployment lacks something or the switch stopped it
#   daemonset          daemonset wanted (every run: the objects and the node's label are kept through the API)
#   allocation_record  the allocation record is not what is wanted (absent: there is one to forget)
STEPS = ("allocation_switch", "daemonset_leave", "systemd_remove", "systemd_install", "daemonset", "allocation_record")


def _recorded_allocation(record):
    text = (record or "").strip()
    return text if text in ALLOCATIONS else "unrecorded"


def _current(observed):
    if observed["daemonset_record"] is not None:
        deployment = "daemonset"
    elif observed["systemd_files"]:
        deployment = "systemd"
    else:
        deployment = "none"
    allocation = _recorded_allocation(observed["allocation_record"])
    return {"deployment": deployment, "allocation": allocation, "name": f"{deployment}.{allocation}"}


def _check(observed, deployment, allocation, state):
    if not isinstance(observed, dict):
        raise AnsibleFilterError("device_plugin_plan: the input must be a dict of what the role read on the node.")
    missing = [key for key in OBSERVED if key not in observed]
    if missing:
        raise AnsibleFilterError(f"device_plugin_plan: the input lacks {', '.join(missing)}.")
    for name, value, choices in (
        ("deployment", deployment, DEPLOYMENTS),
        ("allocation", allocation, ALLOCATIONS),
        ("state", state, STATES),
    ):
        if value not in choices:
            raise AnsibleFilterError(
                f"device_plugin_plan: {name} is {value!r}; it must be one of {', '.join(choices)}."
            )
    for key in ("allocation_record", "daemonset_record"):
        if observed[key] is not None and not isinstance(observed[key], str):
            raise AnsibleFilterError(f"device_plugin_plan: {key} must be the record's text or null.")


def device_plugin_plan(observed, deployment, allocation, state="started"):
    _check(observed, deployment, allocation, state)
    current = _current(observed)
    started = state == "started"
    wanted = {
        "deployment": deployment,
        "allocation": allocation,
        "state": state,
        "name": f"{deployment}.{allocation}" if started else "absent",
    }
    rules = {
        "allocation_switch": started and (current["allocation"] == "dra") != (allocation == "dra"),
        "daemonset_leave": deployment == "systemd" and observed["daemonset_record"] is not None,
        "systemd_remove": bool(observed["systemd_files"]) and (deployment == "daemonset" or not started),
        "daemonset": deployment == "daemonset",
        "allocation_record": (
            observed["allocation_record"] != allocation + "\n" or not observed["record_dir_ready"]
            if started
            else observed["allocation_record"] is not None
        ),
    }
    rules["systemd_install"] = (
        deployment == "systemd" and started and (bool(observed["systemd_lacks"]) or rules["allocation_switch"])
    )
    return {
        "current": current,
        "wanted": wanted,
        "transition": f"{current['name']} -> {wanted['name']}",
        "steps": [step for step in STEPS if rules[step]],
    }


class FilterModule:
    def filters(self):
        return {"device_plugin_plan": device_plugin_plan}
