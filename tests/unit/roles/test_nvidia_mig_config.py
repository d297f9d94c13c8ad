# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The mig-parted config the nvidia_mig role ships (roles/nvidia_mig/files/config-default.yaml): every name is read
by the module's reader and, on each product the collection knows, either lays out a GPU the product can hold or,
where the name is another product's, leaves the GPU alone or is refused before anything is written - as the
module plans it against the product's GPU-instance profiles (the facts the lab's mock NVML library serves)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_config import parse_config, select
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_plan import (
    LayoutRefused,
    check_fit,
    gpu_instances,
)
from ansible_collections.gpuops.k8s.tests.unit.plugins.module_utils.mig_products import (
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H200,
    gpu,
    product,
)

CONFIG = Path(__file__).resolve().parents[3] / "roles" / "nvidia_mig" / "files" / "config-default.yaml"
DOCUMENT = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
EVERY = (A100_40GB, A100_80GB, H100_80GB, H200)
GB80 = (A100_80GB, H100_80GB)
# What each name lays out on the products it is for (the MIG devices per GPU); on every other product the GPU is
# left alone or the layout is refused.
LAYOUTS = {
    "all-disabled": {p: None for p in EVERY},
    "all-enabled": {p: {} for p in EVERY},
    "all-1g.5gb": {A100_40GB: {"1g.5gb": 7}},
    "all-1g.5gb.me": {A100_40GB: {"1g.5gb+me": 1}},
    "all-2g.10gb": {A100_40GB: {"2g.10gb": 3}},
    "all-3g.20gb": {A100_40GB: {"3g.20gb": 2}},
    "all-4g.20gb": {A100_40GB: {"4g.20gb": 1}},
    "all-7g.40gb": {A100_40GB: {"7g.40gb": 1}},
    "all-1g.10gb": {A100_40GB: {"1g.10gb": 4}, A100_80GB: {"1g.10gb": 7}, H100_80GB: {"1g.10gb": 7}},
    "all-1g.10gb.me": {p: {"1g.10gb+me": 1} for p in GB80},
    "all-1g.20gb": {p: {"1g.20gb": 4} for p in GB80},
    "all-2g.20gb": {p: {"2g.20gb": 3} for p in GB80},
    "all-3g.40gb": {p: {"3g.40gb": 2} for p in GB80},
    "all-4g.40gb": {p: {"4g.40gb": 1} for p in GB80},
    "all-7g.80gb": {p: {"7g.80gb": 1} for p in GB80},
    "all-1g.18gb": {H200: {"1g.18gb": 7}},
    "all-1g.18gb.me": {H200: {"1g.18gb+me": 1}},
    "all-1g.35gb": {H200: {"1g.35gb": 4}},
    "all-2g.35gb": {H200: {"2g.35gb": 3}},
    "all-3g.71gb": {H200: {"3g.71gb": 2}},
    "all-4g.71gb": {H200: {"4g.71gb": 1}},
    "all-7g.141gb": {H200: {"7g.141gb": 1}},
    "all-balanced": {
        A100_40GB: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        A100_80GB: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        H100_80GB: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        H200: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    },
}


def outcome(name: str, product_name: str) -> str | dict[str, int] | None:
    """What config NAME does to one GPU of the product: "alone" (no entry names it), "refused", None (MIG off) or
    the MIG devices it gets, planned and checked as the module does before it writes."""
    chosen = select(parse_config(DOCUMENT, name, str(CONFIG)), [gpu(0, product_name)], name)
    if not chosen:
        return "alone"
    entry = chosen[0][1]
    if not entry["mig_enabled"]:
        return None
    planned = gpu_instances(entry["mig_devices"])
    try:
        check_fit(product(product_name), planned)
    except LayoutRefused:
        return "refused"
    # The file names plain profiles only: one GPU instance per MIG device.
    return dict(Counter(instance.profile for instance in planned))


def test_the_file_names_exactly_the_configs_the_role_documents():
    assert sorted(DOCUMENT["mig-configs"]) == sorted(LAYOUTS)
    assert DOCUMENT["version"] == "v1"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("product_name", EVERY)
def test_each_name_lays_out_the_products_it_is_for_and_no_other(name: str, product_name: str):
    got = outcome(name, product_name)
    if product_name in LAYOUTS[name]:
        assert got == LAYOUTS[name][product_name]
    else:
        assert got in ("alone", "refused")
