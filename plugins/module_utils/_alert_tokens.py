# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-node alert tokens: the bearer token a node's daemon sends with its GPU alerts.

The one derivation of a node's token from the alert secret, used on the controller by the device_plugin role (the
gpuops.k8s.alert_token filter), which writes only the derived token to the node, and by the gpuops.k8s.gpu_alerts
event source, which verifies that an alert names the node whose token it carries. A node's token is
HMAC-SHA256(secret, node name) in lower-case hex: knowing it tells nothing about another node's token or the
secret. Standard library only (the event source loads this file by its path, outside Ansible).
"""

from __future__ import absolute_import, division, print_function

import hashlib
import hmac


class AlertTokenError(ValueError):
    """A secret or node name a token cannot be derived from; the message is one sentence."""


def node_token(secret, node):
    """The alert token of the node named ``node`` under ``secret``: 64 lower-case hex digits."""
    if not isinstance(secret, str) or not secret:
        raise AlertTokenError("The alert secret must be a non-empty string.")
    if not isinstance(node, str) or not node:
        raise AlertTokenError("The node name must be a non-empty string.")
    return hmac.new(secret.encode("utf-8"), node.encode("utf-8"), hashlib.sha256).hexdigest()


def is_node_token(token, secret, node):
    """Whether ``token`` is the alert token of ``node`` under ``secret`` (compared in constant time)."""
    if not isinstance(token, str) or not secret or not node:
        return False
    return hmac.compare_digest(token.encode("utf-8"), node_token(secret, node).encode("utf-8"))
