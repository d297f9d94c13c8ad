"""The DRA mode across restarts (checkpoint, reconcile, a corrupt checkpoint), its settings, and its
exclusivity with the device-plugin mode; over real unix-socket gRPC with the plugin-watcher double."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
from api_server_double import DRIVER
from gpu_device_plugin import config
from harness import DaemonThread, KubeletDouble, make_config, wait_until


def test_restart_rewrites_the_cdi_specs_a_reboot_removed_and_drops_claims_that_are_gone(dra):
    dra.start()
    kept = dra.allocate("kept", "5e1f0000-0000-4000-8000-00000000006b", ["gpu-0", "gpu-1"])
    gone = dra.allocate("gone", "5e1f0000-0000-4000-8000-000000000067", ["gpu-2"])
    replaced = dra.allocate("replaced", "5e1f0000-0000-4000-8000-000000007231", ["gpu-3"])
    answers = dra.kubelet.prepare(DRIVER, [kept, gone, replaced])
    assert {uid: a.error for uid, a in answers.items()} == {
        "5e1f0000-0000-4000-8000-00000000006b": "",
        "5e1f0000-0000-4000-8000-000000000067": "",
        "5e1f0000-0000-4000-8000-000000007231": "",
    }
    spec_before = dra.spec_of("5e1f0000-0000-4000-8000-00000000006b")
    dra.stop_daemons()
    # A reboot: /var/run/cdi is empty again. Meanwhile one claim was deleted, one replaced.
    shutil.rmtree(dra.cdi)
    os.mkdir(dra.cdi)
    dra.claims.delete("default", "gone")
    dra.allocate("replaced", "5e1f0000-0000-4000-8000-000000007232", ["gpu-3"])
    dra.start()
    assert dra.wait_reconciled()
    assert sorted(os.listdir(dra.cdi)) == ["gpuops.k8s-gpu_5e1f0000-0000-4000-8000-00000000006b.json"]
    assert dra.spec_of("5e1f0000-0000-4000-8000-00000000006b") == spec_before
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert sorted(json.load(handle)["claims"]) == ["5e1f0000-0000-4000-8000-00000000006b"]
    # The kept claim is still prepared (same IDs); its devices are still refused to others.
    again = dra.kubelet.prepare(DRIVER, [kept])["5e1f0000-0000-4000-8000-00000000006b"]
    assert [list(d.cdi_device_ids) for d in again.devices] == [
        ["gpuops.k8s/gpu=5e1f0000-0000-4000-8000-00000000006b-gpu-0"],
        ["gpuops.k8s/gpu=5e1f0000-0000-4000-8000-00000000006b-gpu-1"],
    ]
    thief = dra.allocate("thief", "5e1f0000-0000-4000-8000-000000000074", ["gpu-1"])
    assert (
        "already prepared for ResourceClaim default/kept"
        in dra.kubelet.prepare(DRIVER, [thief])["5e1f0000-0000-4000-8000-000000000074"].error
    )
    # The device of the dropped claim is free again.
    new = dra.allocate("new", "5e1f0000-0000-4000-8000-00000000006e", ["gpu-2"])
    assert dra.kubelet.prepare(DRIVER, [new])["5e1f0000-0000-4000-8000-00000000006e"].error == ""


def test_restart_keeps_claims_when_the_api_server_cannot_be_asked(dra):
    dra.start()
    claim = dra.allocate("kept", "5e1f0000-0000-4000-8000-00000000006b", ["gpu-0"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-00000000006b"].error == ""
    dra.stop_daemons()
    dra.claims.delete("default", "kept")
    dra.claims.unreachable = True
    dra.start()
    assert os.listdir(dra.cdi) == ["gpuops.k8s-gpu_5e1f0000-0000-4000-8000-00000000006b.json"]
    assert dra.kubelet.unprepare(DRIVER, [claim]) == {"5e1f0000-0000-4000-8000-00000000006b": ""}
    assert os.listdir(dra.cdi) == []


def test_specs_of_no_prepared_claim_are_removed_at_start(dra):
    with open(os.path.join(dra.cdi, "gpuops.k8s-gpu_5e1f0000-0000-4000-8000-6f727068616e.json"), "w") as handle:
        handle.write("{}")
    with open(os.path.join(dra.cdi, "other-vendor.json"), "w") as handle:
        handle.write("{}")
    dra.start()
    assert os.listdir(dra.cdi) == ["other-vendor.json"]


def test_a_corrupt_checkpoint_is_set_aside_and_the_claims_are_rebuilt_from_the_cdi_specs(dra, caplog):
    dra.start()
    claim = dra.allocate("held", "5e1f0000-0000-4000-8000-000000000068", ["gpu-4"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000068"].error == ""
    dra.stop_daemons()
    with open(dra.checkpoint, "r+", encoding="utf-8") as handle:
        text = handle.read().replace("gpu-4", "gpu-5")  # edited by hand: the checksum no longer matches
        handle.seek(0)
        handle.write(text)
    with caplog.at_level(logging.ERROR, logger="gpu_device_plugin"):
        dra.start()
    sentences = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert len(sentences) == 1 and "checksum does not match" in sentences[0] and "moved to" in sentences[0]
    aside = [n for n in os.listdir(dra.plugin_dir) if n.startswith("checkpoint.json.corrupt-")]
    assert len(aside) == 1
    # Rebuilt from the spec: gpu-4 (not the edited gpu-5) is held by the claim.
    thief = dra.allocate("thief", "5e1f0000-0000-4000-8000-000000000074", ["gpu-4"])
    assert (
        "default/held (UID 5e1f0000-0000-4000-8000-000000000068)"
        in dra.kubelet.prepare(DRIVER, [thief])["5e1f0000-0000-4000-8000-000000000074"].error
    )
    assert dra.kubelet.unprepare(DRIVER, [claim]) == {"5e1f0000-0000-4000-8000-000000000068": ""}
    assert os.listdir(dra.cdi) == []


def test_garbage_in_the_checkpoint_still_lets_the_daemon_serve(dra):
    os.makedirs(dra.plugin_dir)
    with open(dra.checkpoint, "w") as handle:
        handle.write("{not json")
    dra.start()
    claim = dra.allocate("fresh", "5e1f0000-0000-4000-8000-000000000066", ["gpu-0"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000066"].error == ""
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert sorted(json.load(handle)["claims"]) == ["5e1f0000-0000-4000-8000-000000000066"]


def test_dra_mode_does_not_register_the_device_plugin(dra):
    kubelet = KubeletDouble(os.path.join(dra.dp_dir, "kubelet.sock"))
    kubelet.start()
    try:
        dra.start()
        assert not kubelet.wait(lambda: bool(kubelet.registrations), timeout=0.5)
        assert os.listdir(dra.dp_dir) == ["kubelet.sock"]
    finally:
        kubelet.stop()


def test_device_plugin_mode_does_not_register_the_dra_plugin(node, dra):
    settings = make_config(
        node.kubelet_socket, node.spec, plugin_registry_dir=dra.registry, kubelet_plugins_dir=dra.plugins
    )
    daemon = DaemonThread(settings, api_side=lambda _c: pytest.fail("device-plugin mode asked for the API side"))
    daemon.start()
    try:
        assert node.kubelet.wait(lambda: node.kubelet.registered("nvidia.com/gpu") == 1)
        assert os.listdir(dra.registry) == [] and os.listdir(dra.plugins) == []
    finally:
        daemon.stop()


def test_dra_mode_needs_the_node_name():
    with pytest.raises(config.ConfigError, match="needs the node's name"):
        config.resolve({"allocation_mode": "dra", "backend": "simulated", "simulated_spec": "x"}, {})
    settings = config.resolve(
        {"backend": "simulated", "simulated_spec": "x"},
        {"GPU_DEVICE_PLUGIN_ALLOCATION_MODE": "dra", "NODE_NAME": "n1", "GPU_DEVICE_PLUGIN_CDI_DIR": "/x/cdi"},
    )
    assert (settings.allocation_mode, settings.node_name, settings.cdi_dir) == ("dra", "n1", "/x/cdi")
    assert settings.registration_socket == "/var/lib/kubelet/plugins_registry/gpu.gpuops.k8s-reg.sock"
    assert settings.dra_socket == "/var/lib/kubelet/plugins/gpu.gpuops.k8s/dra.sock"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"allocation_mode": "both"}, "allocation mode must be device-plugin or dra"),
        ({"driver_name": "nvidia.com/gpu"}, "driver name must be a lowercase DNS subdomain"),
        ({"driver_name": "gpu"}, "driver name must be a lowercase DNS subdomain"),
    ],
)
def test_bad_dra_settings_are_one_sentence(values, words):
    with pytest.raises(config.ConfigError, match=words):
        config.resolve({"backend": "simulated", "simulated_spec": "x", "node_name": "n", **values}, {})


def test_the_config_file_and_flags_set_the_dra_settings(tmp_path):
    from gpu_device_plugin import cli

    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\ngpuops:\n  allocationMode: dra\n  driverName: gpu.example.org\n  nodeName: n2\n"
        "  cdiDir: /etc/cdi\n  pluginRegistryDir: /r\n  kubeletPluginsDir: /p\n  kubeconfig: /k\n"
    )
    args = cli.parser().parse_args(["--config-file", str(path), "--node-name", "n3", "--backend", "nvml"])
    settings = cli.load_config(args, {})
    assert (settings.allocation_mode, settings.driver_name, settings.node_name) == ("dra", "gpu.example.org", "n3")
    assert (settings.cdi_dir, settings.kubeconfig, settings.dra_socket) == (
        "/etc/cdi",
        "/k",
        "/p/gpu.example.org/dra.sock",
    )
    args = cli.parser().parse_args(["--allocation-mode", "device-plugin"])
    assert cli.load_config(args, {}).allocation_mode == "device-plugin"


def test_without_the_api_side_dra_mode_stops_with_one_sentence(dra, caplog):
    def missing(_config):
        raise ImportError("No module named 'gpu_device_plugin.dra.kubeapi'")

    daemon = DaemonThread(dra.settings(), api_side=missing)
    with caplog.at_level(logging.ERROR, logger="gpu_device_plugin"):
        daemon.start()
        assert daemon.wait_exit() == 1
    assert any("dra mode needs the API server client" in r.getMessage() for r in caplog.records)
    assert os.listdir(dra.registry) == []


def test_the_slices_are_reconciled_periodically_and_a_failing_reconcile_keeps_the_daemon_serving(
    dra, monkeypatch, caplog
):
    from gpu_device_plugin.dra import node

    monkeypatch.setattr(node, "SLICE_RECONCILE_SECONDS", 0.05)
    dra.publisher.reconcile_error = ConnectionRefusedError(111, "API server away")
    dra.start()
    assert wait_until(lambda: dra.publisher.reconciles >= 2)
    assert "cannot reconcile the node's ResourceSlices" in caplog.text
    # Still serving: a claim is prepared while reconciles keep failing.
    claim = dra.allocate("during", "5e1f0000-0000-4000-8000-000000000064", ["gpu-0"])
    assert dra.kubelet.prepare(DRIVER, [claim])["5e1f0000-0000-4000-8000-000000000064"].error == ""
    dra.publisher.reconcile_error = None
    seen = dra.publisher.reconciles
    assert wait_until(lambda: dra.publisher.reconciles >= seen + 2)


def _prepared_claims(dra, count: int) -> list[tuple]:
    dra.start()
    claims = [dra.allocate(f"c{i}", f"5e1f0000-0000-4000-8000-0000000001{i:02d}", [f"gpu-{i}"]) for i in range(count)]
    assert {a.error for a in dra.kubelet.prepare(DRIVER, claims).values()} == {""}
    dra.stop_daemons()
    return claims


def _checkpoint_uids(dra) -> list[str]:
    with open(dra.checkpoint, encoding="utf-8") as handle:
        return sorted(json.load(handle)["claims"])


def test_with_the_api_server_not_answering_the_sockets_serve_at_once_and_claims_are_reconciled_when_it_does(dra):
    import threading

    claims = _prepared_claims(dra, 5)
    gone = claims[0]
    dra.claims.delete("default", "c0")  # deleted while the daemon was down
    hang = threading.Event()  # every API call waits until it is set: no timeout can end the wait
    dra.claims.hang = dra.publisher.hang = hang
    published = len(dra.publisher.calls)
    try:
        # Registered (both sockets serving) while every read of the 5 prepared claims still waits.
        dra.start()
        answers = dra.kubelet.prepare(DRIVER, claims[1:])
        assert {uid: a.error for uid, a in answers.items()} == {c[2]: "" for c in claims[1:]}
        assert _checkpoint_uids(dra) == sorted(c[2] for c in claims)  # nothing reconciled yet
        assert len(dra.publisher.calls) == published
    finally:
        hang.set()
    # The API server answers: the claim deleted meanwhile is unprepared, the slice is published.
    assert wait_until(lambda: _checkpoint_uids(dra) == sorted(c[2] for c in claims[1:]))
    assert wait_until(lambda: dra.spec_of(gone[2]) is None)  # removed after the checkpoint entry
    assert all(dra.spec_of(c[2]) is not None for c in claims[1:])
    assert wait_until(lambda: len(dra.publisher.calls) > published)


def test_claims_the_api_server_could_not_be_asked_about_are_reconciled_when_it_is_back(dra, monkeypatch):
    from gpu_device_plugin.dra import node

    monkeypatch.setattr(node, "CLAIM_RECONCILE_RETRY_SECONDS", 0.05)
    claims = _prepared_claims(dra, 3)
    dra.claims.delete("default", "c2")
    dra.claims.unreachable = True
    dra.claims.reads.clear()
    dra.start()
    assert wait_until(lambda: len(dra.claims.reads) >= 2)  # asked, and asked again
    assert _checkpoint_uids(dra) == sorted(c[2] for c in claims)
    dra.claims.unreachable = False
    # The gone claim is unprepared: out of the checkpoint, then its CDI spec removed (a crash between the two
    # leaves a spec of no claim, which the next start removes).
    assert wait_until(lambda: _checkpoint_uids(dra) == sorted(c[2] for c in claims[:2]))
    assert wait_until(lambda: dra.spec_of(claims[2][2]) is None)
    reads = len(dra.claims.reads)
    assert not wait_until(lambda: len(dra.claims.reads) > reads, timeout=0.5)  # done: not asked again


def test_dra_readyz_waits_for_the_registration_and_the_published_slice(dra):
    import threading
    import urllib.error
    import urllib.request

    def get(url: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    hang = threading.Event()
    dra.publisher.hang = hang  # the API server does not answer yet
    try:
        daemon = dra.start(metrics_address="127.0.0.1:0")
        base = f"http://{daemon.daemon._http.address}"
        assert get(base + "/healthz")[0] == 200  # alive and serving the kubelet
        code, detail = get(base + "/readyz")
        assert code == 503 and detail["ready"] is False
        assert detail["not_ready"] == ["the ResourceSlice has not been published yet"], detail
    finally:
        hang.set()
    assert wait_until(lambda: get(base + "/readyz")[0] == 200)
    code, detail = get(base + "/readyz")
    assert detail["registered"] is True and detail["slice_published"] is True and detail["not_ready"] == []
