"""Judging results: base vs head, each side vs the registry's expectations and the published files."""
