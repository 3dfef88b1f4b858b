"""Class lists and masks: equal to timm's shipped files and to the sha256 values in the shared facts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from robustbench_pid.core import imagenet_info as ii

FACTS = Path("/work/shared/reference/imagenet_facts.json")
SHA = {  # from /work/shared/reference/README.md
    "imagenet_1k_wnids_sorted": "70002b0ff5de60a3a17a82dbfcff291931f96225ddf941ad2e182fc39e183d15",
    "imagenet_a_indices": "e81223a35add6e78f9afe6f215652c1926ebefe1d8efc26c6e923d7ac9143937",
    "imagenet_a_wnids": "9826a24166e74ce62fb87b27889874ca26917542c745712309d6e25855d63bc2",
    "imagenet_r_indices": "91e09d2ff0a002104bc0d37a892a7e75ffc2cc0db47b2b506047a3493b9116d2",
    "imagenet_r_wnids": "a6a0729f7a99230280639cab6e51e01485a3b41a676ea35621a501c9d6e83ca4",
    "imagenet_o_indices": "d139a162f56be82c16ccf2da29f6433c8e0bb021b3aa2694b0665f262fd4ff95",
    "imagenet_o_wnids": "29575307f17b6cb040fcd04fee2b5b7b0e43f7c55072fb05d4b33cc39fc60978",
}


def test_lists_match_published_sha256():
    assert ii.list_sha256(list(ii.imagenet_wnids())) == SHA["imagenet_1k_wnids_sorted"]
    for k in "aro":
        assert ii.list_sha256(list(ii.subset_wnids(k))) == SHA[f"imagenet_{k}_wnids"]
        assert ii.list_sha256(list(ii.subset_indices(k))) == SHA[f"imagenet_{k}_indices"]
        assert len(ii.subset_indices(k)) == 200 and len(set(ii.subset_indices(k))) == 200


def test_masks_equal_timms_files():
    d = ii._timm_info_dir()
    for k in "ar":
        shipped = [int(t) for t in (d / f"imagenet_{k}_indices.txt").read_text().split()]
        assert list(ii.subset_indices(k)) == shipped
        assert list(ii.subset_wnids(k)) == (d / f"imagenet_{k}_synsets.txt").read_text().split()
    assert list(ii.imagenet_wnids()) == (d / "imagenet_synsets.txt").read_text().split()


@pytest.mark.skipif(not FACTS.is_file(), reason="shared reference facts not present on this machine")
def test_constants_match_shared_facts():
    f = json.loads(FACTS.read_text())
    assert list(ii.CORRUPTIONS_15) == f["imagenet_c_corruptions_15"]
    assert list(ii.CORRUPTIONS_EXTRA) == f["imagenet_c_extra_4"]
    assert ii.ALEXNET_MEAN_ERR == f["alexnet_mean_err_per_corruption"]
    assert ii.ALEXNET_CLEAN_ERR == f["alexnet_clean_err"]
    for k in "aro":
        assert list(ii.subset_indices(k)) == f[f"imagenet_{k}_indices"]
    assert list(ii.subset_wnids("o")) == f["imagenet_o_wnids"]
    assert ii.IMAGENET_O_CHANCE_AUPR == pytest.approx(16.6667, abs=1e-4)


def test_o_list_is_package_data():
    from importlib import resources

    text = (resources.files("robustbench_pid.core") / "_data" / "imagenet_o_wnids.txt").read_text()
    assert ii.list_sha256(text.split()) == SHA["imagenet_o_wnids"]
