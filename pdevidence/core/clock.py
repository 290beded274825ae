"""The wall clock, in UTC: when a run started and finished (receipts record it; results never do)."""

from __future__ import annotations

from datetime import datetime, timezone


def now() -> datetime:
    return datetime.now(timezone.utc)
