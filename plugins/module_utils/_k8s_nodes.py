# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Node calls of the collection's controller-side modules (node_labels, node_remediation, node_cordon), on the
kubernetes client's dynamic client: each answers in plain data, and a write the API server refuses because the Node
changed since it was read (HTTP 409) raises Conflict; write_node is their one read-decide-write loop."""

from __future__ import annotations

import json

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


def apply_patch(node, patch):
    """The Node after a merge patch of ``spec`` keys and ``metadata.annotations`` (an annotation set to None is
    removed): check mode's view, and the node a test double stores."""
    after = json.loads(json.dumps(node))
    after.setdefault("spec", {}).update(patch.get("spec") or {})
    annotations = dict(after.setdefault("metadata", {}).get("annotations") or {})
    for key, value in ((patch.get("metadata") or {}).get("annotations") or {}).items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    after["metadata"]["annotations"] = annotations
    return after


def write_node(api, name, decide, error, who, check_mode=False, retries=5):
    """Read the Node ``name`` and write the merge patch ``decide(node)`` returns, as ``(patch, answer)``, carrying
    the resourceVersion it was computed from; on a 409 the Node is read again and decided anew, at most
    ``retries`` more times. An empty patch, and check mode, write nothing. Returns (answer, patch, the node the
    patch was computed from, the node after, conflicts); problems are ``error(sentence)`` naming ``who``.

    api: read_node(name) -> node dict or None; patch_node(name, merge_patch) -> node dict, raising Conflict on 409.
    """
    node = api.read_node(name)
    if node is None:
        raise error(f"{who}: the API server has no Node {name}.")
    conflicts = 0
    for _attempt in range(retries + 1):
        patch, answer = decide(node)
        if not patch:
            return answer, {}, node, node, conflicts
        if check_mode:
            return answer, patch, node, apply_patch(node, patch), conflicts
        try:
            return answer, patch, node, api.patch_node(name, with_precondition(patch, node)), conflicts
        except Conflict:
            conflicts += 1
            node = api.read_node(name)
            if node is None:
                raise error(f"{who}: the Node {name} went away while it was written.") from None
    raise error(
        f"{who}: the Node {name} changed between every read and write ({retries + 1} tries); "
        "something else is writing it all the time."
    )


def dynamic_client(api_client):
    """The kubernetes client's DynamicClient on ``api_client``, with the errors the Node calls catch, as
    ``(client, ConflictError, NotFoundError)``. The client is imported here, on first use, never when this file
    is: the filter plugins import the plain-data helpers beside it in every task's worker process on the
    controller, and importing the client costs most of a CPU-second each time. The modules say the client is
    missing before they get here."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

    return DynamicClient(api_client), ConflictError, NotFoundError


class NodeApi:
    """List, read and merge-patch Nodes."""

    def __init__(self, api_client):
        client, self._conflict_error, self._not_found_error = dynamic_client(api_client)
        self._nodes = client.resources.get(api_version="v1", kind="Node")

    def list_nodes(self):
        return self._nodes.get().to_dict().get("items") or []

    def read_node(self, name):
        try:
            return self._nodes.get(name=name).to_dict()
        except self._not_found_error:
            return None

    def patch_node(self, name, patch):
        try:
            return self._nodes.patch(name=name, body=patch, content_type=MERGE_PATCH).to_dict()
        except self._conflict_error:
            raise Conflict(name) from None


def api_error(error):
    """One sentence from a Kubernetes API error."""
    summary = getattr(error, "summary", None)
    text = summary() if callable(summary) else str(error)
    return " ".join(str(text).split())
