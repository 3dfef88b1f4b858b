"""``robustbench-pid fetch NAME`` / ``fetch URL --sha256 HEX --to DIR``: download a checkpoint, verified;
``fetch robustbench-package [--to DIR]``: RobustBench's pinned release, for ``--model robustbench:NAME``
(:mod:`robustbench_pid.hub.robustbench_pkg`).

NAME is a released checkpoint of ``checkpoints/registry.toml`` (``--list`` shows them): its URL, file
name and published hash come from the registry, and the file goes to the user cache dir (or ``--to``),
where ``--checkpoint NAME`` finds it. A URL needs the expected ``--sha256`` (full or 8+ hex digits).
Either way the download resumes a partial file and is kept only if the hash matches
(:mod:`robustbench_pid.hub.download`). Torch-free.
"""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "fetch"
PACKAGE = "robustbench-package"  # not a checkpoint: RobustBench's pinned release
HELP = "download a released checkpoint (registry NAME) or any URL, resuming and verifying its sha256"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help=f"a registry name (see --list), an http(s) URL, or {PACKAGE} (RobustBench's "
                                             f"pinned release, for --model robustbench:NAME)")
    p.add_argument("--sha256", help="expected sha256 of the file (64 hex digits, or at least the first 8); needed "
                                    "for a URL and for a registry name with no published hash")
    p.add_argument("--to", type=Path, help="folder to write to (default for a name: the user cache dir, where "
                                           "--checkpoint NAME looks; needed for a URL)")
    p.add_argument("--list", action="store_true", help="list the registry: names, architectures, hashes, sources")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _list() -> int:
    from ..hub.released import find_file, read_registry, registry_path

    reg = read_registry()
    print(f"Released checkpoints ({registry_path()}):")
    for name, rel in reg.items():
        kind = "sha256" if rel.sha256 else "prefix" if rel.hash_prefix else "hash unknown"
        here = find_file(rel)
        print(f"  {name:<12} {rel.architecture:<24} {kind:<12} {rel.published_hash or '-':<16} "
              f"{'here: ' + str(here) if here else (rel.urls[0] if rel.urls else 'no URL: ' + rel.page)}")
        print(f"      {rel.paper_table}; licence: {rel.licence}")
    return 0


def run(args: argparse.Namespace) -> int:
    from ..hub.download import check_hash_arg, download
    from ..errors import UserError

    if args.list:
        return _list()
    if not args.source:
        raise UserError("fetch needs a registry NAME (robustbench-pid fetch --list) or a URL with --sha256 HEX --to DIR")
    if args.source == PACKAGE:
        from ..hub.robustbench_pkg import ROBUSTBENCH, fetch_package

        path = fetch_package(args.to)
        print(f"{path}  {ROBUSTBENCH.file} sha256 ok ({ROBUSTBENCH.sha256}); --model robustbench:NAME imports it from "
              f"there" + (f" (with ROBUSTBENCH_PID_PACKAGES={args.to})" if args.to else ""))
        return 0
    given = check_hash_arg(args.sha256) if args.sha256 else ""
    if "://" in args.source:
        if not given or args.to is None:
            raise UserError(f"fetch {args.source}: a URL needs --sha256 HEX (the file's published sha256) and "
                            f"--to DIR")
        path = download(args.source, args.to, sha256=given, progress=not args.quiet)
        print(f"{path}  sha256 ok ({given})")
        return 0
    from ..hub.released import get_release, target_dir

    rel = get_release(args.source)
    want = rel.published_hash
    if given and want and not (given.startswith(want) or want.startswith(given)):
        raise UserError(f"--sha256 {given} contradicts the registry's published hash of {rel.name} ({want})")
    sha = max(given, want, key=len)
    if not sha:
        raise UserError(f"no hash is published for {rel.name} ({rel.file}), so the file cannot be verified: pass "
                        f"--sha256 HEX from its publisher ({rel.page or 'see the registry entry'})")
    if not rel.urls:
        raise UserError(f"the registry has no download URL for {rel.name}: get {rel.file} from "
                        f"{rel.page or 'its publisher'}, then `robustbench-pid fetch URL --sha256 HEX --to "
                        f"{target_dir(str(args.to) if args.to else None)}`")
    errors = []
    for url in rel.urls:
        try:
            path = download(url, target_dir(str(args.to) if args.to else None), rel.file, sha256=sha,
                            progress=not args.quiet)
        except UserError as exc:
            errors.append(str(exc))
            continue
        print(f"{path}  sha256 ok ({sha}); use it with --checkpoint {rel.name}"
              + (f" --checkpoint-dir {args.to}" if args.to else ""))
        return 0
    raise UserError(" | ".join(errors))
