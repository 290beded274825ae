"""The receipt of a cell run: everything environment-specific the result leaves out."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path

from .environments import CellEnvironment
from .fetch import sha256_file
from .trees import Tree

RECEIPT_SCHEMA = "pdevidence-receipt/1"


def now() -> datetime:
    return datetime.now(timezone.utc)


def build(*, cell: str, experiment: str, side: str, tree: Tree, env: CellEnvironment, project: Path,
          constraints: Path, probe: Path, result: Path, commands: list[list[str]], started: datetime,
          finished: datetime, exit_status: int, cache_key: str) -> dict:
    packages = env.packages()
    return {
        "schema": RECEIPT_SCHEMA,
        "cell": cell,
        "experiment": experiment,
        "side": side,
        "tree": tree.receipt(),
        "python": {
            "requested": env.python,
            "version": _python_version(env),
            "platform": platform.platform(),
            "machine": platform.machine(),
        },
        "torch": {
            "build": env.torch_build(),
            "channel": env.torch.channel,
            "requested": env.torch.requested,
            "note": env.torch.note,
        },
        "packages": packages,
        "constraints": {"file": _rel(constraints, project), "sha256": sha256_file(constraints)},
        "probe": {"file": _rel(probe, project), "sha256": sha256_file(probe)},
        "result": {"file": result.name, "sha256": sha256_file(result)},
        "environment": {"path": str(env.path), "reused": env.reused},
        "commands": commands,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 3),
        "exit_status": exit_status,
        "cache_key": cache_key,
    }


def _python_version(env: CellEnvironment) -> str:
    cfg = env.path / "pyvenv.cfg"
    for line in cfg.read_text().splitlines() if cfg.exists() else []:
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            return value.strip()
    return env.python


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def pins(receipt: dict) -> dict[str, str]:
    """What must match for two runs to count as the same environment."""
    return {
        "python": ".".join(str(receipt["python"]["version"]).split(".")[:2]),
        "torch": str(receipt["torch"]["build"]),
        "constraints": receipt["constraints"]["sha256"],
        "probe": receipt["probe"]["sha256"],
        **{f"package:{name}": version for name, version in sorted(receipt["packages"].items())},
    }
