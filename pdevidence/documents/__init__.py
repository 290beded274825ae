"""The documents the harness writes and reads; their JSON Schemas are in ``schemas/``."""

from pathlib import Path

SCHEMAS_DIR = Path(__file__).with_name("schemas")
