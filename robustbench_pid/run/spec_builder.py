"""Options -> RunSpec: the one place that turns the ``evaluate`` settings into a spec.

The ``evaluate`` command only parses its flags and calls :func:`build_spec` with them as keywords
(the flag names with underscores); ``rbp.evaluate`` calls it with the caller's keywords. So a shell
run and a notebook run with the same settings build the same spec, share their run folder and
give identical records.
"""
from __future__ import annotations

import inspect
import json
import math
import numbers
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import UserError
from .input_checks import check_user_eps, small_l2_note
from ..specs import AttackSpec, RunSpec

PAPER_EPS_GRID = [f"{i}/255" for i in range(1, 7)]  # PIDformer appendix C.1
SWEEP_BY_DEFAULT = ("fgsm", "pgd")  # attacks swept over PAPER_EPS_GRID when no eps is given

EpsLike = Union[None, float, str, Sequence[Union[float, str]]]
KeyValues = Union[None, Mapping[str, Any], Iterable[str]]


def _names(x: Union[None, str, Iterable[str]]) -> List[str]:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


def eps_list(eps: EpsLike) -> Optional[List[float]]:
    """``"1/255,2/255"``, a number, or a list of numbers / ``"a/b"`` strings -> floats (None: not given)."""
    from ..core.labels import parse_eps

    if eps is None:
        return None
    if isinstance(eps, bool) or (not isinstance(eps, (str, numbers.Real)) and getattr(eps, "ndim", None) == 0
                                 and isinstance(eps.item(), bool)):
        raise UserError(f"--eps {eps!r}: expected numbers like 4/255 or 0.03, not true/false")
    if getattr(eps, "ndim", None) == 0:  # a numpy or torch scalar
        eps = eps.item()
    if isinstance(eps, (str, numbers.Real)):
        items = str(float(eps) if isinstance(eps, numbers.Real) else eps).split(",")
    else:
        try:
            items = [str(e.item() if getattr(e, "ndim", None) == 0 else e) for e in eps]
        except TypeError:
            raise UserError(f"--eps {eps!r}: expected a number, 'a/b' text or a list of them") from None
    out = [parse_eps(t) for t in items if str(t).strip()]
    if not out:
        raise UserError("--eps is empty; give values like 1/255,2/255")
    return out


def key_values(items: KeyValues, flag: str, parse_json: bool = True) -> Dict[str, Any]:
    """A mapping, or KEY=VALUE strings; dashes in keys become underscores. With ``parse_json`` a
    VALUE is parsed as JSON (numbers, booleans, lists) when it parses and kept as a string
    otherwise; without it values stay strings (``--param``: each attack coerces its own settings)."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        out_m = {str(k).replace("-", "_"): v for k, v in items.items()}
        if len(out_m) < len(items):  # "step-size" and "step_size": one setting given twice
            keys = sorted(str(k) for k in items)
            raise UserError(f"{flag}: keys {', '.join(map(repr, keys))} name one setting twice (dashes are "
                            f"underscores); give each once")
        return out_m
    out: Dict[str, Any] = {}
    seen: Dict[str, str] = {}
    for kv in ([items] if isinstance(items, str) else items):
        if not isinstance(kv, str) or "=" not in kv:
            raise UserError(f"{flag} {kv!r}: expected KEY=VALUE")
        k, v = (t.strip() for t in kv.split("=", 1))
        key = k.replace("-", "_")
        if not key:
            raise UserError(f"{flag} {kv!r}: the KEY before '=' is empty; give KEY=VALUE")
        if key in seen:  # the last one silently won: say which, and keep the command's meaning one
            raise UserError(f"{flag} {key} is given twice ({seen[key]!r} and {kv!r}); give each key once")
        seen[key] = kv
        try:
            out[key] = json.loads(v) if parse_json else v
        except json.JSONDecodeError:
            out[key] = v
    return out


def attack_specs(attack: Union[None, str, Sequence[str]] = None, eps: EpsLike = None, steps: Optional[int] = None,
                 step_size: Union[None, float, str] = None, params: KeyValues = None,
                 suite: Optional[str] = None, dataset: Optional[str] = None) -> List[AttackSpec]:
    """The attacks to run: the suite's (with the overrides each attack knows), then each named
    attack at each eps (fgsm/pgd sweep 1/255..6/255 when no eps is given)."""
    from ..attacks import get_attack
    from ..core.labels import parse_eps

    overrides: Dict[str, Any] = {}
    if steps is not None:
        overrides["steps"] = steps
    if step_size is not None:
        overrides["step_size"] = parse_eps(str(step_size), what="step size (--step-size)")
    extra = key_values(params, "--param", parse_json=False)
    if "eps" in extra:
        raise UserError("--param eps=...: the eps grid is --eps (Python: eps=), e.g. --eps 4/255 or --eps 1/255,2/255")
    twice = sorted(set(extra) & set(overrides))
    if twice:
        flags = {"steps": "--steps", "step_size": "--step-size"}
        raise UserError(f"{', '.join(flags[k] for k in twice)} given twice (also as --param {twice[0]}=...); give "
                        f"each setting once")
    overrides.update(extra)
    grid_given = eps_list(eps)
    if suite and grid_given is not None and not _names(attack):
        raise UserError(f"--eps with --suite {suite}: a suite sets each attack's eps itself; give --attack NAME "
                        f"to add attacks at --eps, or edit the suite")
    specs: List[AttackSpec] = []
    if suite:
        from .suites import load_suite

        attacks = load_suite(suite, dataset)["attacks"]  # a leaderboard suite: the dataset's leaderboard eps
        known = {k for s in attacks for k in get_attack(s.attack).param_names()}
        unknown = sorted(set(overrides) - known) if not _names(attack) else []
        if unknown:
            raise UserError(f"--param {', '.join(unknown)}: no attack of suite {suite} takes it (their settings: "
                            f"{', '.join(sorted(known))})")
        for s in attacks:
            cls = get_attack(s.attack)
            p = dict(s.params)
            p.update({k: v for k, v in overrides.items() if k in cls.param_names()})
            specs.append(AttackSpec(s.attack, cls.from_params(p).params()))
    for name in _names(attack):
        cls = get_attack(name)
        grid = grid_given or ([parse_eps(e) for e in PAPER_EPS_GRID] if name in SWEEP_BY_DEFAULT else [None])
        for e in grid:
            check_user_eps(cls, e)
            p = dict(overrides) if e is None else {**overrides, "eps": e}
            specs.append(AttackSpec(name, cls.from_params(p).params()))
        small_l2_note(cls, grid)
    return specs


def _dataset_request(dataset: str, split: Optional[str], data_root: Optional[str], imagenet_root: Optional[str],
                     subset: Optional[int], skip_unreadable: bool,
                     fixed: Optional[Dict[str, Any]] = None, dry_run: bool = False) -> Tuple[str, Dict[str, Any]]:
    """The split and the dataset options the spec records, checked against what the dataset takes (a dry run
    needs no --data-root: it prices a dataset that is not here at its published size, ``run/plan_data``)."""
    from ..data import check_request, dataset_info, datasets

    if dataset not in datasets:  # a data object (rbp.evaluate(data=...)) comes with its split
        if split is None:
            dataset_info(dataset)  # neither: the unknown name, listing the valid ones
        given = [k for k, v in (("data_root", data_root), ("imagenet_root", imagenet_root), ("subset", subset),
                                ("skip_unreadable", skip_unreadable)) if v]
        if given:
            raise UserError(f"{', '.join(given)}: options of the registered datasets; a data object is read "
                            f"as it is (select samples with limit= or by slicing your data)")
        return str(split), {}
    if "imagenet_root" in dataset_info(dataset).options():
        from ..data.imagenet import IMAGENET_ROOT_ENV

        imagenet_root = imagenet_root or os.environ.get(IMAGENET_ROOT_ENV) or None
    options = {**({"imagenet_root": str(imagenet_root)} if imagenet_root else {}), **(fixed or {})}
    asked = {**options, **({"subset": subset} if subset is not None else {}),
             **({"skip_unreadable": True} if skip_unreadable else {})}
    return check_request(dataset, split, data_root, asked, need_root=not dry_run), options


def build_spec(model: str, *, attack: Union[None, str, Sequence[str]] = None, eps: EpsLike = None,
               dataset: str = "digits", checkpoint: Optional[str] = None, checkpoint_dir: Optional[str] = None,
               allow_pickle: bool = False,
               non_strict: bool = False, data_root: Optional[str] = None, imagenet_root: Optional[str] = None,
               split: Optional[str] = None, limit: Optional[int] = None, subset: Optional[int] = None,
               skip_unreadable: bool = False, benchmark: Optional[str] = None, suite: Optional[str] = None,
               steps: Optional[int] = None, step_size: Union[None, float, str] = None, param: KeyValues = None,
               protocol: str = "standard", lambda_p: Optional[float] = None, lambda_i: Optional[float] = None,
               lambda_d: Optional[float] = None, beta: Optional[float] = None, model_arg: KeyValues = None,
               bench_opt: KeyValues = None, out: Union[None, str, Path] = None, batch_size: int = 128,
               chunk_size: int = 512, seed: int = 0, device: str = "auto", precision: str = "fp32",
               compile: bool = False, workers: int = 0, shard: Optional[str] = None, quiet: bool = False,
               dry_run: bool = False, calibration: Union[None, str, Sequence[float]] = None,
               analyze: Union[None, str, Sequence[str]] = None,
               indicators: bool = False, trace: bool = False, agreement: int = 0, converge: bool = False,
               converge_tol: Union[None, float, str] = None, converge_opt: KeyValues = None,
               save_adv: bool = False, decode: str = "cpu") -> RunSpec:
    """The RunSpec for these settings (keywords = the ``evaluate`` flags with underscores; ``param``,
    ``model_arg`` and ``bench_opt`` take a mapping or KEY=VALUE strings).

    ``split=None``: the dataset's default split. ``imagenet_root=None``: ``$ROBUSTBENCH_PID_IMAGENET_ROOT``
    for the datasets that read an ImageNet root (imagenet-o, imagenet-c), so the root in use is
    always in the spec and in the run folder's hash. For a registered dataset, a split it lacks,
    a needless ``data_root`` and options it does not take are refused here, before any work.
    A data object (``rbp.evaluate(data=...)``) has no registered name; its caller gives the split.
    ``calibration``: "FWD,FB" images/s (or a pair) that price a ``dry_run`` plan for another device.
    ``analyze``: probes run on the attack's final points (``"attention"``: docs/benchmarks.md).
    ``converge``: the convergence ladder per eps (docs/attacks.md); ``converge_tol`` its stop share,
    ``converge_opt`` its other settings (``benchmarks/ladder/spec.py`` ``LadderSpec``). ``save_adv``: keep every
    attack unit's adversarial images (``results/files/adversarial.py``). ``decode``: ``"gpu"`` decodes the image
    files on the GPU (``data/batch_decode.py``; refused without CUDA)."""
    from ..benchmarks import check_dataset
    from ..data import dataset_info

    (allow_pickle, non_strict, skip_unreadable, compile, quiet, dry_run, indicators, trace, save_adv), \
        (batch_size, chunk_size, seed, workers, agreement, limit, subset, steps) = check_types(
            flags={"allow_pickle": allow_pickle, "non_strict": non_strict, "skip_unreadable": skip_unreadable,
                   "compile": compile, "quiet": quiet, "dry_run": dry_run, "indicators": indicators, "trace": trace,
                   "save_adv": save_adv},
            whole={"batch_size": batch_size, "chunk_size": chunk_size, "seed": seed, "workers": workers,
                   "agreement": agreement, "limit": limit, "subset": subset, "steps": steps})
    if not isinstance(device, str):
        raise UserError(f"device must be text (auto, cpu, cuda or cuda:N), got {device!r}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0 (it seeds numpy's and torch's generators), got {seed}")
    if out is not None and not str(out).strip():  # Path("") is the current folder: a run would land there
        raise UserError("--out is empty; give a folder for the run (leave it out for results/<name>_<hash>)")
    rates = parse_calibration(calibration)
    if rates is not None and not dry_run:
        raise UserError("--calibration prices the plan of a --dry-run; add --dry-run (a real run measures "
                        "its own speed)")

    from .suites import corruption_run, leaderboard_options

    released = corruption_run(suite, dataset, benchmark, limit)  # --suite robustbench-corruptions: its data, n/cell
    if released is not None:
        dataset, benchmark, limit = released["dataset"], released["benchmark"], None
    specs = attack_specs(attack, eps, steps, step_size, param, suite, dataset)
    if benchmark is None:
        benchmark = dataset_info(dataset).default_benchmark
    if benchmark == "converge":  # planned by the adversarial benchmark under --converge, never on its own
        raise UserError("benchmark 'converge' is the convergence ladder, run by --converge on an adversarial "
                        "evaluation: use --attack pgd --eps 4/255 --converge (Python: converge=True)")
    check_dataset(benchmark, dataset)
    check_limit(dataset, limit)
    check_evidence(benchmark, protocol, precision, compile, indicators, trace, agreement)
    if benchmark == "adversarial" and not specs and (eps is not None or steps is not None or param):
        raise UserError("--eps/--steps/--param need --attack NAME or --suite NAME")
    gains = {"lambda_p": lambda_p, "lambda_i": lambda_i, "lambda_d": lambda_d, "beta": beta}
    arch_kwargs = {k: v for k, v in gains.items() if v is not None}
    arch_kwargs.update(key_values(model_arg, "--model-arg"))
    bench_opts = key_values(bench_opt, "--bench-opt")
    options: Dict[str, Any] = {benchmark.replace("-", "_"): bench_opts} if bench_opts else {}
    analyses = check_analyze(analyze, benchmark)
    ladder = check_converge(converge, converge_tol, converge_opt, benchmark, protocol, specs)
    check_save_adv(save_adv, benchmark, protocol, specs)
    fixed = {**leaderboard_options(suite, dataset, subset, protocol, model),  # a leaderboard suite: its samples
             **(released["options"] if released else {})}
    split, dataset_options = _dataset_request(dataset, split, data_root, imagenet_root, subset, skip_unreadable, fixed,
                                              dry_run)
    if dataset_options:
        options["dataset"] = dataset_options
    from ..data import datasets
    from ..data.batch_decode import check_decode

    check_decode(decode, dataset, benchmark, device, data_object=dataset not in datasets)
    return RunSpec(
        model=model, checkpoint=checkpoint, checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None,
        dataset=dataset, split=split, data_root=data_root, protocol=protocol,
        attacks=specs, benchmark=benchmark, benchmark_options=options, suite=suite, limit=limit, subset=subset,
        skip_unreadable=skip_unreadable, dry_run=dry_run, calibration=rates, batch_size=batch_size, chunk_size=chunk_size,
        seed=seed, device=device, precision=precision, compile=compile, num_workers=workers,
        out=Path(out) if out is not None else None, allow_pickle=allow_pickle, strict=not non_strict,
        shard=shard, quiet=quiet, arch_kwargs=arch_kwargs, analyze=analyses, indicators=bool(indicators),
        trace=bool(trace), agreement=int(agreement), converge=ladder, save_adv=save_adv, decode=decode,
    )


def check_limit(dataset: str, limit: Optional[int]) -> None:
    """``--limit N`` takes the first N samples: on ImageNet-C those are the first conditions' (gaussian noise at
    severity 1 first), on ImageNet-O the in-distribution half, so the number would be of another benchmark."""
    from ..data import dataset_info, datasets

    if limit is None or dataset not in datasets:
        return
    kind = dataset_info(dataset).samples
    if dataset_info(dataset).default_benchmark == "robustbench_corruptions":
        raise UserError(f"--limit {limit} on {dataset} would take the first conditions' images; use --suite "
                        f"robustbench-corruptions --limit {limit} (the first {limit} of each cell)")
    if kind in ("corrupted", "ood"):
        what, fix = (("the first conditions' images (gaussian noise at severity 1 first)", "the same images in every "
                      "condition") if kind == "corrupted" else ("in-distribution images only", "both halves, in "
                                                                 "their published ratio"))
        raise UserError(f"--limit {limit} on {dataset} would take {what}; use --subset {limit} ({fix})")


def check_types(flags: Mapping[str, Any], whole: Mapping[str, Any]) -> Tuple[List[bool], List[Optional[int]]]:
    """Switches must be booleans and counts whole numbers (None where optional), numpy's included; returned as
    Python bool / int. In Python ``allow_pickle="false"`` is truthy and would opt in to running a pickle's
    code, ``seed=1.5`` would be recorded as 1.5 but run as 1, ``limit=True`` would run one sample."""
    import numpy as np

    for name, v in flags.items():
        if not isinstance(v, (bool, np.bool_)):
            raise UserError(f"{name} must be True or False, got {v!r}")
    for name, v in whole.items():
        if v is not None and (isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral)):
            raise UserError(f"{name} must be a whole number (int), got {v!r}")
    return [bool(v) for v in flags.values()], [None if v is None else int(v) for v in whole.values()]


def check_converge(converge: Any, tol: Union[None, float, str], opt: KeyValues, benchmark: str, protocol: str,
                   specs: List[AttackSpec]) -> Optional[Dict[str, Any]]:
    """The ladder's settings when --converge is on (None when off), checked where they enter."""
    if not isinstance(converge, bool):
        raise UserError(f"converge must be true or false, got {converge!r}")
    if not converge:
        if tol is not None or opt:
            raise UserError("--converge-tol / --converge-opt set the convergence ladder; add --converge")
        return None
    if protocol != "standard":
        raise UserError(f"--converge works in the standard protocol only (pixel-space eps-balls, true labels); the "
                        f"{protocol!r} protocol's numbers are not worst cases. Drop --converge or use --protocol standard")
    if benchmark != "adversarial":
        raise UserError(f"--converge escalates attacks: it needs the adversarial benchmark, not {benchmark!r}")
    from ..attacks import get_attack
    from ..benchmarks.converge import LADDER_NORMS
    from ..benchmarks.ladder import LadderSpec

    def laddered(name: str) -> bool:
        return get_attack(name).norm in LADDER_NORMS and get_attack(name).worst_case

    if not any(laddered(s.attack) for s in specs):
        raise UserError("--converge needs at least one L-inf or L2 worst-case attack to start from (rung 0), e.g. "
                        "--attack pgd --eps 4/255 or --attack pgd_l2 --eps 0.5; the ladder's rungs are attacks in "
                        "the same threat model at the same eps")
    others = sorted({s.attack for s in specs if not laddered(s.attack)})
    if others:
        print(f"note: --converge: no converged value for {', '.join(others)}: the ladder escalates the L-inf and "
              f"L2 worst-case attacks only", file=sys.stderr)
    options = key_values(opt, "--converge-opt")
    if tol is not None:
        if "tol_share" in options:
            raise UserError("the ladder's tolerance is given twice (--converge-tol and --converge-opt tol_share); "
                            "give it once")
        try:
            if isinstance(tol, bool):
                raise TypeError
            options["tol_share"] = float(tol)
        except (TypeError, ValueError):
            raise UserError(f"--converge-tol {tol!r}: expected a share such as 0.001 (= 0.1%)") from None
    return LadderSpec.from_options(options).as_dict()


def check_save_adv(save_adv: bool, benchmark: str, protocol: str, specs: List[AttackSpec]) -> None:
    """--save-adv keeps the images of attack conditions: it needs attacks, and images (the standard protocol)."""
    if not save_adv:
        return
    if benchmark != "adversarial" or not specs:
        raise UserError(f"--save-adv keeps the adversarial images of attacks; this run has none (benchmark "
                        f"{benchmark!r}{'' if specs else ', no --attack/--suite'}): add --attack NAME or drop --save-adv")
    if protocol != "standard":
        raise UserError("--save-adv keeps images, and the paper protocol's perturbed tensors are none (normalised "
                        "units, no clipping to [0, 1]): use --protocol standard or drop --save-adv")


def check_analyze(analyze: Union[None, str, Sequence[str]], benchmark: str) -> List[str]:
    """The analyses asked for, known and on an adversarial evaluation (sorted, without repeats)."""
    from ..specs import ANALYSES

    names = sorted({n.strip() for a in _names(analyze) for n in str(a).split(",") if n.strip()})
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise UserError(f"--analyze {', '.join(unknown)}: unknown analysis; valid: {', '.join(ANALYSES)}")
    if names and benchmark != "adversarial":
        raise UserError(f"--analyze {','.join(names)} runs on the adversarial benchmark's clean and attacked "
                        f"points, not on benchmark {benchmark!r}; drop --analyze or --benchmark")
    return names


def check_evidence(benchmark: str, protocol: str, precision: str, compile: bool, indicators: bool, trace: bool,
                   agreement: Any) -> None:
    """--indicators/--trace/--agreement: what they need (docs/attacks.md, "Evidence that each attack worked")."""
    if (indicators or trace or agreement) and benchmark != "adversarial":
        raise UserError(f"--indicators, --trace and --agreement judge attacks: they need the adversarial benchmark, "
                        f"not {benchmark!r}")
    if isinstance(agreement, bool) or not isinstance(agreement, int) or agreement < 0:
        raise UserError(f"--agreement must be a whole number of samples >= 0, got {agreement!r}")
    if agreement and precision == "fp32" and not compile:
        raise UserError("--agreement N re-runs N samples in fp32 eager to check a faster run's verdicts; this run is "
                        "already fp32 eager: add --precision bf16|fp16 or --compile, or drop --agreement")
    if agreement and protocol == "paper":
        raise UserError("--agreement works in the standard protocol only; drop it or use --protocol standard")


def parse_calibration(value: Union[None, str, Sequence[float]]) -> Optional[Tuple[float, float]]:
    """"FWD,FB" (or a pair): forward and forward+backward-to-input images/s, both > 0."""
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        rates = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        rates = ()
    if len(rates) != 2 or not all(math.isfinite(r) and r > 0 for r in rates):
        raise UserError(f"--calibration {value!r}: expected FWD,FB, the forward and forward+backward images/s "
                        f"of the device to price the plan for, two positive numbers, e.g. 7900,3900")
    return rates[0], rates[1]


def option_names() -> List[str]:
    """Every keyword :func:`build_spec` takes (what ``rbp.evaluate`` accepts besides its own)."""
    return [p for p in inspect.signature(build_spec).parameters]


def option_defaults() -> Dict[str, Any]:
    return {k: p.default for k, p in inspect.signature(build_spec).parameters.items()
            if p.default is not inspect.Parameter.empty}
