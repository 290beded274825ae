"""`cache info|prune|clean`: what the caches hold, and getting the space back (lanes/cache.py)."""

from __future__ import annotations

from .. import registry
from ..lanes import cache


def cmd_cache(args) -> int:
    return cache.command(registry.load(args.root), cache.Verb(args.verb), as_json=getattr(args, "json", False),
                         older_than=getattr(args, "older_than", None), max_size=getattr(args, "max_size", None))
