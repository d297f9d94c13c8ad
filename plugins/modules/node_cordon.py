#!/usr/bin/python
# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
module: node_cordon
short_description: Cordon a Kubernetes Node and record that the collection did, or give back only such a cordon
version_added: 0.1.0
description:
  - With O(state=present) a schedulable Node is cordoned (C(spec.unschedulable)) and gains the annotation
    C(gpuops.k8s/cordoned-by), a JSON object with who cordoned it (O(by)), since when and why. A Node cordoned
    already keeps its cordon as it is; without the annotation it was cordoned by someone else, and RV(ours) is
    false.
  - With O(state=absent) a Node that carries the annotation is uncordoned and loses the annotation. A cordon without
    the annotation (someone else's) stays.
  - The cordon and the annotation are written with one JSON merge patch that carries the C(resourceVersion) they
    were computed from, so the API server refuses it when someone else wrote the Node in between; the module then
    reads the Node again and decides again (up to O(conflict_retries) times).
  - The gpuops.k8s.node_drain role cordons with it before a drain, so that a later run can tell its own cordon,
    which it finishes or gives back, from a person's, which it never lifts.
  - Credentials as M(kubernetes.core.k8s) takes them, including its C(K8S_AUTH_*) environment variables.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  name:
    description: The Node's name.
    type: str
    required: true
  state:
    description: Whether the Node is cordoned by the collection (C(present)) or given back (C(absent)).
    type: str
    choices: [present, absent]
    default: present
  by:
    description: Who cordons, for the annotation (a role or playbook name).
    type: str
    default: gpuops.k8s
  reason:
    description: Why, one sentence for the annotation.
    type: str
    default: ""
  now:
    description: The time of the cordon, ISO 8601 (the control host's clock); empty takes the module's.
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
    description: Returns the cordon and the annotation before and after.
"""

EXAMPLES = r"""
- name: Cordon the node for a driver upgrade, recording that this play did
  gpuops.k8s.node_cordon:
    name: gpu-node-7
    by: gpuops.k8s.node_drain
    reason: the driver changes and the node reboots to load it
  delegate_to: localhost

- name: Give it back (a cordon someone else made stays)
  gpuops.k8s.node_cordon:
    name: gpu-node-7
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
before:
  description: The Node's cordon (C(unschedulable)) and its C(cordoned_by) record before the module ran.
  returned: always
  type: dict
  sample: {unschedulable: false, cordoned_by: null}
after:
  description: The same after it (in check mode, what they would be).
  returned: always
  type: dict
  sample:
    unschedulable: true
    cordoned_by: {by: gpuops.k8s.node_drain, since: "2026-11-28T09:00:00Z", reason: the driver changes}
ours:
  description: Whether the Node is cordoned by the collection after the module ran (the annotation is there).
  returned: always
  type: bool
cordoned_by_someone_else:
  description: Whether the Node is cordoned without the collection's annotation, a cordon the module never lifts.
  returned: always
  type: bool
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
from ansible_collections.gpuops.k8s.plugins.module_utils._node_cordon import CordonError, set_cordon, view

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
    "by": {"type": "str", "default": "gpuops.k8s"},
    "reason": {"type": "str", "default": ""},
    "now": {"type": "str", "default": ""},
    "conflict_retries": {"type": "int", "default": 5},
    **CONNECTION_ARGUMENT_SPEC,
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_or_fail(module, "node_cordon", run_module)


def run_module(module):
    if KUBERNETES_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    if params["conflict_retries"] < 0:
        module.fail_json(msg=f"node_cordon: conflict_retries must be 0 or more, got {params['conflict_retries']}.")
    now = params["now"] or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        patch, before, after, conflicts = set_cordon(
            NodeApi(api_client(params)),
            params["name"],
            params["state"],
            by=params["by"],
            reason=params["reason"],
            now=now,
            check_mode=module.check_mode,
            retries=params["conflict_retries"],
        )
    except CordonError as error:
        module.fail_json(msg=str(error))
    except SETUP_ERRORS as error:
        module.fail_json(msg=f"node_cordon: cannot set up the Kubernetes client: {error}")
    except API_ERRORS as error:
        module.fail_json(msg=f"node_cordon: the Kubernetes API refused a request: {_api_error(error)}")
    except CONNECTION_ERRORS as error:  # no connection, TLS, retries exhausted
        module.fail_json(msg=f"node_cordon: cannot reach the Kubernetes API: {error}")
    shown = view(after)
    result = {
        "changed": bool(patch),
        "before": view(before),
        "after": shown,
        "ours": shown["cordoned_by"] is not None,
        "cordoned_by_someone_else": shown["unschedulable"] and shown["cordoned_by"] is None,
        "patch": patch,
        "conflicts": conflicts,
    }
    if module._diff and patch:
        result["diff"] = {"before": result["before"], "after": result["after"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
