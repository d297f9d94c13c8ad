"""A real Prometheus (Debian's prometheus 2.42, installed by scripts/bootstrap.sh) scraping the daemon's dcgm metrics
on the lab's nodes, asked through its HTTP API as a Grafana dashboard asks it; and NVIDIA's dashboard's panel queries
(tests/fixtures/dcgm-exporter-dashboard.yaml) with its template variables filled in as Grafana fills them."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "tests" / "fixtures" / "dcgm-exporter-dashboard.yaml"
JOB = "gpuops-dcgm"
# A scrape every 2 s, beside the lab's reading of the GPUs every 2 s (device_plugin_dcgm_interval).
SCRAPE_SECONDS = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """`prometheus` on loopback with a static target per node (``targets``: node -> HOST:PORT, the series'
    `instance`), its data in ``work``."""

    def __init__(self, work: Path, targets: dict[str, str]) -> None:
        self.work = work
        self.targets = targets
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: scripts/bootstrap.sh installs Debian's package"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": list(self.targets.values())}]}],
        }
        path = self.work / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        subprocess.run(["promtool", "check", "config", str(path)], check=True, capture_output=True)
        log = open(self.work / "prometheus.log", "wb")  # noqa: SIM115 (the process's, closed with it)
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={path}",
                f"--storage.tsdb.path={self.work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.wait_until("Prometheus ready", self.ready, timeout=60)
        return self

    def ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, (self.work / "prometheus.log").read_text()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def api(self, path: str, **params: Any) -> Any:
        """One call of the HTTP API (GET /api/v1/<path>): its data; a failed query raises with Prometheus' error."""
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's series: (labels, value) each."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def label_values(self, label: str, match: str, seconds: float = 30) -> list[str]:
        """Grafana's `label_values(METRIC, LABEL)`: the label's values on the metric's series over the dashboard's
        time range (here the last ``seconds``; the session's earlier modules wrote series of other specs)."""
        now = time.time()
        return list(self.api(f"label/{label}/values", **{"match[]": match, "start": now - seconds, "end": now}))

    def targets_up(self) -> dict[str, float]:
        """Each target's `up` (1: the last scrape succeeded)."""
        return {labels["instance"]: value for labels, value in self.query(f'up{{job="{JOB}"}}')}

    @staticmethod
    def wait_until(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.5)


def dashboard() -> dict[str, Any]:
    """NVIDIA's dashboard 12239: its source, template variables and panel queries (the fixture's, read from
    dcgm-exporter's repository)."""
    return yaml.safe_load(DASHBOARD.read_text())


def filled(expr: str, variables: dict[str, list[str]]) -> str:
    """A panel query with each `$name` replaced as Grafana's Prometheus data source replaces a multi-value variable
    set to All inside a regex matcher: each value's regex characters escaped (a backslash doubled in PromQL's
    string), the values joined into one alternation."""
    for name, values in sorted(variables.items(), key=lambda item: -len(item[0])):
        escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value) for value in values]
        expr = expr.replace(f"${name}", "(" + "|".join(escaped) + ")")
    return expr
