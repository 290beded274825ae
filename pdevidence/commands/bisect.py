"""`bisect`: by behaviour, the commit that fixed each bug and the one that brought it in."""

from __future__ import annotations

import sys

from .. import registry
from ..core import settings
from ..core.errors import usage
from ..core.files import dumps, write_atomic
from ..core.paths import runs_dir
from ..documents.bisects import file_name
from ..lanes import bisect_report, bisect_run
from ..sources.history import Clone


def cmd_bisect(args) -> int:
    """Exit 0 when every boundary sought is found, 1 when a range's ends do not behave as its releases did, 4
    when one is not narrowed (skipped commits) or lies outside the history, 9 when the watch (--every) flags a
    commit after the fix; the worst of them (core/errors.py). Writes runs/bisect-<experiment>.json (what publish
    takes) and the run's receipt runs/bisect.run.json."""
    reg = registry.load(args.root)
    repo = args.repo or settings.get("SGLANG_REPO")
    if repo is None:
        raise usage("bisect needs a clone of SGLang", todo="pass --repo <clone> or set SGLANG_REPO=<clone>")
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else (lambda msg: print(msg, flush=True))
    found = bisect_run.run(reg, Clone(repo), args.experiment or list(reg.experiments), main=args.main,
                           good=args.good, bad=args.bad, every=args.every,
                           fresh_references=args.references == "fresh", force=args.force, log=log)
    # Each experiment's document, for publish; the run's receipt beside them: the rounds, their times, the clone.
    runs = runs_dir(reg.root)
    for report in found.experiments:
        write_atomic(runs / file_name(report.document.experiment), dumps(report.document.to_json()))
    write_atomic(runs / bisect_report.RECEIPT, dumps(found.to_json()))
    print(dumps(found.to_json()) if args.json else found.text(), end="" if args.json else "\n")
    return found.exit_code
