# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: alert_token
short_description: A node's own GPU alert token, derived from the alert secret
version_added: 0.1.0
description:
  - Takes a Kubernetes node name and returns the bearer token that node's device plugin daemon sends with its GPU
    alerts to the C(gpuops.k8s.gpu_alerts) event source, which is HMAC-SHA256 of the node name under the alert
    secret, in lower-case hex.
  - The source, given the same secret as its O(node_secret) option, accepts an alert with this token only when the
    alert names this node, so a node's token cannot send alerts for another node. Only the derived token goes to
    the node; the secret stays on the controller and the Event-Driven Ansible side.
options:
  _input:
    description: The node's Kubernetes name (the name the daemon puts in its alerts).
    type: str
    required: true
  secret:
    description: The alert secret (the source's O(node_secret)).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Write the node's alert token
  ansible.builtin.copy:
    content: "{{ 'gpu-node-1' | gpuops.k8s.alert_token(gpu_alerts_node_secret) }}"
    dest: /etc/gpuops/alert-token
    mode: "0600"
  no_log: true
"""

RETURN = r"""
_value:
  description: The node's alert token, 64 lower-case hex digits.
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.module_utils._alert_tokens import AlertTokenError, node_token


def alert_token(node, secret):
    try:
        return node_token(secret, node)
    except AlertTokenError as err:
        raise AnsibleFilterError(f"alert_token: {err}") from None


class FilterModule:
    def filters(self):
        return {"alert_token": alert_token}
