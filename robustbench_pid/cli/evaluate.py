"""``evaluate``: run clean + attacks (or a benchmark) on a model and write a results folder."""
from __future__ import annotations

import argparse
from typing import Any, Dict

from ..specs import DECODES, PRECISIONS, PROTOCOLS

NAME = "evaluate"
HELP = ("evaluate a model: clean accuracy plus attacks (--attack / --suite) or a benchmark, "
        "written as per-sample records + summary under results/")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what")
    g.add_argument("--model", required=True, help="a zoo name (robustbench-pid models: deit, pid_deit, rpc_symvit, "
                                                   "fan, ...), timm:NAME, a registered timm name, or "
                                                   "robustbench:[L2/|corruptions/]NAME (RobustBench's zoo; docs/models.md)")
    g.add_argument("--checkpoint", help="embedded:NAME, a local .pth/.pt/.bin/.safetensors file (FILE#KEY picks an "
                                        "entry such as state_dict_ema), timm:NAME[.TAG] pretrained weights, or a "
                                        "plugin scheme, or a released checkpoint's registry name (`robustbench-pid "
                                        "fetch --list`)")
    g.add_argument("--checkpoint-dir", help="folder searched first for a registry name's file (then checkpoints/ and "
                                            "the user cache dir; recorded in the spec)")
    g.add_argument("--allow-pickle", action="store_true",
                   help="allow full unpickling of .pth checkpoints (can run code hidden in the file: trusted files only)")
    g.add_argument("--non-strict", action="store_true", help="load a checkpoint that does not fully fit (recorded)")
    g.add_argument("--dataset", default="digits")
    g.add_argument("--data-root", help="local dataset root (ImageNet family, CIFAR); --suite robustbench-corruptions: "
                                       "RobustBench's data_dir, holding CIFAR-10-C/, CIFAR-100-C/ or ImageNet-C/")
    g.add_argument("--imagenet-root", help="ImageNet validation root, needed beside --data-root by imagenet-o (its "
                                           "in-distribution half) and by imagenet-c's clean condition "
                                           "(default: $ROBUSTBENCH_PID_IMAGENET_ROOT; the root in use is recorded "
                                           "in the spec and the run folder's hash)")
    g.add_argument("--split", help="default: the dataset's own (digits: test, also train; imagenet: val; the "
                                   "ImageNet-C/A/R/O/V2/Sketch test sets: test)")
    g.add_argument("--limit", type=int, help="evaluate only the first N samples; under --suite robustbench-corruptions "
                                             "instead the first N of each corruption x severity cell (and of the "
                                             "clean images), as RobustBench's n_examples")
    g.add_argument("--subset", type=int, help="a fixed, documented, seeded subset of N samples (recorded)")
    g.add_argument("--skip-unreadable", action="store_true",
                   help="skip unreadable/truncated images and count them in the results (default: hard error)")
    g.add_argument("--benchmark", default=None,
                   help="adversarial (clean + attacks; the default for most datasets), corruptions, ... "
                        "(`robustbench-pid list benchmarks` lists them)")
    a = p.add_argument_group("attacks")
    a.add_argument("--attack", action="append", default=[], help="attack name (repeatable)")
    a.add_argument("--suite", help="attack suite: a name (`robustbench-pid list suites`; shipped in attacks/) or a path to a .toml file")
    a.add_argument("--eps", help="comma-separated eps list, e.g. 1/255,2/255,4/255 (default: the papers' "
                                 "1/255..6/255 sweep for fgsm/pgd, the attack's default otherwise)")
    a.add_argument("--steps", type=int)
    a.add_argument("--step-size", type=str)
    a.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="any other attack setting (repeatable), e.g. --param random_start=false")
    a.add_argument("--protocol", default="standard", choices=PROTOCOLS)
    m = p.add_argument_group("model arguments (recorded in results)")
    for k in ("lambda_p", "lambda_i", "lambda_d", "beta"):
        m.add_argument(f"--{k.replace('_', '-')}", type=float, dest=k, help="PID gain (PID models only)")
    m.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any other architecture argument (repeatable), e.g. pap_iterations=4 or "
                        "first_derivative=none; values are parsed as JSON when possible")
    b = p.add_argument_group("benchmark options")
    b.add_argument("--bench-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="benchmark setting (repeatable), e.g. n_images=100 for rank-collapse or "
                        "corruptions=[\"fog\"] for corruptions; values parsed as JSON when possible")
    b.add_argument("--analyze", action="append", default=[], metavar="NAME",
                   help="attention: per-layer metrics of the clean and attacked points (one extra forward pass per "
                        "sample and condition) into attention.parquet; see docs/benchmarks.md")
    b.add_argument("--save-adv", action="store_true",
                   help="keep every attacked sample's final adversarial image (--converge: its worst case) in "
                        "adversarial/, sha256 in run.json; rbp.load_adversarial / `robustbench-pid export` read them")
    r = p.add_argument_group("running")
    r.add_argument("--out", help="run folder (default: results/<model>_<dataset>_<what>_<protocol>_<hash>)")
    r.add_argument("--batch-size", type=int, default=128, help="images per batch; 0 = largest that fits (GPU only)")
    r.add_argument("--chunk-size", type=int, default=512,
                   help="samples per work unit (resume granularity); each unit seeds its own random draws, so another "
                        "chunk size gives randomised attacks (random starts, SPSA, Square) other draws: a run folder "
                        "keeps one")
    r.add_argument("--seed", type=int, default=0, help="seeds every random draw (>= 0)")
    r.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda or cuda:N")
    r.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="attack forward/backward precision: bf16 on CUDA or through CPU autocast, fp16 on CUDA only "
                        "(verdicts always fp32)")
    r.add_argument("--compile", action="store_true",
                   help="torch.compile the model once per process, for the attacks' passes and the verdicts")
    r.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    r.add_argument("--decode", default="cpu", choices=DECODES,
                   help="image files (the ImageNet family): cpu decodes with PIL in the workers; gpu has the workers "
                        "read JPEG bytes and decodes, resizes and crops them in batches on the GPU (needs CUDA; other "
                        "pixels, so recorded in the spec and run.json: a run folder keeps one decoder)")
    r.add_argument("--shard", help="i/n: compute only this shard's work units (merge afterwards)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--dry-run", action="store_true",
                   help="print the work units, forward/backward passes per unit and an estimated time; compute nothing")
    e = p.add_argument_group("evidence that each attack worked (docs/attacks.md)")
    e.add_argument("--indicators", action="store_true",
                   help="indicators of attack failure per sample and condition (adds one unconstrained run per "
                        "attack, collects loss traces and a noise check)")
    e.add_argument("--trace", action="store_true", help="write every sample's loss per iteration to trace.parquet")
    e.add_argument("--agreement", type=int, default=0, metavar="N",
                   help="with --precision bf16|fp16 or --compile: re-run N seeded samples in fp32 eager and report "
                        "how many verdicts agree")
    c = p.add_argument_group("converged robust accuracy (docs/attacks.md)")
    c.add_argument("--converge", action="store_true",
                   help="per eps, escalate from your attack through rounds of four attack families (ranked APGD-T, "
                        "APGD-CE, FAB-T, Square; EOT and SPSA where the evidence calls for them), each on the samples "
                        "still robust, until a round breaks (almost) nothing more; standard protocol only")
    c.add_argument("--converge-tol", metavar="SHARE",
                   help="stop when a full rung breaks at most this share of a work unit's samples (default 0.001, at most "
                        "0.05) or one sample (--converge-opt tol_min)")
    c.add_argument("--converge-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="other ladder settings, e.g. square_queries=1000 (benchmarks/ladder/spec.py LadderSpec)")
    r.add_argument("--calibration", metavar="FWD,FB",
                   help="with --dry-run: price the plan at these forward and forward+backward images/s of the "
                        "target device (e.g. a GPU you will run on) instead of a batch measured here")


def spec_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The parsed flags as :func:`robustbench_pid.run.spec_builder.build_spec` keywords."""
    from ..run.spec_builder import option_names

    names = set(option_names())
    return {k: v for k, v in vars(args).items() if k in names}


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..results.report.report_text import format_summary
    from ..run.runner import run as run_spec
    from ..run.spec_builder import build_spec

    spec = build_spec(**spec_options(args))  # the CLI only parses; the library builds
    out = run_spec(spec)
    if spec.dry_run:
        return 0
    summary_path = out / "summary.csv"
    if not summary_path.is_file():
        from ..runtime.launcher import launch

        launched = launch(spec.shard)
        i, n = launched.index, launched.count
        print(f"shard {i}/{n} done; results are in {out}. The last shard to finish writes the tables; "
              f"`robustbench-pid merge {out}` checks and assembles them once every shard has finished")
        return 0
    print(format_summary(pd.read_csv(summary_path)))
    from ..results.summaries.converge import format_converge

    text = format_converge(pd.read_csv(summary_path))
    if text:
        print("\n" + text)
    if str(spec.model).startswith("robustbench:"):  # the entry's published numbers beside this run's
        import json

        from ..results.summaries.leaderboard import format_leaderboard

        board = format_leaderboard(pd.read_csv(summary_path), pd.read_parquet(out / "records.parquet"),
                                   json.loads((out / "run.json").read_text()))
        if board:
            print("\n" + board)
    if spec.benchmark == "adversarial" and spec.attacks:
        from ..results.report.diagnostics import checks_that_apply, diagnose, format_findings

        from ..results.report.evidence_text import format_evidence, overestimate_note

        records = pd.read_parquet(out / "records.parquet")
        summary = pd.read_csv(summary_path)
        note = overestimate_note(summary)
        print("\n" + format_findings(diagnose(records), flagged=bool(note), applied=checks_that_apply(records)))
        print("\n" + format_evidence(summary))
        if note:
            print(note)
    print(f"\nwrote {out}  (records.parquet, summary.csv, run.json)")
    return 0
