# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An ansible-rulebook event source: GPU fault alerts over HTTP, one normalised event per alert."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from typing import Any

DOCUMENTATION = r"""
---
short_description: Receive GPU fault alerts from the gpuops.k8s device plugin daemon or from Alertmanager.
description:
  - An ansible-rulebook event source plugin that listens for HTTP POST requests carrying GPU fault alerts and
    puts one event on the queue for each alert, with a normalised C(gpu_alert) payload holding C(node), C(gpu),
    C(uuid), C(xid) and C(class).
  - Two body formats are accepted. The device plugin daemon's alert webhook (daemon config C(alertWebhook)) posts
    one JSON object with the keys C(node), C(gpu), C(uuid), C(xid), C(class) and C(time). Alertmanager's webhook
    receiver posts an object with an C(alerts) list; every alert whose C(status) is C(firing) becomes an event, its
    C(labels) carrying C(node) and C(class), and optionally C(gpu) (an index, or a GPU UUID such as the
    C(gpuops_gpu_fault_class) metric's C(gpu) label), C(uuid) and C(xid). Resolved alerts make no event.
  - The event also carries C(meta.hosts) set to the node, so a C(run_playbook) action runs its playbook limited to
    that node (the inventory host names must be the Kubernetes node names).
  - A body that is not one of these formats is answered with HTTP 400 and one sentence saying what is wrong, and
    makes no event; a body with several alerts makes no event unless every alert is valid.
  - C(node) must be a Kubernetes node name (a DNS subdomain), so that it cannot widen the playbook's limit into a
    host pattern such as C(all) or C(*).
options:
  host:
    description:
      - The address to listen on. The default accepts only local clients; set C(0.0.0.0) (and a O(token)) for
        daemons and Alertmanager on other machines.
    type: str
    default: "127.0.0.1"
  port:
    description:
      - The TCP port to listen on.
    type: int
    default: 5000
  token:
    description:
      - When set, every request must carry an C(Authorization) header whose value is C(Bearer) and this token;
        others are answered with HTTP 401 and make no event. Alertmanager sends it when its webhook receiver sets
        C(http_config.authorization.credentials).
    type: str
"""

EXAMPLES = r"""
- gpuops.k8s.gpu_alerts:
    host: 0.0.0.0
    port: 5000
    token: "{{ gpu_alerts_token }}"
"""

CLASSES = ("none", "device", "reset", "reboot", "replace")
# A Kubernetes node name: a DNS-1123 subdomain.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Names that an Ansible limit reads as a pattern for more than one host.
_HOST_PATTERN_WORDS = frozenset({"all", "ungrouped", "localhost"})
_UUID_PREFIXES = ("GPU-", "MIG-")

# ansible-rulebook runs a source file with runpy, so __name__ says nothing; name the logger.
logger = logging.getLogger("gpuops.k8s.gpu_alerts")


class AlertError(ValueError):
    """A request body that is not a GPU alert; its message is the one sentence the client gets back."""


def _node(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise AlertError(f"{where} node must be a non-empty string naming a Kubernetes node.")
    if len(value) > 253 or not _NODE_NAME.match(value) or value in _HOST_PATTERN_WORDS:
        raise AlertError(f"{where} node {value!r} is not a Kubernetes node name.")
    return value


def _class(value: Any, where: str) -> str:
    if value not in CLASSES:
        raise AlertError(f"{where} class {value!r} is not one of {', '.join(CLASSES)}.")
    return value


def _integer(value: Any, key: str, where: str) -> int | None:
    """A non-negative integer from JSON (a number) or from an Alertmanager label (a decimal string)."""
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise AlertError(f"{where} {key} must be a non-negative integer, not {value!r}.")


def _uuid(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise AlertError(f"{where} uuid must be a non-empty string.")
    return value


def _alert(fields: dict[str, Any], where: str) -> dict[str, Any]:
    gpu = fields.get("gpu")
    uuid = fields.get("uuid")
    # The daemon's metrics label a GPU by its UUID (gpuops_gpu_fault_class{gpu="GPU-..."}).
    if isinstance(gpu, str) and gpu.startswith(_UUID_PREFIXES):
        if uuid is None:
            uuid = gpu
        gpu = None
    return {
        "node": _node(fields.get("node"), where),
        "gpu": _integer(gpu, "gpu", where),
        "uuid": _uuid(uuid, where),
        "xid": _integer(fields.get("xid"), "xid", where),
        "class": _class(fields.get("class"), where),
    }


def parse_alerts(body: bytes) -> list[dict[str, Any]]:
    """The normalised alerts of one request body, in order; raises AlertError for a body that is not one.

    A daemon alert is one object; an Alertmanager notification is an object with an ``alerts`` list whose
    firing alerts are returned (none when all are resolved)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise AlertError("The request body is not JSON.") from None
    if not isinstance(data, dict):
        raise AlertError("The request body must be a JSON object.")
    if "alerts" not in data:
        return [_alert(data, "The alert's")]
    alerts = data["alerts"]
    if not isinstance(alerts, list):
        raise AlertError("The notification's alerts must be a list.")
    parsed = []
    for number, item in enumerate(alerts, 1):
        where = f"Alert {number}'s"
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            raise AlertError(f"Alert {number} must be an object with a labels object.")
        if item.get("status", "firing") != "firing":
            continue
        parsed.append(_alert(item["labels"], f"{where} label"))
    return parsed


def event(alert: dict[str, Any]) -> dict[str, Any]:
    """The event for one alert: its payload, and the node as the host an action is limited to."""
    return {"gpu_alert": alert, "meta": {"hosts": alert["node"]}}


def _settings(args: dict[str, Any]) -> tuple[str, int, str | None]:
    host = args.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ValueError("gpu_alerts: host must be a non-empty string.")
    port = args.get("port", 5000)
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"gpu_alerts: port must be an integer from 1 to 65535, not {port!r}.")
    token = args.get("token") or None
    if token is not None and not isinstance(token, str):
        raise ValueError("gpu_alerts: token must be a string.")
    return host, port, token


def _authorized(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    scheme, _sep, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


async def main(queue: asyncio.Queue[Any], args: dict[str, Any]) -> None:
    """Serve POST requests on host:port until cancelled, putting one event per valid alert on ``queue``."""
    # aiohttp is a dependency of ansible-rulebook itself; imported here so that the parsing above needs only
    # the standard library.
    from aiohttp import web

    host, port, token = _settings(args)

    async def receive(request: web.Request) -> web.Response:
        if not _authorized(request.headers.get("Authorization"), token):
            logger.warning("refused a request from %s without the expected token", request.remote)
            return web.Response(status=401, text="The request lacks the expected bearer token.\n")
        try:
            alerts = parse_alerts(await request.read())
        except AlertError as err:
            logger.warning("refused a request from %s: %s", request.remote, err)
            return web.Response(status=400, text=f"{err}\n")
        for alert in alerts:
            logger.info(
                "node %s GPU %s (%s) XID %s class %s",
                alert["node"],
                alert["gpu"],
                alert["uuid"],
                alert["xid"],
                alert["class"],
            )
            await queue.put(event(alert))
        return web.json_response({"events": len(alerts)})

    app = web.Application()
    app.router.add_post("/{path:.*}", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        logger.info("listening on %s:%s", host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
