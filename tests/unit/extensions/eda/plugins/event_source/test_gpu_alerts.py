"""The gpu_alerts event source's reading of request bodies, settings, tokens and limits, and the answer each request
gets (Receiver.handle, the whole of a request but the HTTP; tests/integration/test_eda_rulebook.py runs the source
inside ansible-rulebook over real HTTP)."""

import asyncio
import json

import pytest
from ansible_collections.gpuops.k8s.extensions.eda.plugins.event_source.gpu_alerts import (
    CLASSES,
    AlertError,
    NodeRates,
    Receiver,
    _settings,
    event,
    parse_alerts,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._alert_tokens import node_token


def body(data):
    return json.dumps(data).encode()


DAEMON_ALERT = {
    "node": "gpu-node-1",
    "gpu": 3,
    "uuid": "GPU-5b3a1f0e-0000-4000-8000-000000000003",
    "xid": 79,
    "class": "reboot",
    "time": "2026-11-26T08:00:00Z",
}
UUID_A = "GPU-5b3a1f0e-0000-4000-8000-00000000000a"
UUID_B = "GPU-5b3a1f0e-0000-4000-8000-00000000000b"
MIG_C = "MIG-5b3a1f0e-0000-4000-8000-00000000000c"


def alerts_of(raw):
    """The valid alerts of a body, which must have no invalid one."""
    alerts, refused = parse_alerts(raw)
    assert refused == []
    return [alert for _number, alert in alerts]


def test_a_daemon_alert_becomes_one_normalised_alert():
    assert alerts_of(body(DAEMON_ALERT)) == [
        {
            "node": "gpu-node-1",
            "gpu": 3,
            "uuid": "GPU-5b3a1f0e-0000-4000-8000-000000000003",
            "xid": 79,
            "class": "reboot",
        }
    ]


def test_the_event_limits_actions_to_the_alerting_node():
    (alert,) = alerts_of(body(DAEMON_ALERT))
    assert event(alert) == {"gpu_alert": alert, "meta": {"hosts": "gpu-node-1"}}


@pytest.mark.parametrize("klass", CLASSES)
def test_every_class_is_accepted(klass):
    (alert,) = alerts_of(body(dict(DAEMON_ALERT, **{"class": klass})))
    assert alert["class"] == klass


def test_gpu_uuid_and_xid_may_be_absent():
    (alert,) = alerts_of(body({"node": "n1", "class": "reset"}))
    assert alert == {"node": "n1", "gpu": None, "uuid": None, "xid": None, "class": "reset"}


def alertmanager(*alerts, status="firing"):
    return body(
        {
            "version": "4",
            "groupKey": '{}:{alertname="GPUFault"}',
            "status": status,
            "receiver": "gpuops-eda",
            "groupLabels": {"alertname": "GPUFault"},
            "commonLabels": {"alertname": "GPUFault"},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager.invalid",
            "alerts": list(alerts),
        }
    )


def firing(labels, status="firing"):
    return {
        "status": status,
        "labels": dict({"alertname": "GPUFault"}, **labels),
        "annotations": {"summary": "a GPU fault"},
        "startsAt": "2026-11-26T08:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": "0123456789abcdef",
    }


def test_alertmanager_labels_are_read_and_a_uuid_in_the_gpu_label_is_taken_as_the_uuid():
    alerts = alerts_of(
        alertmanager(
            firing({"node": "gpu-node-2", "gpu": UUID_A, "class": "reset", "xid": "48"}),
            firing({"node": "gpu-node-3", "gpu": "1", "uuid": UUID_B, "class": "replace"}),
        )
    )
    assert alerts == [
        {"node": "gpu-node-2", "gpu": None, "uuid": UUID_A, "xid": 48, "class": "reset"},
        {"node": "gpu-node-3", "gpu": 1, "uuid": UUID_B, "xid": None, "class": "replace"},
    ]


def test_a_mig_device_uuid_in_the_gpu_label_is_a_uuid_too():
    (alert,) = alerts_of(alertmanager(firing({"node": "n1", "gpu": MIG_C, "class": "reset"})))
    assert (alert["gpu"], alert["uuid"]) == (None, MIG_C)


def test_resolved_alerts_make_no_alert():
    assert alerts_of(alertmanager(firing({"node": "n1", "class": "reboot"}, status="resolved"))) == []
    assert alerts_of(
        alertmanager(
            firing({"node": "n1", "class": "reboot"}, status="resolved"),
            firing({"node": "n2", "class": "reboot"}),
        )
    ) == [{"node": "n2", "gpu": None, "uuid": None, "xid": None, "class": "reboot"}]


@pytest.mark.parametrize(
    "raw, sentence",
    [
        (b"{not json", "The request body is not JSON."),
        (b"\xff\xfe", "The request body is not JSON."),
        (b"[1, 2]", "The request body must be a JSON object."),
        (body({"class": "reboot"}), "The alert's node must be a non-empty string naming a Kubernetes node."),
        (body({"node": 7, "class": "reboot"}), "The alert's node must be a non-empty string naming a Kubernetes node."),
        (body({"node": "all", "class": "reboot"}), "The alert's node 'all' is not a Kubernetes node name."),
        (body({"node": "*", "class": "reboot"}), "The alert's node '*' is not a Kubernetes node name."),
        (body({"node": "n1,n2", "class": "reboot"}), "The alert's node 'n1,n2' is not a Kubernetes node name."),
        (body({"node": "!n1", "class": "reboot"}), "The alert's node '!n1' is not a Kubernetes node name."),
        (body({"node": "Node1", "class": "reboot"}), "The alert's node 'Node1' is not a Kubernetes node name."),
        # A name and a newline: re.match(...$) let both by, and Ansible splits a limit on newlines.
        (body({"node": "all\n", "class": "reboot"}), "The alert's node 'all\\n' is not a Kubernetes node name."),
        (body({"node": "gpu-1\n", "class": "reboot"}), "The alert's node 'gpu-1\\n' is not a Kubernetes node name."),
        (
            body({"node": "x" * 300, "class": "reboot"}),
            "The alert's node a string of 300 characters is not a Kubernetes node name.",
        ),
        (body({"node": "n1"}), "The alert's class None is not one of none, device, reset, reboot, replace."),
        (
            body({"node": "n1", "class": "REBOOT"}),
            "The alert's class 'REBOOT' is not one of none, device, reset, reboot, replace.",
        ),
        (
            body({"node": "n1", "class": ["reboot"]}),
            "The alert's class a JSON array is not one of none, device, reset, reboot, replace.",
        ),
        (
            body({"node": "n1", "class": "reset", "xid": 79.5}),
            "The alert's xid must be a non-negative integer of at most 10 digits, not 79.5.",
        ),
        (
            body({"node": "n1", "class": "reset", "xid": True}),
            "The alert's xid must be a non-negative integer of at most 10 digits, not True.",
        ),
        (
            body({"node": "n1", "class": "reset", "gpu": -1}),
            "The alert's gpu must be a non-negative integer of at most 10 digits, not -1.",
        ),
        (
            body({"node": "n1", "class": "reset", "xid": {"a": 1}}),
            "The alert's xid must be a non-negative integer of at most 10 digits, not a JSON object.",
        ),
        (body({"node": "n1", "class": "reset", "uuid": ""}), "The alert's uuid '' is not a GPU or MIG device UUID."),
        # uuid is a GPU or MIG device UUID, not free text for the logs.
        (
            body({"node": "n1", "class": "reset", "uuid": "GPU-0\nforged log line"}),
            "The alert's uuid 'GPU-0\\nforged log line' is not a GPU or MIG device UUID.",
        ),
        (
            body({"node": "n1", "class": "reset", "uuid": UUID_A + "\n"}),
            f"The alert's uuid {UUID_A + chr(10)!r} is not a GPU or MIG device UUID.",
        ),
        (
            body({"node": "n1", "class": "reset", "uuid": "GPU-" + "a" * 500}),
            "The alert's uuid a string of 504 characters is not a GPU or MIG device UUID.",
        ),
        (body({"alerts": {"labels": {}}}), "The notification's alerts must be a list."),
        # Deep nesting (a RecursionError in the parser) and huge integers (int()'s digit limit) are 400, not 500.
        (b"[" * 100000 + b"]" * 100000, "The request body nests deeper than 100 levels."),
        (
            b'{"node": "n1", "class": "reset", "x": ' + b"[" * 200 + b"]" * 200 + b"}",
            "The request body nests deeper than 100 levels.",
        ),
        (
            b'{"node": "n1", "class": "reset", "xid": ' + b"7" * 5000 + b"}",
            "The request body holds an integer of more than 18 digits.",
        ),
        (
            body({"node": "n1", "class": "reset", "xid": "7" * 5000}),
            "The alert's xid must be a non-negative integer of at most 10 digits, not a string of 5000 characters.",
        ),
        (body({"alerts": [{"labels": {}}] * 1001}), "The notification holds 1001 alerts, more than 1000."),
    ],
)
def test_a_bad_body_is_one_sentence(raw, sentence):
    with pytest.raises(AlertError) as raised:
        parse_alerts(raw)
    assert str(raised.value) == sentence


@pytest.mark.parametrize(
    "uuid",
    [
        UUID_A,
        "GPU-5B3A1F0E-0000-4000-8000-00000000000A",
        MIG_C,
        "MIG-GPU-5b3a1f0e-0000-4000-8000-00000000000a/1/0",
    ],
)
def test_gpu_and_mig_device_uuids_are_accepted(uuid):
    (alert,) = alerts_of(body({"node": "n1", "class": "reset", "uuid": uuid}))
    assert alert["uuid"] == uuid


def test_an_invalid_alert_of_a_notification_is_named_and_the_valid_ones_stay():
    alerts, refused = parse_alerts(
        alertmanager(
            firing({"node": "n1", "class": "reboot"}),
            firing({"node": "n2", "class": "melt"}),
            "not an alert",
            firing({"class": "reboot"}),
            firing({"node": "n3", "class": "reset", "xid": "x79"}),
            firing({"node": "n4", "class": "reset"}),
        )
    )
    assert alerts == [
        (1, {"node": "n1", "gpu": None, "uuid": None, "xid": None, "class": "reboot"}),
        (6, {"node": "n4", "gpu": None, "uuid": None, "xid": None, "class": "reset"}),
    ]
    assert refused == [
        (2, "Alert 2's label class 'melt' is not one of none, device, reset, reboot, replace."),
        (3, "Alert 3 must be an object with a labels object."),
        (4, "Alert 4's label node must be a non-empty string naming a Kubernetes node."),
        (5, "Alert 5's label xid must be a non-negative integer of at most 10 digits, not 'x79'."),
    ]


SETTINGS = {"host": "127.0.0.1", "port": 5000, "token": None, "node_secret": None}
LIMITS = {"node_rate": 6, "node_burst": 32, "max_queue": 1000}


def test_settings_defaults_and_numbers_given_as_text():
    assert _settings({}) == {**SETTINGS, **LIMITS}
    assert _settings(
        {"host": "0.0.0.0", "port": "5011", "token": "s3cret", "node_rate": "2", "node_burst": "4", "max_queue": "8"}
    ) == {
        "host": "0.0.0.0",
        "port": 5011,
        "token": "s3cret",
        "node_secret": None,
        "node_rate": 2,
        "node_burst": 4,
        "max_queue": 8,
    }
    assert _settings({"token": "", "node_secret": ""}) == {**SETTINGS, **LIMITS}
    assert _settings({"host": "::", "node_secret": "k"})["node_secret"] == "k"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_needs_no_token(host):
    assert _settings({"host": host})["host"] == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "eda.example"])
def test_off_loopback_without_a_token_or_secret_the_source_refuses_to_start(host):
    with pytest.raises(ValueError) as raised:
        _settings({"host": host, "token": "", "node_secret": ""})
    assert str(raised.value) == (
        f"gpu_alerts: listening on {host}, which other machines reach, needs a node_secret or a token, so that only"
        " senders holding one can start a remediation."
    )


@pytest.mark.parametrize(
    "args, sentence",
    [
        ({"port": 0}, "gpu_alerts: port must be an integer from 1 to 65535, not 0."),
        ({"port": "http"}, "gpu_alerts: port must be an integer from 1 to 65535, not 'http'."),
        ({"port": True}, "gpu_alerts: port must be an integer from 1 to 65535, not True."),
        ({"host": ""}, "gpu_alerts: host must be a non-empty string."),
        ({"token": 12}, "gpu_alerts: token must be a string."),
        ({"node_secret": ["k"]}, "gpu_alerts: node_secret must be a string."),
        ({"node_burst": 0}, "gpu_alerts: node_burst must be an integer from 1 to 100000, not 0."),
        ({"max_queue": "-1"}, "gpu_alerts: max_queue must be an integer from 1 to 1000000, not '-1'."),
    ],
)
def test_bad_settings_are_one_sentence(args, sentence):
    with pytest.raises(ValueError) as raised:
        _settings(args)
    assert str(raised.value) == sentence


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_node_gets_its_burst_then_its_rate():
    clock = Clock()
    rates = NodeRates(rate=6, burst=3, clock=clock)
    assert [rates.take("n1") for _try in range(4)] == [True, True, True, False]
    # Other nodes keep their own buckets.
    assert rates.take("n2") is True
    clock.now += 9.9
    assert rates.take("n1") is False
    clock.now += 0.2
    assert rates.take("n1") is True
    assert rates.take("n1") is False
    assert rates.retry_after() == 10


def test_idle_nodes_are_forgotten_so_the_table_stays_bounded():
    clock = Clock()
    rates = NodeRates(rate=60, burst=2, clock=clock, max_nodes=3)
    assert [rates.take(node) for node in ("a", "b", "c")] == [True, True, True]
    # Three busy nodes: a fourth waits, the three go on.
    assert (rates.take("d"), rates.take("a")) == (False, True)
    clock.now += 60
    assert rates.take("d") is True
    assert set(rates._buckets) == {"d"}


SECRET = "eda-node-secret"
SENDER = "alertmanager-sender-token"


class Queue(asyncio.Queue):
    pass


def receiver(clock=None, **settings):
    values = {"token": None, "node_secret": None, "node_rate": 6, "node_burst": 32, "max_queue": 1000}
    values.update(settings)
    return Receiver(values, asyncio.Queue(), clock or Clock())


def answer(recv, raw, token=None):
    header = None if token is None else f"Bearer {token}"
    return asyncio.run(recv.handle(raw, header, "192.0.2.1"))


def daemon_alert(node, klass="reboot"):
    return body({"node": node, "gpu": 0, "uuid": UUID_A, "xid": 79, "class": klass})


def test_a_nodes_token_sends_alerts_for_that_node_only():
    recv = receiver(node_secret=SECRET, token=SENDER)
    assert answer(recv, daemon_alert("gpu-1"), token=node_token(SECRET, "gpu-1")) == (200, {"events": 1}, {})
    assert answer(recv, daemon_alert("gpu-2"), token=node_token(SECRET, "gpu-1")) == (
        401,
        "The request's bearer token is not the token of node 'gpu-2'.\n",
        {},
    )
    # The sender token (Alertmanager's) sends for any node; a token of another secret for none.
    assert answer(recv, daemon_alert("gpu-2"), token=SENDER) == (200, {"events": 1}, {})
    assert answer(recv, daemon_alert("gpu-1"), token=node_token("other", "gpu-1"))[0] == 401
    assert answer(recv, daemon_alert("gpu-1"))[:2] == (401, "The request lacks the expected bearer token.\n")
    assert [recv.queue.get_nowait()["gpu_alert"]["node"] for _try in range(recv.queue.qsize())] == ["gpu-1", "gpu-2"]


def test_a_nodes_token_in_a_notification_keeps_the_alerts_of_its_own_node():
    recv = receiver(node_secret=SECRET)
    status, data, _headers = answer(
        recv,
        alertmanager(firing({"node": "gpu-1", "class": "reset"}), firing({"node": "gpu-2", "class": "reboot"})),
        token=node_token(SECRET, "gpu-1"),
    )
    assert (status, data) == (
        207,
        {
            "events": 1,
            "refused": [
                {"alert": 2, "status": 401, "reason": "The request's bearer token is not the token of node 'gpu-2'."}
            ],
        },
    )


def test_with_only_a_sender_token_other_tokens_are_refused_before_the_body_is_read():
    recv = receiver(token=SENDER)
    assert answer(recv, b"{not json", token="wrong")[:2] == (401, "The request lacks the expected bearer token.\n")
    assert answer(recv, b"{not json", token=SENDER)[:2] == (400, "The request body is not JSON.\n")
    assert answer(recv, daemon_alert("gpu-7"), token=SENDER)[:2] == (200, {"events": 1})


def test_a_flooding_node_gets_429_and_other_nodes_get_through():
    recv = receiver(node_secret=SECRET, node_rate=6, node_burst=3)
    flood = [answer(recv, daemon_alert("gpu-1"), token=node_token(SECRET, "gpu-1")) for _try in range(5)]
    assert [status for status, _data, _headers in flood] == [200, 200, 200, 429, 429]
    assert flood[3] == (
        429,
        "Node 'gpu-1' sent more than 3 alerts at once or 6 a minute; send the alert again later.\n",
        {"Retry-After": "10"},
    )
    assert answer(recv, daemon_alert("gpu-2"), token=node_token(SECRET, "gpu-2"))[:2] == (200, {"events": 1})
    assert recv.queue.qsize() == 4


def test_the_queue_is_bounded():
    recv = receiver(max_queue=2)
    assert [answer(recv, daemon_alert(f"gpu-{n}"))[0] for n in range(3)] == [200, 200, 503]
    assert answer(recv, daemon_alert("gpu-9"))[1:] == (
        "The event queue holds 2 events already; send the alert again later.\n",
        {"Retry-After": "10"},
    )
    recv.queue.get_nowait()
    assert answer(recv, daemon_alert("gpu-9"))[0] == 200


class FilteredQueueShape:
    """The shape of the queue ansible-rulebook 1.3.2 hands a source (engine.FilteredQueue): put() onto the
    asyncio.Queue it holds as ``queue``, and no qsize() of its own."""

    def __init__(self):
        self.queue = asyncio.Queue()

    async def put(self, data):
        await self.queue.put(data)


def test_the_queue_bound_reads_the_queue_inside_ansible_rulebooks_filtered_queue():
    recv = receiver(max_queue=1)
    recv.queue = FilteredQueueShape()
    assert [answer(recv, daemon_alert(f"gpu-{n}"))[0] for n in range(2)] == [200, 503]


def test_a_notification_with_only_invalid_alerts_is_400_with_a_sentence_a_line():
    recv = receiver()
    status, text, _headers = answer(
        recv, alertmanager(firing({"node": "n1", "class": "melt"}), firing({"node": "all\n", "class": "reboot"}))
    )
    assert status == 400
    assert text == (
        "Alert 1's label class 'melt' is not one of none, device, reset, reboot, replace.\n"
        "Alert 2's label node 'all\\n' is not a Kubernetes node name.\n"
    )
    assert recv.queue.qsize() == 0


def test_a_notification_with_one_invalid_alert_makes_events_of_the_others_with_207():
    recv = receiver()
    status, data, _headers = answer(
        recv, alertmanager(firing({"node": "n1", "class": "reboot"}), firing({"node": "n2", "class": "melt"}))
    )
    assert (status, data) == (
        207,
        {
            "events": 1,
            "refused": [
                {
                    "alert": 2,
                    "status": 400,
                    "reason": "Alert 2's label class 'melt' is not one of none, device, reset, reboot, replace.",
                }
            ],
        },
    )
    assert recv.queue.get_nowait() == event({"node": "n1", "gpu": None, "uuid": None, "xid": None, "class": "reboot"})
