# Unit tests of Docker's rules for the nvidia runtime (daemon.json text in, text out).
from __future__ import annotations

import json

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils import _runtime_docker as rc
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError

RUNTIME = "/usr/bin/nvidia-container-runtime"


def docker(text, state="present", set_as_default=True, memo=None):
    return rc.edit_docker(text, "/etc/docker/daemon.json", "nvidia", RUNTIME, set_as_default, state, memo)


DAEMON = (
    '{\n  "log-driver": "json-file",\n  "exec-opts": ["native.cgroupdriver=systemd"],\n'
    '  "data-root": "/srv/docker"\n}\n'
)


def test_docker_present_keeps_keys_order_and_indent():
    result = docker(DAEMON)
    assert result.changed
    data = json.loads(result.text)
    assert list(data) == ["log-driver", "exec-opts", "data-root", "runtimes", "default-runtime"]
    assert data["runtimes"] == {"nvidia": {"path": RUNTIME, "args": []}}
    assert data["default-runtime"] == "nvidia"
    assert result.text.endswith("}\n")
    assert '\n  "log-driver"' in result.text
    assert result.state_doc == {"added_runtimes": True, "previous_default_runtime": None}
    second = docker(result.text, memo=result.state_doc)
    assert not second.changed
    assert second.state_doc == result.state_doc
    absent = docker(result.text, state="absent", memo=result.state_doc)
    assert json.loads(absent.text) == json.loads(DAEMON)
    assert absent.state_doc is None


KUBEADM_DAEMON = (
    '{\n  "exec-opts": ["native.cgroupdriver=systemd"],\n  "log-driver": "json-file",\n'
    '  "log-opts": {\n    "max-size": "100m"\n  },\n  "storage-driver": "overlay2",\n'
    '  "registry-mirrors": ["https://mirror.example.internal"]\n}\n'
)


def test_docker_edits_only_its_own_members_byte_for_byte():
    present = docker(KUBEADM_DAEMON)
    assert present.text == (
        KUBEADM_DAEMON[: -len("\n}\n")] + ",\n"
        '  "runtimes": {\n    "nvidia": {\n      "path": "/usr/bin/nvidia-container-runtime",\n'
        '      "args": []\n    }\n  },\n  "default-runtime": "nvidia"\n}\n'
    )
    absent = docker(present.text, state="absent", memo=present.state_doc)
    assert absent.text == KUBEADM_DAEMON


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # compact: the file's own separators
        ('{"a":[1,2]}', '{"a":[1,2],"runtimes":{"nvidia":{"path":"%s","args":[]}},"default-runtime":"nvidia"}'),
        # one line with spaces, an existing runtimes object keeps its sibling's bytes
        (
            '{"runtimes": {"crun": {"path": "/c"}}, "b": [1,  2]}',
            '{"runtimes": {"crun": {"path": "/c"}, "nvidia": {"path": "%s", "args": []}}, "b": [1,  2], '
            '"default-runtime": "nvidia"}',
        ),
        # an existing default is replaced in place, nothing else moves
        (
            '{\n\t"default-runtime": "crun",\n\t"runtimes": {"crun": {"path": "/c"}}\n}',
            '{\n\t"default-runtime": "nvidia",\n\t"runtimes": {"crun": {"path": "/c"}, '
            '"nvidia": {"path": "%s", "args": []}}\n}',
        ),
    ],
)
def test_docker_follows_the_file_layout(text, expected):
    present = docker(text)
    assert present.text == expected.replace("%s", RUNTIME)
    assert docker(present.text, state="absent", memo=present.state_doc).text == text


def test_docker_existing_path_is_set_in_place():
    text = '{"runtimes": {"nvidia": {"path": "",  "runtimeArgs": ["--x"]}}}'
    result = docker(text, set_as_default=False)
    assert result.text == text.replace('"path": ""', f'"path": "{RUNTIME}"')


def test_docker_restores_a_previous_default_and_keeps_tabs():
    text = '{\n\t"default-runtime": "crun",\n\t"runtimes": {}\n}'
    present = docker(text)
    assert '\n\t"default-runtime": "nvidia"' in present.text
    absent = docker(present.text, state="absent", memo=present.state_doc)
    assert json.loads(absent.text) == json.loads(text)


def test_docker_absent_without_memo_drops_the_default():
    text = json.dumps({"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": RUNTIME}}})
    result = docker(text, state="absent")
    assert json.loads(result.text) == {"runtimes": {}}
    assert result.default_runtime == "runc"


def test_docker_empty_file_and_unchanged_file():
    result = docker("")
    assert json.loads(result.text)["runtimes"]["nvidia"]["path"] == RUNTIME
    assert '\n    "runtimes"' in result.text
    unchanged = docker('{"a":1}', state="absent")
    assert not unchanged.changed
    assert unchanged.text == '{"a":1}'


def test_docker_set_as_default_false():
    result = docker("{}", set_as_default=False)
    assert "default-runtime" not in json.loads(result.text)
    assert result.default_runtime == "runc"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1, 2]", "must hold a JSON object at the top level, but it holds a array"),
        ('"x"', "holds a string"),
        ("3", "holds a number"),
        ("null", "holds a null"),
        ('{"a": 1,\n "b": }', "is not valid JSON: line 2, column 7"),
        ('{"runtimes": []}', "the runtimes key must be a JSON object, not []."),
        ('{"runtimes": null}', "the runtimes key must be a JSON object, not null."),
        ('{"runtimes": {"nvidia": {"path": "/usr/bin/runc"}}}', 'runtimes.nvidia with path "/usr/bin/runc"'),
        ('{"runtimes": {"nvidia": "x"}}', "runtimes.nvidia with path null"),
    ],
)
def test_docker_bad_input(text, expected):
    with pytest.raises(ConfigError) as err:
        docker(text)
    assert expected in str(err.value)
    assert str(err.value).startswith("/etc/docker/daemon.json")


def test_docker_existing_entry_gets_the_path():
    result = docker('{"runtimes": {"nvidia": {"path": "", "runtimeArgs": ["--x"]}}}')
    assert json.loads(result.text)["runtimes"]["nvidia"] == {"path": RUNTIME, "runtimeArgs": ["--x"]}


# ------------------------------------------------------------------------------------------ helpers


def test_detect_json_indent():
    assert rc.detect_json_indent('{\n   "a": 1\n}') == "   "
    assert rc.detect_json_indent('{"a": 1}') is None
