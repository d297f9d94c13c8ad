"""Simulated GPUs for labs and CI: the collection's reader of the spec format (docs/simulated-gpus.md),
whose facts become the daemon's `Inventory`.

The format, its defaults and its messages live in one place, `_shared/simulated_spec.py` (the
collection's plugins/module_utils/_simulated_spec.py), so a spec the nvidia_gpu_info module accepts is
one the daemon accepts, with the same GPUs."""

from __future__ import annotations

from gpu_device_plugin._shared import gpu_discovery, simulated_spec
from gpu_device_plugin.inventory import Inventory, from_facts

SpecError = simulated_spec.SpecError


def load(path: str) -> Inventory:
    """The GPUs the spec at `path` describes; SpecError (one sentence naming file and GPU) when it breaks a rule."""
    return from_facts(gpu_discovery.facts_from_spec(simulated_spec.load_spec(path)))


def parse(text: str, source: str) -> Inventory:
    """Like `load`, for the spec's YAML `text`; `source` is the name the messages give it."""
    return from_facts(gpu_discovery.facts_from_spec(simulated_spec.parse_spec_text(text, source)))
