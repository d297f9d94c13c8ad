"""The kubelet double's report, which molecule's verify reads while the double writes it."""

from __future__ import annotations

import json
import threading

from gpu_device_plugin.api import api_pb2
from kubelet_double import KubeletDouble


def test_the_report_is_one_whole_report_while_several_threads_write_it(tmp_path):
    """The Register handler and each resource's ListAndWatch thread write the report: a reader sees one report, and
    no writer fails, however their writes fall."""
    report = tmp_path / "report.json"
    double = KubeletDouble(str(tmp_path / "kubelet.sock"), str(report))
    errors: list[str] = []
    done = threading.Event()

    def writer(number: int) -> None:
        try:
            for count in range(150):
                with double.cond:
                    # Reports of different lengths, so that two written over each other do not parse.
                    double.registrations[:] = [
                        api_pb2.RegisterRequest(version="v1beta1", resource_name=f"nvidia.com/r{number}-{i}")
                        for i in range((count * 7 + number) % 40)
                    ]
                double.write_report()
        except OSError as exc:
            errors.append(f"writer {number}: {exc!r}")

    def reader() -> None:
        while not done.is_set():
            try:
                json.loads(report.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except ValueError as exc:
                errors.append(f"reader: {exc}")

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    watching = threading.Thread(target=reader)
    watching.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    watching.join()
    assert not errors, errors[:5]
    assert "registrations" in json.loads(report.read_text(encoding="utf-8"))
