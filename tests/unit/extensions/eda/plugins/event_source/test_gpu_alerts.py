"""The gpu_alerts event source's reading of request bodies, settings and tokens (no server is started here;
tests/integration/test_eda_rulebook.py runs the source inside ansible-rulebook over real HTTP)."""

import json

import pytest
from ansible_collections.gpuops.k8s.extensions.eda.plugins.event_source.gpu_alerts import (
    CLASSES,
    AlertError,
    _authorized,
    _settings,
    event,
    parse_alerts,
)


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


def test_a_daemon_alert_becomes_one_normalised_alert():
    assert parse_alerts(body(DAEMON_ALERT)) == [
        {
            "node": "gpu-node-1",
            "gpu": 3,
            "uuid": "GPU-5b3a1f0e-0000-4000-8000-000000000003",
            "xid": 79,
            "class": "reboot",
        }
    ]


def test_the_event_limits_actions_to_the_alerting_node():
    (alert,) = parse_alerts(body(DAEMON_ALERT))
    assert event(alert) == {"gpu_alert": alert, "meta": {"hosts": "gpu-node-1"}}


@pytest.mark.parametrize("klass", CLASSES)
def test_every_class_is_accepted(klass):
    (alert,) = parse_alerts(body(dict(DAEMON_ALERT, **{"class": klass})))
    assert alert["class"] == klass


def test_gpu_uuid_and_xid_may_be_absent():
    (alert,) = parse_alerts(body({"node": "n1", "class": "reset"}))
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
    alerts = parse_alerts(
        alertmanager(
            firing({"node": "gpu-node-2", "gpu": "GPU-aaaa", "class": "reset", "xid": "48"}),
            firing({"node": "gpu-node-3", "gpu": "1", "uuid": "GPU-bbbb", "class": "replace"}),
        )
    )
    assert alerts == [
        {"node": "gpu-node-2", "gpu": None, "uuid": "GPU-aaaa", "xid": 48, "class": "reset"},
        {"node": "gpu-node-3", "gpu": 1, "uuid": "GPU-bbbb", "xid": None, "class": "replace"},
    ]


def test_a_mig_device_uuid_in_the_gpu_label_is_a_uuid_too():
    (alert,) = parse_alerts(alertmanager(firing({"node": "n1", "gpu": "MIG-cccc", "class": "reset"})))
    assert (alert["gpu"], alert["uuid"]) == (None, "MIG-cccc")


def test_resolved_alerts_make_no_alert():
    assert parse_alerts(alertmanager(firing({"node": "n1", "class": "reboot"}, status="resolved"))) == []
    assert parse_alerts(
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
        (body({"node": "n1"}), "The alert's class None is not one of none, device, reset, reboot, replace."),
        (
            body({"node": "n1", "class": "REBOOT"}),
            "The alert's class 'REBOOT' is not one of none, device, reset, reboot, replace.",
        ),
        (
            body({"node": "n1", "class": "reset", "xid": 79.5}),
            "The alert's xid must be a non-negative integer, not 79.5.",
        ),
        (
            body({"node": "n1", "class": "reset", "xid": True}),
            "The alert's xid must be a non-negative integer, not True.",
        ),
        (body({"node": "n1", "class": "reset", "gpu": -1}), "The alert's gpu must be a non-negative integer, not -1."),
        (body({"node": "n1", "class": "reset", "uuid": ""}), "The alert's uuid must be a non-empty string."),
        (body({"alerts": {"labels": {}}}), "The notification's alerts must be a list."),
        (body({"alerts": ["x"]}), "Alert 1 must be an object with a labels object."),
        (
            alertmanager(firing({"node": "n1", "class": "reboot"}), firing({"node": "n2", "class": "melt"})),
            "Alert 2's label class 'melt' is not one of none, device, reset, reboot, replace.",
        ),
        (
            alertmanager(firing({"node": "n1", "class": "reboot", "xid": "x79"})),
            "Alert 1's label xid must be a non-negative integer, not 'x79'.",
        ),
    ],
)
def test_a_bad_body_is_one_sentence(raw, sentence):
    with pytest.raises(AlertError) as raised:
        parse_alerts(raw)
    assert str(raised.value) == sentence


def test_one_bad_alert_rejects_the_whole_notification():
    with pytest.raises(AlertError):
        parse_alerts(alertmanager(firing({"node": "n1", "class": "reboot"}), firing({"class": "reboot"})))


def test_settings_defaults_and_a_port_given_as_text():
    assert _settings({}) == ("127.0.0.1", 5000, None)
    assert _settings({"host": "0.0.0.0", "port": "5011", "token": "s3cret"}) == ("0.0.0.0", 5011, "s3cret")
    assert _settings({"token": ""}) == ("127.0.0.1", 5000, None)


@pytest.mark.parametrize(
    "args, sentence",
    [
        ({"port": 0}, "gpu_alerts: port must be an integer from 1 to 65535, not 0."),
        ({"port": "http"}, "gpu_alerts: port must be an integer from 1 to 65535, not 'http'."),
        ({"port": True}, "gpu_alerts: port must be an integer from 1 to 65535, not True."),
        ({"host": ""}, "gpu_alerts: host must be a non-empty string."),
        ({"token": 12}, "gpu_alerts: token must be a string."),
    ],
)
def test_bad_settings_are_one_sentence(args, sentence):
    with pytest.raises(ValueError) as raised:
        _settings(args)
    assert str(raised.value) == sentence


@pytest.mark.parametrize(
    "header, token, allowed",
    [
        (None, None, True),
        ("Bearer anything", None, True),
        ("Bearer s3cret", "s3cret", True),
        ("bearer s3cret", "s3cret", True),
        (None, "s3cret", False),
        ("Bearer wrong", "s3cret", False),
        ("Basic s3cret", "s3cret", False),
        ("s3cret", "s3cret", False),
        ("Bearer ", "s3cret", False),
    ],
)
def test_the_token_is_a_bearer_token(header, token, allowed):
    assert _authorized(header, token) is allowed
