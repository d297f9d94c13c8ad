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
    cordon stays.
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
"""

import datetime
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_connection import CONNECTION_ARGUMENT_SPEC, api_client
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import NodeApi
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import api_error as _api_error
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._node_remediation import (
    RemediationError,
    set_remediation,
    view,
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
    if params["conflict_retries"] < 0:
        module.fail_json(msg=f"node_remediation: conflict_retries must be 0 or more, got {params['conflict_retries']}.")
    now = params["now"] or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        patch, before, after, conflicts = set_remediation(
            NodeApi(api_client(params)),
            params["name"],
            params["state"],
            klass=params["remediation_class"],
            gpus=params["gpus"],
            reason=params["reason"],
            now=now,
            check_mode=module.check_mode,
            retries=params["conflict_retries"],
        )
    except RemediationError as error:
        module.fail_json(msg=str(error))
    except SETUP_ERRORS as error:
        module.fail_json(msg=f"node_remediation: cannot set up the Kubernetes client: {error}")
    except API_ERRORS as error:
        module.fail_json(msg=f"node_remediation: the Kubernetes API refused a request: {_api_error(error)}")
    except CONNECTION_ERRORS as error:  # no connection, TLS, retries exhausted
        module.fail_json(msg=f"node_remediation: cannot reach the Kubernetes API: {error}")
    result = {
        "changed": bool(patch),
        "before": view(before),
        "after": view(after),
        "patch": patch,
        "conflicts": conflicts,
    }
    if module._diff and patch:
        result["diff"] = {"before": result["before"], "after": result["after"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
