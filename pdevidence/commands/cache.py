"""`cache info|prune|clean`: what the caches hold, and getting the space back (lanes/cache.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import registry
from ..lanes import cache


def cmd_cache(args) -> int:
    return cache.command(registry.load(args.root), cache.Verb(args.verb), as_json=getattr(args, "json", False),
                         older_than=getattr(args, "older_than", None), max_size=getattr(args, "max_size", None))


def keep_within_budget(root: Path, since: dict) -> None:
    """At the end of a command that fills the cache (cli.FILLS_CACHE); ``since``: ``cache.growth`` at its start."""
    cache.keep_within_budget(registry.load(root), log=lambda line: print(line, file=sys.stderr), since=since)
