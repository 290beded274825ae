"""Build the CI job matrix from the cells that nox lists.

    python .github/scripts/cell_matrix.py --kind release    # the release-backed cells (default)
    python .github/scripts/cell_matrix.py --kind git        # the pinned-commit cells, probe(...)
    python .github/scripts/cell_matrix.py --kind era        # the sweep's jobs, sweep_era(<era>), one per era

Runs ``python -m nox --list --json --tags <kind>`` on the project's noxfile (or
reads such a listing with ``--listing FILE``, ``-`` for stdin), keeps the cell
sessions of that tree kind and prints one line of JSON, the job matrix::

    {"include": [{"session": "release(admission, base)",
                  "slug": "release-admission-base",
                  "artifact": "cell-release-admission-base",
                  "files": "runs/admission.base.release-*.json"}, ...]}

``files`` matches the cell's result and its receipt (``pdevidence.documents.results``
names them ``<experiment>.<side>.<tree label>.json`` and ``...receipt.json``,
the tree label starting with the kind). With ``$GITHUB_OUTPUT`` set, appends
``matrix=<that JSON>`` and ``kind=<kind>`` to it.

Exit 0, or 2 with one line on stderr: nox failed or printed no JSON, no cell
of that kind, a cell without experiment/side, or two cells sharing an
artifact name. Standard library only: it runs before anything but nox is
installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Tree kind -> (nox tag, session name); tests/test_workflow.py checks it against pdevidence.cells.cells.SESSION_OF_KIND.
KINDS = {"release": ("release", "release"), "git": ("git", "probe")}
ARTIFACT_PREFIX = "cell-"
# The sweep's fan-out over the registry's eras: sessions sweep_era(<era>), tagged "era".
ERA_TAG, ERA_SESSION, ERA_ARTIFACT_PREFIX = "era", "sweep_era", "sweep-part-"


class MatrixError(Exception):
    pass


def nox_listing(tag: str, root: Path = ROOT) -> list[dict]:
    cmd = [sys.executable, "-m", "nox", "--noxfile", str(root / "noxfile.py"), "--list", "--json", "--tags", tag]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MatrixError(f"`{' '.join(cmd[2:])}` exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return parse_listing(proc.stdout)


def parse_listing(text: str) -> list[dict]:
    try:
        listing = json.loads(text)
    except ValueError as exc:
        raise MatrixError(f"`nox --list --json` printed no JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(listing, list):
        raise MatrixError("`nox --list --json` printed JSON that is not a list of sessions")
    return listing


def slug(session: str) -> str:
    """`release(admission, base)` -> `release-admission-base`: safe in artifact and cache names."""
    return re.sub(r"[^a-z0-9]+", "-", session.lower()).strip("-")


def build_eras(listing: list[dict]) -> dict:
    """The sweep's fan-out: one job per era, ``sweep_era(<era>)``, uploading that era's part."""
    include = []
    for entry in listing:
        if entry.get("name") != ERA_SESSION or ERA_TAG not in entry.get("tags", []):
            continue
        era = (entry.get("call_spec") or {}).get("era")
        if not era:
            raise MatrixError(f"session {entry.get('session')!r} has no era in its call_spec")
        s = slug(entry["session"])
        # The parts' directory, not the era's: a directory uploaded is the artifact's root, and the merge
        # needs each part under its era's name (runs/sweep-parts/<era>/) to tell which era's is missing.
        include.append({"session": entry["session"], "slug": s, "artifact": ERA_ARTIFACT_PREFIX + s,
                        "files": "runs/sweep-parts/"})
    if not include:
        raise MatrixError(f"nox lists no era session (sessions named {ERA_SESSION!r} tagged {ERA_TAG!r})")
    return {"include": include}


def build(listing: list[dict], kind: str) -> dict:
    if kind == ERA_TAG:
        return build_eras(listing)
    tag, name = KINDS[kind]
    include = []
    for entry in listing:
        if entry.get("name") != name or tag not in entry.get("tags", []):
            continue
        spec = entry.get("call_spec") or {}
        if not {"experiment", "side"} <= spec.keys():
            raise MatrixError(f"cell {entry.get('session')!r} has no experiment/side in its call_spec: {spec}")
        s = slug(entry["session"])
        include.append({
            "session": entry["session"],
            "slug": s,
            "artifact": ARTIFACT_PREFIX + s,
            "files": f"runs/{spec['experiment']}.{spec['side']}.{kind}-*.json",
        })
    if not include:
        raise MatrixError(f"nox lists no {kind} cell (sessions named {name!r} tagged {tag!r})")
    names = [cell["artifact"] for cell in include]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise MatrixError(f"cells share artifact names {clashes}: rename the sessions")
    return {"include": include}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=[*KINDS, ERA_TAG], default="release")
    p.add_argument("--listing", help="read `nox --list --json` output from this file ('-': stdin) instead")
    args = p.parse_args(argv)
    try:
        if args.listing is None:
            listing = nox_listing(ERA_TAG if args.kind == ERA_TAG else KINDS[args.kind][0])
        elif args.listing == "-":
            listing = parse_listing(sys.stdin.read())
        else:
            listing = parse_listing(Path(args.listing).read_text(encoding="utf-8"))
        matrix = build(listing, args.kind)
    except MatrixError as exc:
        print(f"cell_matrix: {exc}", file=sys.stderr)
        return 2
    line = json.dumps(matrix, separators=(",", ":"))
    print(line)
    print(f"{len(matrix['include'])} {args.kind} jobs: "
          + ", ".join(c["session"] for c in matrix["include"]), file=sys.stderr)
    output = os.environ.get("GITHUB_OUTPUT")
    if output:
        with open(output, "a", encoding="utf-8") as fh:
            fh.write(f"matrix={line}\nkind={args.kind}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
