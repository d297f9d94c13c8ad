# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An ansible-rulebook event source: GPU fault alerts over HTTP, one normalised event per alert."""

from __future__ import annotations

import asyncio
import hmac
import importlib.util
import ipaddress
import json
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable

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
    that node (the inventory host names must be the Kubernetes node names). C(playbooks/remediate.yml) refuses a
    run for an alert whose hosts are not exactly that one node of its GPU group.
  - C(node) must be a whole Kubernetes node name (a DNS subdomain, and not C(all), C(ungrouped) or C(localhost)),
    C(uuid) a GPU or MIG device UUID (C(GPU-) or C(MIG-) and 32 hex digits in the 8-4-4-4-12 form, or the older
    C(MIG-GPU-<uuid>/<gi>/<ci>)), C(gpu) and C(xid) integers of at most 10 digits.
  - "Answers: C(200) with C({\"events\": N}) when every alert of the request became an event. A body that is not
    one of the formats (not JSON, nested over 100 levels, an integer of more than 18 digits, more than 1000 alerts,
    a daemon alert with a bad field) is answered with C(400) and one sentence, and makes no event. In an
    Alertmanager notification each alert stands alone: the valid ones become events and the others are refused;
    when some became events the answer is C(207) with C({\"events\": N, \"refused\": [{\"alert\": NUMBER,
    \"status\": STATUS, \"reason\": SENTENCE}]}) (a 2xx, so Alertmanager does not send the group again for the
    refused ones), and when none did it is the first refusal's status with one sentence a line."
  - Each alert is bound to its sender. A request whose bearer token is the sender token (O(token), Alertmanager's)
    may carry alerts for any node. A request whose bearer token is a node's own token (derived from
    O(node_secret) by the C(gpuops.k8s.alert_token) filter; the C(device_plugin) role puts it on the node) may
    carry alerts for that node only; an alert for another node is refused with C(401).
  - Each node may have at most O(node_burst) alerts at once and O(node_rate) more a minute (a token bucket per
    node); an alert over that is refused with C(429) and a C(Retry-After) header, and other nodes' alerts still
    get through. When O(max_queue) events wait on the rulebook's queue, further alerts are refused with C(503).
  - The source refuses to start on an address other than a loopback one without a O(token) or O(node_secret).
options:
  host:
    description:
      - The address to listen on. The default accepts only local clients; set C(0.0.0.0) (and a O(node_secret)
        and/or O(token)) for daemons and Alertmanager on other machines.
    type: str
    default: "127.0.0.1"
  port:
    description:
      - The TCP port to listen on.
    type: int
    default: 5000
  token:
    description:
      - The sender token. A request whose C(Authorization) header is C(Bearer) and this token may carry alerts for
        any node. Give it to one central sender, Alertmanager (its webhook receiver's
        C(http_config.authorization.credentials)), not to the nodes.
    type: str
  node_secret:
    description:
      - The secret each node's own alert token is derived from (HMAC-SHA256 of the node name, in hex, by the
        C(gpuops.k8s.alert_token) filter, which the C(device_plugin) role's O(device_plugin_alert_secret) uses). A
        request carrying a node's token may carry alerts for that node only.
    type: str
  node_rate:
    description:
      - The alerts a minute each node may send once its burst is spent.
    type: int
    default: 6
  node_burst:
    description:
      - The alerts a node may send at once (the daemon sends one per GPU and class, so a node of 8 GPUs needs 32 at
        most).
    type: int
    default: 32
  max_queue:
    description:
      - The events that may wait on the rulebook's queue; more are refused with C(503).
    type: int
    default: 1000
"""

EXAMPLES = r"""
- gpuops.k8s.gpu_alerts:
    host: 0.0.0.0
    port: 5000
    node_secret: "{{ gpu_alerts_node_secret }}"
    token: "{{ gpu_alerts_token }}"
"""

CLASSES = ("none", "device", "reset", "reboot", "replace")
# A Kubernetes node name: a DNS-1123 subdomain, matched whole (fullmatch: "$" would let a trailing newline by).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Names that an Ansible limit reads as a pattern for more than one host.
_HOST_PATTERN_WORDS = frozenset({"all", "ungrouped", "localhost"})
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# NVML's GPU and MIG device UUIDs (drivers before R470 name a MIG device by its GPU and instance indices).
_UUID = re.compile(rf"(?:GPU|MIG)-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/[0-9]{{1,3}}/[0-9]{{1,3}}")
_UUID_PREFIXES = ("GPU-", "MIG-")
_MAX_DIGITS = 10
_MAX_JSON_DIGITS = 18
_MAX_DEPTH = 100
_MAX_ALERTS = 1000

# ansible-rulebook runs a source file with runpy, so __name__ says nothing; name the logger.
logger = logging.getLogger("gpuops.k8s.gpu_alerts")


def _load_alert_tokens() -> Any:
    """The collection's one derivation of node tokens (plugins/module_utils/_alert_tokens.py).

    Imported as a collection module where the collection is importable (the unit tests); ansible-rulebook runs
    this file by its path, outside Ansible's collection loader, so there it is loaded from the collection's tree
    beside this file."""
    try:
        from ansible_collections.gpuops.k8s.plugins.module_utils import _alert_tokens

        return _alert_tokens
    except ImportError:
        path = Path(__file__).resolve().parents[4] / "plugins" / "module_utils" / "_alert_tokens.py"
        spec = importlib.util.spec_from_file_location("gpuops_k8s_alert_tokens", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"gpu_alerts: the collection's {path} cannot be loaded.") from None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


_alert_tokens = _load_alert_tokens()


class AlertError(ValueError):
    """A request body (or one alert of it) that is not a GPU alert; its message is the one sentence answered."""


def _shown(value: Any) -> str:
    """A value for a sentence and the log, bounded: short scalars as Python writes them, the rest by kind."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 64 else f"a string of {len(value)} characters"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return "a JSON object" if isinstance(value, dict) else "a JSON array"


def _node(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise AlertError(f"{where} node must be a non-empty string naming a Kubernetes node.")
    if len(value) > 253 or not _NODE_NAME.fullmatch(value) or value in _HOST_PATTERN_WORDS:
        raise AlertError(f"{where} node {_shown(value)} is not a Kubernetes node name.")
    return value


def _class(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in CLASSES:
        raise AlertError(f"{where} class {_shown(value)} is not one of {', '.join(CLASSES)}.")
    return value


def _integer(value: Any, key: str, where: str) -> int | None:
    """A non-negative integer of at most 10 digits from JSON (a number) or an Alertmanager label (a string)."""
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**_MAX_DIGITS:
        return value
    raise AlertError(
        f"{where} {key} must be a non-negative integer of at most {_MAX_DIGITS} digits, not {_shown(value)}."
    )


def _uuid(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _UUID.fullmatch(value):
        raise AlertError(f"{where} uuid {_shown(value)} is not a GPU or MIG device UUID.")
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


def _json_integer(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_JSON_DIGITS:
        raise AlertError(f"The request body holds an integer of more than {_MAX_JSON_DIGITS} digits.")
    return int(text)


def _depth(data: Any) -> int:
    """How deep JSON values nest (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= _MAX_DEPTH:
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _json(body: bytes) -> Any:
    try:
        data = json.loads(body, parse_int=_json_integer)
    except AlertError:
        raise
    except RecursionError:
        raise AlertError(f"The request body nests deeper than {_MAX_DEPTH} levels.") from None
    except (ValueError, UnicodeDecodeError):
        raise AlertError("The request body is not JSON.") from None
    if _depth(data) > _MAX_DEPTH:
        raise AlertError(f"The request body nests deeper than {_MAX_DEPTH} levels.")
    return data


def parse_alerts(body: bytes) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str]]]:
    """The alerts of one request body: (number, alert) for each valid one and (number, sentence) for each invalid
    one, in order; raises AlertError for a body that is not a daemon alert or an Alertmanager notification.

    A daemon alert is one object (number 1; a bad field refuses the body); an Alertmanager notification is an
    object with an ``alerts`` list, each alert numbered from 1 and judged alone; resolved alerts make none."""
    data = _json(body)
    if not isinstance(data, dict):
        raise AlertError("The request body must be a JSON object.")
    if "alerts" not in data:
        return [(1, _alert(data, "The alert's"))], []
    alerts = data["alerts"]
    if not isinstance(alerts, list):
        raise AlertError("The notification's alerts must be a list.")
    if len(alerts) > _MAX_ALERTS:
        raise AlertError(f"The notification holds {len(alerts)} alerts, more than {_MAX_ALERTS}.")
    parsed, refused = [], []
    for number, item in enumerate(alerts, 1):
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            refused.append((number, f"Alert {number} must be an object with a labels object."))
            continue
        if item.get("status", "firing") != "firing":
            continue
        try:
            parsed.append((number, _alert(item["labels"], f"Alert {number}'s label")))
        except AlertError as err:
            refused.append((number, str(err)))
    return parsed, refused


def event(alert: dict[str, Any]) -> dict[str, Any]:
    """The event for one alert: its payload, and the node as the host an action is limited to."""
    return {"gpu_alert": alert, "meta": {"hosts": alert["node"]}}


def _positive(args: dict[str, Any], key: str, default: int, top: int) -> int:
    value = args.get(key, default)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        raise ValueError(f"gpu_alerts: {key} must be an integer from 1 to {top}, not {_shown(value)}.")
    return value


def _secret(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key) or None
    if value is not None and not isinstance(value, str):
        raise ValueError(f"gpu_alerts: {key} must be a string.")
    return value


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _settings(args: dict[str, Any]) -> dict[str, Any]:
    host = args.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ValueError("gpu_alerts: host must be a non-empty string.")
    settings = {
        "host": host,
        "port": _positive(args, "port", 5000, 65535),
        "token": _secret(args, "token"),
        "node_secret": _secret(args, "node_secret"),
        "node_rate": _positive(args, "node_rate", 6, 100000),
        "node_burst": _positive(args, "node_burst", 32, 100000),
        "max_queue": _positive(args, "max_queue", 1000, 1000000),
    }
    if not _loopback(host) and settings["token"] is None and settings["node_secret"] is None:
        raise ValueError(
            f"gpu_alerts: listening on {host}, which other machines reach, needs a node_secret or a token, so that"
            " only senders holding one can start a remediation."
        )
    return settings


def _bearer(header: str | None) -> str | None:
    scheme, _sep, given = (header or "").partition(" ")
    given = given.strip()
    return given if scheme.lower() == "bearer" and given else None


def _is_sender(given: str | None, token: str | None) -> bool:
    return token is not None and given is not None and hmac.compare_digest(given.encode(), token.encode())


def _waiting(queue: Any) -> int:
    """The events waiting on the rulebook's queue. ansible-rulebook (1.3.2) hands a source a FilteredQueue, which
    runs the event filters and puts onto the asyncio.Queue it holds as ``queue``; a plain asyncio.Queue is its own."""
    inner = getattr(queue, "queue", queue)
    qsize = getattr(inner, "qsize", None)
    return qsize() if callable(qsize) else 0


class NodeRates:
    """A token bucket per node: ``burst`` alerts at once, ``rate`` more a minute. Idle nodes' buckets (full again)
    are forgotten when ``max_nodes`` are kept, and while that many nodes are busy a new node waits, so the table
    stays bounded."""

    def __init__(self, rate: int, burst: int, clock: Callable[[], float] = time.monotonic, max_nodes: int = 10000):
        self.rate, self.burst, self.clock, self.max_nodes = rate, burst, clock, max_nodes
        self._buckets: dict[str, tuple[float, float]] = {}

    def _level(self, node: str, now: float) -> float:
        level, at = self._buckets.get(node, (float(self.burst), now))
        return min(float(self.burst), level + (now - at) * self.rate / 60.0)

    def take(self, node: str) -> bool:
        """Whether ``node`` may send one more alert now (and, if so, counts it)."""
        now = self.clock()
        if node not in self._buckets and len(self._buckets) >= self.max_nodes:
            for name in [name for name in self._buckets if self._level(name, now) >= self.burst]:
                del self._buckets[name]
            if len(self._buckets) >= self.max_nodes:
                return False
        level = self._level(node, now)
        if level < 1.0:
            self._buckets[node] = (level, now)
            return False
        self._buckets[node] = (level - 1.0, now)
        return True

    def retry_after(self) -> int:
        """Seconds until a node over its rate may send one alert again."""
        return max(1, int(60 / self.rate + 0.999))


class Receiver:
    """What one request gets: its alerts judged against the sender's token, the node rates and the queue."""

    def __init__(self, settings: dict[str, Any], queue: Any, clock: Callable[[], float] = time.monotonic):
        self.token, self.node_secret = settings["token"], settings["node_secret"]
        self.max_queue, self.queue = settings["max_queue"], queue
        self.rates = NodeRates(settings["node_rate"], settings["node_burst"], clock)

    def authenticated(self, header: str | None) -> str | None:
        """None when the request may go on, else the sentence of its 401: a request must carry the sender token
        or, with a node secret, a bearer token that may be a node's (checked against each alert's node)."""
        if self.token is None and self.node_secret is None:
            return None
        given = _bearer(header)
        if _is_sender(given, self.token) or (self.node_secret is not None and given is not None):
            return None
        return "The request lacks the expected bearer token."

    def refusal(self, alert: dict[str, Any], header: str | None) -> tuple[int, str] | None:
        """None when the alert may become an event now, else its status and sentence."""
        node, given = alert["node"], _bearer(header)
        open_source = self.token is None and self.node_secret is None
        if not (
            open_source or _is_sender(given, self.token) or _alert_tokens.is_node_token(given, self.node_secret, node)
        ):
            return 401, f"The request's bearer token is not the token of node {node!r}."
        if _waiting(self.queue) >= self.max_queue:
            return 503, f"The event queue holds {self.max_queue} events already; send the alert again later."
        if not self.rates.take(node):
            return 429, (
                f"Node {node!r} sent more than {self.rates.burst} alerts at once or {self.rates.rate} a minute;"
                " send the alert again later."
            )
        return None

    async def handle(self, body: bytes, header: str | None, remote: str | None) -> tuple[int, Any, dict[str, str]]:
        """The answer to one POST: (status, body, headers); a dict body is sent as JSON, a str as text."""
        refused_auth = self.authenticated(header)
        if refused_auth is not None:
            logger.warning("refused a request from %s without the expected token", remote)
            return 401, f"{refused_auth}\n", {}
        try:
            alerts, refused = parse_alerts(body)
        except AlertError as err:
            logger.warning("refused a request from %s: %s", remote, err)
            return 400, f"{err}\n", {}
        answers = [(number, 400, sentence) for number, sentence in refused]
        events = 0
        for number, alert in alerts:
            refusal = self.refusal(alert, header)
            if refusal is not None:
                answers.append((number, *refusal))
                continue
            logger.info(
                "node %s GPU %s (%s) XID %s class %s",
                alert["node"],
                alert["gpu"],
                alert["uuid"],
                alert["xid"],
                alert["class"],
            )
            await self.queue.put(event(alert))
            events += 1
        answers.sort()
        for _number, _status, sentence in answers:
            logger.warning("refused an alert from %s: %s", remote, sentence)
        headers = {"Retry-After": str(self.rates.retry_after())} if any(a[1] in (429, 503) for a in answers) else {}
        if not answers:
            return 200, {"events": events}, {}
        if events:
            refusals = [{"alert": number, "status": status, "reason": text} for number, status, text in answers]
            return 207, {"events": events, "refused": refusals}, headers
        return answers[0][1], "".join(f"{text}\n" for _number, _status, text in answers), headers


async def main(queue: asyncio.Queue[Any], args: dict[str, Any]) -> None:
    """Serve POST requests on host:port until cancelled, putting one event per accepted alert on ``queue``."""
    settings = _settings(args)
    # aiohttp is a dependency of ansible-rulebook itself; imported here so that the parsing above needs only
    # the standard library.
    from aiohttp import web

    receiver = Receiver(settings, queue)

    async def receive(request: web.Request) -> web.Response:
        status, answer, headers = await receiver.handle(
            await request.read(), request.headers.get("Authorization"), request.remote
        )
        if isinstance(answer, dict):
            return web.json_response(answer, status=status, headers=headers)
        return web.Response(status=status, text=answer, headers=headers)

    app = web.Application()
    app.router.add_post("/{path:.*}", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings["host"], settings["port"]).start()
        logger.info("listening on %s:%s", settings["host"], settings["port"])
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
