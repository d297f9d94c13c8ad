# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Node calls of the collection's controller-side modules (node_labels, node_remediation), on the kubernetes
client's dynamic client: each answers in plain data, and a write the API server refuses because the Node changed
since it was read (HTTP 409) raises Conflict."""

from __future__ import annotations

try:
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ConflictError, NotFoundError
except ImportError:
    # The modules say the kubernetes client is missing before they get here.
    DynamicClient = ConflictError = NotFoundError = None

MERGE_PATCH = "application/merge-patch+json"


def with_precondition(patch, node):
    """The merge patch with the resourceVersion it was computed from: the API server refuses it (409, Conflict)
    when the Node changed in between, so a taint, label or annotation someone wrote meanwhile is never
    overwritten from a stale read."""
    version = (node.get("metadata") or {}).get("resourceVersion")
    if not version:
        return patch
    body = dict(patch)
    body["metadata"] = dict(patch.get("metadata") or {}, resourceVersion=version)
    return body


class Conflict(Exception):
    """The API server refused a write because the Node changed since it was read (HTTP 409)."""


class NodeApi:
    """List, read and merge-patch Nodes."""

    def __init__(self, api_client):
        self._nodes = DynamicClient(api_client).resources.get(api_version="v1", kind="Node")

    def list_nodes(self):
        return self._nodes.get().to_dict().get("items") or []

    def read_node(self, name):
        try:
            return self._nodes.get(name=name).to_dict()
        except NotFoundError:
            return None

    def patch_node(self, name, patch):
        try:
            return self._nodes.patch(name=name, body=patch, content_type=MERGE_PATCH).to_dict()
        except ConflictError:
            raise Conflict(name) from None


def api_error(error):
    """One sentence from a Kubernetes API error."""
    summary = getattr(error, "summary", None)
    text = summary() if callable(summary) else str(error)
    return " ".join(str(text).split())
