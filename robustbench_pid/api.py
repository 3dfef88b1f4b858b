"""The Python API: ``rbp.evaluate`` (a whole run, as the ``evaluate`` command does it) and
``rbp.attack`` (adversarial images for one batch), taking model and data *objects* or names.

``rbp.evaluate(model=net, data=(x, y), attack="pgd", eps=4/255, mean=..., std=...)`` evaluates an
``nn.Module`` you hold (copied, never modified) on your data; ``rbp.evaluate(model="pid_deit",
attack="pgd", eps="3/255", limit=100)`` does the same for registered names and builds exactly the
RunSpec the command would (``spec_builder.build_spec``), so notebook and shell runs with the same
settings share their run folder, resume from each other and give identical records.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import pandas as pd
import torch

from .errors import UserError
from .run.spec_builder import EpsLike

ModelLike = Union[str, torch.nn.Module]


def _options(kw: Dict[str, Any]) -> Dict[str, Any]:
    """``evaluate`` keywords -> ``build_spec`` keywords (``params=`` is ``--param``), checked."""
    from .run.spec_builder import option_names

    valid = option_names()
    kw = dict(kw)
    from .run.spec_builder import key_values

    params = dict(kw.pop("params", None) or {})
    param = kw.pop("param", None)
    given = key_values(param, "param", parse_json=False) if param else {}  # KEY=VALUE strings: each key once
    twice = sorted(set(params) & set(given))
    if twice:
        raise UserError(f"attack setting {twice[0]!r} is given in both params= and param=; give it once")
    params.update(given)
    progress = kw.pop("progress", None)
    for k in kw:
        if k not in valid:
            raise UserError(f"evaluate() got an unknown option {k!r}; valid: {', '.join(sorted(valid))}, "
                            f"data, mean, std, num_classes, name, progress (attack settings go in params={{...}})")
    if progress is not None and "quiet" in kw:
        raise UserError("evaluate(): give progress= or quiet=, not both (progress=True shows the bar, quiet=True "
                        "shows nothing but errors)")
    from .runtime.progress import wants_progress

    # a notebook shows the run's progress by default (a cell that runs for minutes must not sit silent); a script
    # does not unless asked (progress=True)
    kw.setdefault("quiet", not wants_progress(progress))
    if params:
        kw["param"] = params
    return kw


def evaluate(model: ModelLike, attack: Union[None, str, Sequence[str]] = None, eps: EpsLike = None,
             dataset: Optional[str] = None, *, data: Any = None, mean: Optional[Sequence[float]] = None,
             std: Optional[Sequence[float]] = None, num_classes: Optional[int] = None, name: Optional[str] = None,
             **kw: Any) -> pd.DataFrame:
    """Run an evaluation and return its tidy results (values in percent, with 95% intervals).

    ``model``: a registered name (``"pid_deit"``, ``"timm:NAME"``) or any ``nn.Module`` mapping [0, 1]
    images to logits (``mean=``/``std=``, one value per channel of the images, wrap a normalisation in front;
    without them the images reach it as they are, any channel count; ``num_classes`` is inferred
    from one forward pass unless given; ``name`` labels it in records, default its class name). The
    module is deep-copied: your object keeps its device, mode, ``requires_grad`` and compilation.
    ``data``: a ``Dataset`` of (image, label), a ``DataLoader`` (its dataset, in index order, with its
    batch size) or tensors ``(x, y)``, images in [0, 1]; sample ids are the indices. Without it the
    registered ``dataset`` (default ``"digits"``) is used. Any ``evaluate`` command option is a
    keyword (dashes become underscores): ``suite``, ``limit``, ``protocol``, ``steps``,
    ``batch_size``, ``out``, ``seed``, ``device``, ... Attack settings without their own option go in
    ``params={"random_start": False}``. ``progress``: show the run's progress bar (True / False; default: in a
    notebook yes, in a script no). The run folder is in ``df.attrs["run_dir"]``.
    """
    from .results.store import load_results
    from .run.runner import run as run_spec
    from .run.spec_builder import build_spec

    warn_findings = not kw.get("quiet", False)  # quiet=True: no progress bar and no diagnostics warnings
    opts = _options(kw)
    obj_model = obj_data = None
    if isinstance(model, torch.nn.Module) and data is None and dataset is None:
        raise UserError(f"rbp.evaluate(model=<{type(model).__name__} object>) needs data=: your images and labels as "
                        f"tensors (x, y), a Dataset of (image, label) or a DataLoader (or dataset=NAME to evaluate it "
                        f"on a registered dataset, e.g. dataset='digits')")
    if data is not None:
        from .data import datasets
        from .run.objects import as_data

        if dataset in datasets:
            raise UserError(f"dataset={dataset!r} is a registered dataset; with data= it only names your data in the "
                            f"records: choose another name (default 'custom')")

        obj_data, hints = as_data(data, dataset or "custom")
        for k, v in hints.items():
            opts.setdefault(k, v)
        opts.setdefault("benchmark", "adversarial")
        opts.setdefault("split", "custom")  # your object is the whole set: no registered splits
        if opts["benchmark"] != "adversarial":
            raise UserError(f"data= objects work with the adversarial benchmark; {opts['benchmark']!r} needs a "
                            f"registered dataset (dataset=NAME)")
    if isinstance(model, str):
        if data is not None:
            raise UserError(f"data= goes with a model object; for the registered model {model!r} pass "
                            f"model=rbp.load_model({model!r}, dataset=...) (its classes and normalisation) with your "
                            f"data, or dataset=NAME instead of data=")
        if mean is not None or std is not None or num_classes is not None:
            raise UserError("mean=/std=/num_classes= are for model objects; a registered model knows its own")
        model_name = model
    else:
        from .run.objects import wrap_model

        obj_model = wrap_model(model, mean, std, name, num_classes)
        model_name = obj_model.info["model"]
    if obj_data is None and dataset is None:
        dataset = "digits"
    # with data=, ``dataset`` only names it in the records (default "custom")
    data_name = obj_data.provenance["dataset"] if obj_data is not None else dataset
    spec = build_spec(model_name, attack=attack, eps=eps, dataset=data_name, **opts)
    if spec.dry_run:
        raise UserError("dry_run=True computes nothing; use the `evaluate --dry-run` command to see the plan")
    out = run_spec(spec, model=obj_model, data=obj_data)
    if not (out / "summary.csv").is_file():
        raise UserError(f"{out}: this process computed only its shard; merge the shards, then "
                        f"rbp.load_results({str(out)!r})")
    df = load_results(out)
    df.attrs["run_dir"] = os.path.abspath(out)  # still valid if the notebook changes directory
    if spec.benchmark == "adversarial":
        from .results.report.diagnostics import attach_diagnostics
        from .results.store import load_records

        attach_diagnostics(df, load_records(out), warn=warn_findings)
    return df


def attack(model: ModelLike, x: torch.Tensor, y: torch.Tensor, name: str, eps: Optional[float] = None, *,
           protocol: str = "standard", seed: int = 0, mean: Optional[Sequence[float]] = None,
           std: Optional[Sequence[float]] = None, batch_size: Optional[int] = None, device: Optional[str] = None,
           precision: str = "fp32", dataset: str = "digits", **params: Any) -> torch.Tensor:
    """Adversarial images for ``x`` (N, C, H, W in [0, 1]) with labels ``y``, by the runner's own code.

    The same path as a run's unit (``benchmarks.adversarial.attack_batches``): the standard protocol
    attacks only the samples whose clean top-5 is correct (the others come back unchanged), the
    paper protocol attacks the normalised tensor with the model's own predictions. ``seed`` is the
    run's ``--seed``: the draws equal those of a run's unit over the same samples (``limit=N``,
    ``chunk_size >= N``) with the same ``batch_size`` (default: all of ``x`` in one batch). Attack
    settings are keywords (``steps=10``). ``model``: an ``nn.Module`` (copied, never modified) or a
    registered name (loaded for ``dataset``). Returned on ``x``'s device.
    """
    import json

    from .attacks import make_attack
    from .benchmarks.adversarial import attack_batches, protocol_params
    from .runtime.device import check_precision, pick_device
    from .run.objects import complete_info, wrap_model
    from .run.context import Context, unit_rng, unit_seed
    from .run.input_checks import as_tensor, check_labels, check_layout, check_range
    from .run.spec_builder import check_types
    from .specs import PROTOCOLS, RunSpec, Unit

    if protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    _, (seed, batch_size) = check_types(flags={}, whole={"seed": seed, "batch_size": batch_size})
    if seed < 0:
        raise UserError(f"attack(): seed must be >= 0 (the run's --seed), got {seed}")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"attack(): batch_size must be >= 1, got {batch_size} (None: all of x in one batch)")
    x, y = as_tensor(x, "attack(): x"), as_tensor(y, "attack(): y")  # numpy arrays are converted
    if not (x.dim() == 4 and y.dim() == 1 and len(x) == len(y) and len(x) > 0):
        raise UserError(f"attack() needs x of shape (N, C, H, W) and labels y of shape (N,), N >= 1; got "
                        f"{tuple(x.shape)} and {tuple(y.shape)}")
    check_layout(x, "attack(): x")
    check_range(x, "attack(): x")
    check_labels(y, "attack(): y")  # the upper bound once the model's classes are known
    if eps is not None:
        from .attacks import get_attack
        from .run.input_checks import check_user_eps, small_l2_note
        from .run.spec_builder import eps_list

        given = eps_list(eps)
        if len(given) != 1:
            raise UserError(f"attack(): eps must be one value, got {eps!r}")
        check_user_eps(get_attack(name), given[0])
        small_l2_note(get_attack(name), given)
        params["eps"] = given[0]
    dev = pick_device(device) if device is not None else x.device
    check_precision(dev, precision)
    if isinstance(model, str):
        from .models import load_model

        net = load_model(model, dataset=dataset)  # our own object
    else:
        net = wrap_model(model, mean, std)
    net = net.to(dev)
    # a caller's module, or a registered one on the caller's images: its output checked on two samples
    complete_info(net, x[0].detach().cpu(), dev, need_grad=make_attack(name, **params).uses_gradients,
                  second=x[min(1, len(x) - 1)].detach().cpu())
    check_labels(y, "attack(): y", int(net.info["num_classes"]))
    settings = protocol_params(name, make_attack(name, **params).params(), protocol)
    unit = Unit("adversarial", name, float(settings.get("eps", 0.0)), json.dumps(settings, sort_keys=True), "",
                0, len(x))
    data = _Tensors(x, y)
    spec = RunSpec(model=net.info.get("model", "model"), protocol=protocol, precision=precision, seed=seed,
                   batch_size=batch_size or len(x), quiet=True)
    ctx = Context(spec, net, data, list(range(len(x))), dev, {}, batch_size=batch_size or len(x))
    outs = []
    with unit_rng(unit_seed(unit, seed), dev):
        for b in attack_batches(ctx, unit):
            outs.append(b.x_adv if b.x_adv is not None else b.x)
    return torch.cat(outs).to(x.device)


class _Tensors(torch.utils.data.Dataset):
    """(x, y) as the runner's dataset (ids = indices), without reading it twice to hash it."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x.detach().cpu().float(), y.detach().cpu().long()
        self.sample_ids = [str(i) for i in range(len(x))]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])

