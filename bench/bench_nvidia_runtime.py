"""Wall time of gpuops.k8s.nvidia_runtime on a large containerd config, run the way Ansible runs it.

Each run is a fresh Python process executing the module with its arguments in a JSON file, as on a
target; the time includes interpreter start, imports, parsing, the edit and the atomic write. A
"change" run edits a fresh copy of the config; a "no-change" run repeats the edit on the result.
Prints the median (and min/max) of several runs of each, plus the in-process edit time alone.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = int(os.environ.get("BENCH_RUNS", "7"))
TARGET_LINES = 2000


def large_config():
    """containerd's default (when installed) grown to about 2,000 lines with mirrors and comments.

    The mirrors go where an operator keeps them, under the registry section, so the file stays in
    the order containerd itself writes.
    """
    containerd = shutil.which("containerd")
    if containerd:
        base = subprocess.run([containerd, "config", "default"], capture_output=True, text=True, check=True).stdout
    else:
        base = (REPO / "tests" / "integration" / "configs" / "v2-mirrors-comments.toml").read_text()
    lines = base.splitlines()
    anchor = next((n + 1 for n, line in enumerate(lines) if line.strip().endswith(".registry.mirrors]")), len(lines))
    mirrors = []
    i = 0
    while len(lines) + len(mirrors) < TARGET_LINES:
        mirrors += [
            "",
            f"        # mirror {i}: pulls for registry-{i}.example.internal go through the site cache",
            f'        [plugins."io.containerd.grpc.v1.cri".registry.mirrors."registry-{i}.example.internal"]',
            f'          endpoint = ["https://cache-{i}.example.internal", "https://registry-{i}.example.internal"]',
        ]
        i += 1
    return "\n".join(lines[:anchor] + mirrors + lines[anchor:]) + "\n"


def run_module(collection_root, args_file):
    env = dict(os.environ, PYTHONPATH=str(collection_root))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(REPO / "plugins" / "modules" / "nvidia_runtime.py"), str(args_file)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    elapsed = time.perf_counter() - start
    result = json.loads(proc.stdout)
    if result.get("failed"):
        raise SystemExit("module failed: {}".format(result.get("msg")))
    return elapsed, result["changed"]


def summary(label, times):
    median, low, high = (statistics.median(times) * 1000, min(times) * 1000, max(times) * 1000)
    return f"{label:<34} median {median:7.1f} ms   min {low:7.1f}   max {high:7.1f}   ({len(times)} runs)"


def main():
    work = Path(tempfile.mkdtemp(prefix="gpuops-bench-runtime-"))
    try:
        (work / "ansible_collections" / "gpuops").mkdir(parents=True)
        (work / "ansible_collections" / "gpuops" / "k8s").symlink_to(REPO)
        text = large_config()
        config = work / "config.toml"
        args_file = work / "args.json"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"runtime": "containerd", "config_path": str(config)}}))

        change, no_change = [], []
        for _run in range(RUNS):
            config.write_text(text)
            elapsed, changed = run_module(work, args_file)
            assert changed, "a change run reported no change"
            change.append(elapsed)
        for _run in range(RUNS):
            elapsed, changed = run_module(work, args_file)
            assert not changed, "a repeated run reported a change"
            no_change.append(elapsed)

        sys.path.insert(0, str(work))
        from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_containerd import edit_containerd
        from ansible_collections.gpuops.k8s.plugins.module_utils._toml_text import TOML_PARSER

        edited = config.read_text()
        core_change, core_same = [], []
        for _run in range(RUNS):
            start = time.perf_counter()
            edit_containerd(text, "config.toml", "nvidia", "/usr/bin/nvidia-container-runtime", True, "present")
            core_change.append(time.perf_counter() - start)
            start = time.perf_counter()
            edit_containerd(edited, "config.toml", "nvidia", "/usr/bin/nvidia-container-runtime", True, "present")
            core_same.append(time.perf_counter() - start)

        print(
            f"nvidia_runtime on a {len(text.splitlines())}-line containerd config ({len(text) // 1024} KiB), "
            f"Python {sys.version.split()[0]}, parser {TOML_PARSER}"
        )
        print(summary("module process, change run", change))
        print(summary("module process, no-change run", no_change))
        print(summary("edit only (in process), change", core_change))
        print(summary("edit only (in process), no change", core_same))
        print(
            f"ratio change/no-change (process): {statistics.median(change) / statistics.median(no_change):.2f}; "
            f"edit share of a change run: {statistics.median(core_change) / statistics.median(change):.0%}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
