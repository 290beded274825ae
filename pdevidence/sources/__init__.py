"""Tree sources: pinned git commits, PyPI releases, wheels, local paths; verified downloads."""
