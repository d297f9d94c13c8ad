#!/usr/bin/python
# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
module: node_remediation
short_description: Put a Kubernetes Node under GPU remediation (cordon, taint, annotation) or give it back
version_added: 0.1.0
description:
  - With O(state=present) the Node is cordoned, carries the taint C(nvidia.com/gpu-remediation=<class>:NoSchedule)
    and the annotation C(gpuops.k8s/gpu-remediation), a JSON object with the class, since when, the GPUs, the reason
    and whether the node was cordoned before. A Node under remediation of a lower class is raised to
    O(remediation_class) (the taint's value changes, the annotation records the C(previous_class)); one of the same
    class keeps its annotation and gains the GPUs it did not list.
  - With O(state=absent) the taint and the annotation are removed and the node is uncordoned, unless it was
    cordoned before the remediation began (or carries no annotation that says who cordoned it), in which case the
    cordon stays. Only the taint value the remediation set is removed (O(remediation_class), else the annotation's
    class); a taint someone raised, to C(replace) for instance, stays with the annotation and the cordon. Only a
    cordon this module made is lifted, where the API server's C(managedFields) name its field manager
    C(gpuops.k8s-node-remediation) as the last to set C(spec.unschedulable), so a cordon a person set again meanwhile
    stays.
  - The circuit breaker. With O(max_nodes), a Node that does not carry the taint yet is tainted only if fewer than
    O(max_nodes) Nodes of the cluster carry it, counted from the API server while this run holds the
    C(coordination.k8s.io/v1) Lease O(lease_namespace)/O(lease_name) (holder O(run_id), expiry O(lease_seconds)); else
    it is left untouched and RV(decision) is C(waiting). Overlapping runs take the Lease in turn, so the count and the
    taint are one step across all of them. A run that finds, when it gives the Lease up, that the Lease expired and was
    taken meanwhile counts again and backs its taint out if the limit is exceeded.
  - A run holds its Node. With O(run_id) the annotation names the run and, with O(hold_seconds), until when it holds
    the Node (C(held_until)); another run writes nothing to the Node until then (RV(decision) C(held)), and a run
    renews its hold at each step. O(hold_seconds=0) lets go of the Node, keeping the taint.
  - O(state=present) never lowers the taint's class; a Node whose taint is above O(remediation_class) keeps it and
    RV(decision) is C(raised).
  - The three are written with one JSON merge patch that carries the C(resourceVersion) it was computed from, so
    the API server refuses it when someone else wrote the Node in between; the module then reads the Node again
    and writes again (up to O(conflict_retries) times), and no taint or cordon written meanwhile is lost.
  - The taint marks the node for the circuit breaker of C(playbooks/remediate.yml), where every Node carrying it holds
    one remediation slot (P(gpuops.k8s.remediation_plan#filter)).
  - Credentials as M(kubernetes.core.k8s) takes them, including its C(K8S_AUTH_*) environment variables.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  name:
    description: The Node's name.
    type: str
    required: true
  state:
    description: Whether the Node is under remediation (C(present)) or given back (C(absent)).
    type: str
    choices: [present, absent]
    default: present
  remediation_class:
    description:
      - The remediation class, the taint's value. Required with O(state=present).
    type: str
    choices: [reset, reboot, replace]
  gpus:
    description: The UUIDs of the GPUs under remediation, for the annotation.
    type: list
    elements: str
    default: []
  reason:
    description: Why, one sentence for the annotation (kept while the class stays the same).
    type: str
    default: ""
  now:
    description: The time the remediation begins, ISO 8601 (the control host's clock); empty takes the module's.
    type: str
    default: ""
  conflict_retries:
    description: How many times a write refused because the Node changed is redone from a fresh read.
    type: int
    default: 5
  max_nodes:
    description:
      - With O(state=present), the circuit breaker's limit, a count of Nodes (the plan's C(limit)). Unset, the Node
        is tainted without counting.
    type: int
  run_id:
    description: The identity of the run, recorded as the holder of the Lease and of the Node. Empty records none.
    type: str
    default: ""
  hold_seconds:
    description: How long from now the run holds the Node (with O(run_id)); C(0) lets go of it.
    type: int
    default: 0
  lease_name:
    description: The name of the circuit breaker's Lease.
    type: str
    default: gpuops-k8s-gpu-remediation
  lease_namespace:
    description:
      - The namespace of the circuit breaker's Lease; the controller's credentials need get, create and update on
        Leases there.
    type: str
    default: kube-system
  lease_seconds:
    description: How long the Lease is held at most; a run killed while holding it blocks the others this long.
    type: int
    default: 30
  lease_wait:
    description: How long to wait for another run to give the Lease up before failing, in seconds.
    type: int
    default: 60
extends_documentation_fragment:
  - gpuops.k8s.k8s_connection
attributes:
  check_mode:
    support: full
    description: Reads the Node and computes the change without writing it.
  diff_mode:
    support: full
    description: Returns the cordon, the taint and the annotation before and after.
"""

EXAMPLES = r"""
- name: Take the node out for a GPU reset
  gpuops.k8s.node_remediation:
    name: gpu-node-7
    remediation_class: reset
    gpus: [GPU-6f1c0a3e-0000-4000-8000-000000000002]
    reason: "XID 48 (double bit ECC error): catalog WORKFLOW_XID_48"
  delegate_to: localhost

- name: Give it back once its GPUs are healthy again
  gpuops.k8s.node_remediation:
    name: gpu-node-7
    state: absent
  delegate_to: localhost

- name: Take the node out within the circuit breaker, held by this run for an hour
  gpuops.k8s.node_remediation:
    name: gpu-node-7
    remediation_class: reboot
    max_nodes: 1
    run_id: awx-job-4711
    hold_seconds: 3600
  register: taken
  delegate_to: localhost
"""

RETURN = r"""
before:
  description: The Node's cordon (C(unschedulable)), remediation C(taint) and C(annotation) before the module ran.
  returned: always
  type: dict
  sample: {unschedulable: false, taint: null, annotation: null}
after:
  description: The same after it (in check mode, what they would be).
  returned: always
  type: dict
  sample:
    unschedulable: true
    taint: {key: nvidia.com/gpu-remediation, value: reset, effect: NoSchedule}
    annotation:
      class: reset
      since: "2026-11-26T09:00:00Z"
      gpus: [GPU-6f1c0a3e-0000-4000-8000-000000000002]
      reason: XID 48
      cordoned_before: false
patch:
  description: The JSON merge patch written (in check mode, that would be written); empty when nothing changed.
  returned: always
  type: dict
conflicts:
  description: How many writes the API server refused because the Node had changed, each redone from a fresh read.
  returned: always
  type: int
decision:
  description:
    - C(written) (the Node is as asked, changed or not), C(waiting) (the breaker is full; nothing written),
      C(held) (another run holds the Node; nothing written), C(raised) (the taint is above the class asked for; kept),
      C(kept) (state absent, the taint is not the one the remediation set; it stays with the cordon).
  returned: always
  type: str
  sample: written
message:
  description: One sentence on a decision other than C(written); empty otherwise.
  returned: always
  type: str
counted:
  description: With O(max_nodes), the other Nodes under remediation counted while the Lease was held.
  returned: when counted
  type: int
"""

import datetime
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_connection import CONNECTION_ARGUMENT_SPEC, api_client
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import api_error as _api_error
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._node_remediation import (
    RemediationApi,
    RemediationError,
    claim,
    iso,
    view,
    write,
)

try:
    from kubernetes import config as k8s_config
    from kubernetes.dynamic.exceptions import DynamicApiError
    from urllib3 import exceptions as urllib3_exceptions

    KUBERNETES_IMPORT_ERROR = None
    # What each way of failing raises: the client's setup, the API server's answer, the connection.
    SETUP_ERRORS = (k8s_config.ConfigException, OSError)
    API_ERRORS = (DynamicApiError,)
    CONNECTION_ERRORS = (urllib3_exceptions.HTTPError,)
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()
    SETUP_ERRORS, API_ERRORS, CONNECTION_ERRORS = (OSError,), (), ()

ARGUMENT_SPEC = {
    "name": {"type": "str", "required": True},
    "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
    "remediation_class": {"type": "str", "choices": ["reset", "reboot", "replace"]},
    "gpus": {"type": "list", "elements": "str", "default": []},
    "reason": {"type": "str", "default": ""},
    "now": {"type": "str", "default": ""},
    "conflict_retries": {"type": "int", "default": 5},
    "max_nodes": {"type": "int"},
    "run_id": {"type": "str", "default": ""},
    "hold_seconds": {"type": "int", "default": 0},
    "lease_name": {"type": "str", "default": "gpuops-k8s-gpu-remediation"},
    "lease_namespace": {"type": "str", "default": "kube-system"},
    "lease_seconds": {"type": "int", "default": 30},
    "lease_wait": {"type": "int", "default": 60},
    **CONNECTION_ARGUMENT_SPEC,
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC, supports_check_mode=True, required_if=[("state", "present", ["remediation_class"])]
    )
    run_or_fail(module, "node_remediation", run_module)


def run_module(module):
    if KUBERNETES_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    for option in ("conflict_retries", "max_nodes", "hold_seconds", "lease_wait"):
        if params[option] is not None and params[option] < 0:
            module.fail_json(msg=f"node_remediation: {option} must be 0 or more, got {params[option]}.")
    if params["lease_seconds"] < 1:
        module.fail_json(msg=f"node_remediation: lease_seconds must be 1 or more, got {params['lease_seconds']}.")
    moment = datetime.datetime.now(datetime.timezone.utc)
    now = params["now"] or iso(moment)
    held_until = iso(moment + datetime.timedelta(seconds=params["hold_seconds"])) if params["hold_seconds"] else ""
    common = dict(
        gpus=params["gpus"],
        reason=params["reason"],
        now=now,
        check_mode=module.check_mode,
        retries=params["conflict_retries"],
        run_id=params["run_id"],
        held_until=held_until,
        moment=moment,
    )
    try:
        api = RemediationApi(api_client(params), params["lease_name"], params["lease_namespace"])
        if params["state"] == "present" and params["max_nodes"] is not None:
            outcome = claim(
                api,
                params["name"],
                params["remediation_class"],
                params["max_nodes"],
                lease_seconds=params["lease_seconds"],
                lease_wait=params["lease_wait"],
                **common,
            )
        else:
            outcome = write(api, params["name"], params["state"], params["remediation_class"], **common)
    except RemediationError as error:
        module.fail_json(msg=str(error))
    except SETUP_ERRORS as error:
        module.fail_json(msg=f"node_remediation: cannot set up the Kubernetes client: {error}")
    except API_ERRORS as error:
        module.fail_json(msg=f"node_remediation: the Kubernetes API refused a request: {_api_error(error)}")
    except CONNECTION_ERRORS as error:  # no connection, TLS, retries exhausted
        module.fail_json(msg=f"node_remediation: cannot reach the Kubernetes API: {error}")
    patch = outcome["patch"]
    result = {
        "changed": bool(patch),
        "before": view(outcome["before"]),
        "after": view(outcome["after"]),
        "patch": patch,
        "conflicts": outcome["conflicts"],
        "decision": outcome["decision"],
        "message": outcome["message"],
    }
    if "counted" in outcome:
        result["counted"] = outcome["counted"]
    if module._diff and patch:
        result["diff"] = {"before": result["before"], "after": result["after"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
