"""Weights meet the architecture they were made for: a strict load refuses another architecture with the same
keys and tensors timm's filter had to resize; other settings than the training ones are an ablation, said and
recorded; architecture arguments reach the recorded input size and are checked where they enter."""
from __future__ import annotations

import warnings

import pytest
import torch

import robustbench_pid as rbp
from robustbench_pid.errors import CheckpointError, UserError
from robustbench_pid.models.zoo import resolve_model


def _quiet_load(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rbp.load_model(*args, **kw)



@pytest.mark.parametrize("model,ckpt,made_for", [
    ("deit", "embedded:pid_deit_digits", "pid_deit_digits_patch4_32"),          # same keys, other attention
    ("symvit", "embedded:rpc_symvit_all_digits", "rpc_symvit_digits_patch4_32"),
    ("pid_featscale_deit", "embedded:featscale_deit_digits", "featscale_deit_digits_patch4_32"),
])
def test_strict_load_refuses_weights_made_for_another_architecture_with_the_same_keys(model, ckpt, made_for):
    with pytest.raises(CheckpointError, match=f"made for architecture {made_for}, not "):
        rbp.load_model(model, ckpt)
    loose = _quiet_load(model, ckpt, strict=False)  # still possible, and recorded
    assert any(f"made for architecture {made_for}" in p for p in loose.info["load_problems"])


def test_every_embedded_model_loads_its_own_weights_without_problems_or_warnings():
    from robustbench_pid.models.zoo import zoo

    for alias in zoo.names():
        if "digits" not in zoo.get(alias).default_checkpoints:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no ablation warning: the settings are the training ones
            m = rbp.load_model(alias)
        assert m.info["load_problems"] == [] and "checkpoint_settings_changed" not in m.info, alias
        assert m.info["checkpoint_trained_with"] is not None, alias


def test_other_settings_than_the_trained_ones_are_an_ablation_said_and_recorded():
    with pytest.warns(UserWarning, match="lambda_p=0.0, .*other than those it was trained with.*an ablation"):
        m = rbp.load_model("pid_deit", lambda_p=0.0)
    assert m.info["checkpoint_settings_changed"]["lambda_p"] == "0.0"
    assert m.info["checkpoint_trained_with"]["pid"]["lambda_p"] == 0.8


def test_strict_load_refuses_tensors_timm_had_to_resize_and_non_strict_records_them():
    with pytest.raises(CheckpointError, match=r"patch_embed.proj.weight resized by timm's filter to fit: "
                                              r"\(64, 3, 4, 4\) -> \(64, 3, 2, 2\)"):
        _quiet_load("deit", patch_size=2)
    m = _quiet_load("deit", patch_size=2, strict=False)
    assert any("pos_embed resized" in p for p in m.info["load_problems"])


def test_img_size_reaches_the_recorded_input_size_so_the_data_is_made_at_that_size():
    fan = _quiet_load("fan", img_size=64)
    assert fan.info["input_size"] == [3, 64, 64]
    assert fan(torch.rand(2, 3, 64, 64)).shape == (2, 10)
    assert _quiet_load("deit").info["input_size"] == [3, 32, 32]


@pytest.mark.parametrize("kw,match", [
    ({"first_derivative": None}, "first_derivative set to None"),        # timm would drop it: the default would run
    ({"num_classes": 5}, "the class count comes from the dataset"),
    ({"lambda_p": -3.0}, "PID gains must be >= 0"),
    ({"beta": 2.0}, "beta must be at most 1"),
])
def test_architecture_arguments_that_would_run_something_else_are_refused(kw, match):
    with pytest.raises(UserError, match=match):
        rbp.load_model("pid_deit", **kw)


def test_a_whole_float_iteration_count_runs_as_an_int():
    m = _quiet_load("rpc_symvit", pap_iterations=2.0)
    assert m.info["arch_kwargs"]["rpc"]["pap_iterations"] == 2
    assert m(torch.rand(1, 3, 32, 32)).shape == (1, 10)


def test_the_layout_hint_names_the_sym_asym_model_for_a_mixed_checkpoint():
    with pytest.raises(CheckpointError, match="mixes symmetric .* load it with --model rpc_symasym_deit"):
        rbp.load_model("rpc_deit", "embedded:rpc_symasym_deit_digits")


def test_a_model_without_weights_says_its_weights_are_random():
    with pytest.warns(UserWarning, match="has no checkpoint: its weights are timm's random initialisation"):
        m = rbp.load_model("pid_deit_digits_patch4_32")
    assert m.info["checkpoint"] is None


def test_deit_releases_evaluate_at_the_deit_crop_and_timm_names_keep_timms():
    for size in ("tiny", "small", "base"):
        assert resolve_model(f"deit_{size}_patch16_224", "imagenet").crop_pct == 0.875
    assert resolve_model("timm:deit_small_patch16_224", "imagenet").crop_pct is None  # timm's own config (0.9)


def test_on_the_command_line_a_warning_is_one_line_without_source_path():
    """While a verb runs, a user-facing warning prints as `warning: ...`, like the CLI's errors (no Python source
    path and line); other warnings keep Python's format, and the format is restored when the verb returns."""
    from robustbench_pid.cli import _guard

    before = warnings.formatwarning
    seen = {}

    def verb(args):
        seen["user"] = warnings.formatwarning("weights are random", UserWarning, "/x/zoo.py", 7)
        seen["other"] = warnings.formatwarning("old API", DeprecationWarning, "/x/zoo.py", 7)
        return 0

    assert _guard(verb, None) == 0
    assert seen["user"] == "warning: weights are random\n"
    assert "zoo.py:7" in seen["other"] and "DeprecationWarning" in seen["other"]
    assert warnings.formatwarning is before
