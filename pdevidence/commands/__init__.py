"""What each verb of ``python -m pdevidence`` runs, one module per group of verbs (cli.py only parses):
matrix (cell, matrix, compare), sweep (sweep, sweep-merge), check (check, corpus), lanes (drift, upstream,
mutate), evidence (verify, checksums, publish, lock-cpu, lock-trees; what --version names), cache (cache info, prune,
clean), bisect; and what every
command runs first: argument_checks (what argparse cannot check), scratch (the directories a run enters).

A new verb is a module here with its ``cmd_<verb>(args) -> int``, and its parser lines in cli.py.
"""

from . import argument_checks, bisect, cache, check, evidence, lanes, matrix, scratch, sweep

__all__ = ["argument_checks", "bisect", "cache", "check", "evidence", "lanes", "matrix", "scratch", "sweep"]
