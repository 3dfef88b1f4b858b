"""`robustbench-pid models`: aliases, our timm architectures with arguments and defaults, baselines."""
from __future__ import annotations

import json

import pytest

from robustbench_pid.cli import main


def test_text_listing(capsys: pytest.CaptureFixture) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for alias in ("deit", "pid_deit", "symvit", "rpc_symvit", "rpc_symvit_all"):
        assert f"\n  {alias} " in out
    assert "imagenet  rpc_symvit_tiny_patch16_224      weights: needs --checkpoint" in out
    assert "digits    pid_deit_digits_patch4_32        weights: embedded:pid_deit_digits" in out
    assert "lambda_p=0.8, lambda_i=0.5, lambda_d=0.05, beta=0.1, first_derivative='zero-error'" in out
    assert "pap_iterations=6, pap_lambda=4, rpc_layers='first', pap_convention='authors'" in out
    assert "--model timm:NAME" in out and "embedded:deit_digits" in out and "timm:NAME" in out
    # the CNN: digits only, and no patch, width, blocks or heads to show
    assert "digits    cnn_digits_32                    weights: embedded:cnn_at_digits" in out
    assert ("  cnn_digits_32                    SmallCNN                 32x32 p-   d-    L-   h-      10 cls   "
            "0.19M") in out


def test_json_listing_has_sizes_and_arguments(capsys: pytest.CaptureFixture) -> None:
    assert main(["models", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    archs = {a["arch"]: a for a in info["architectures"]}
    base = {a["arch"]: a for a in info["baselines"]}
    assert {"pid_deit_tiny_patch16_224", "pid_deit_small_patch16_224", "pid_deit_base_patch16_224",
            "symvit_tiny_patch16_224", "rpc_symvit_tiny_patch16_224", "symvit_digits_patch4_32"} <= set(archs)
    tiny = archs["pid_deit_tiny_patch16_224"]
    assert (tiny["embed_dim"], tiny["depth"], tiny["num_heads"], tiny["patch_size"]) == (192, 12, 3, [16, 16])
    assert tiny["params_m"] == base["deit_tiny_patch16_224"]["params_m"] == 5.72  # PID adds no parameters
    # SymViT-tiny: the qkv projection is 2*dim instead of 3*dim -> 12 * (192*192 + 192) fewer parameters
    assert archs["symvit_tiny_patch16_224"]["params_m"] == round((5717416 - 12 * (192 * 192 + 192)) / 1e6, 2)
    assert archs["rpc_symvit_base_patch16_224"]["arguments"] == {
        "pap_iterations": 2, "pap_lambda": 3.0, "rpc_layers": "all", "pap_convention": "authors"}
    assert archs["symvit_tiny_patch16_224"]["arguments"]["pap_iterations"] == 0
    assert archs["pid_deit_digits_patch4_32"]["arguments"]["beta"] == 0.1
    assert {"embedded", "file", "timm"} <= set(info["checkpoint_loaders"])
    aliases = {a["name"]: a for a in info["aliases"]}
    assert aliases["rpc_symvit_all"]["arch_kwargs"]["rpc_layers"] == "all"
    assert aliases["deit"]["families"]["imagenet"] == {"arch": "deit_tiny_patch16_224", "checkpoint": None}
    cnn = archs["cnn_digits_32"]  # 3 convs (3-32-64-64, 3x3) + fc 1024-128 + head 128-10
    params = (3 * 32 + 32 * 64 + 64 * 64) * 9 + 32 + 64 + 64 + 1024 * 128 + 128 + 128 * 10 + 10
    assert cnn["params_m"] == round(params / 1e6, 2) and (cnn["depth"], cnn["num_heads"], cnn["patch_size"]) == (
        None, None, None)
    assert aliases["cnn_at"]["families"] == {"digits": {"arch": "cnn_digits_32",
                                                        "checkpoint": "embedded:cnn_at_digits"}}
