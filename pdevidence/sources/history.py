"""A clone's main line, read with git: the commits between two refs, their subjects, dates and PR numbers.

Release tags may sit on release branches off the main line (a patch release is cut from a branch, so
one release's tag need not be an ancestor of the next's): a tag's place on the main line is its merge
base with it. ``line`` walks the first-parent chain between two such places, oldest first.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..core import children
from ..core.errors import usage

# Where the main line is, in a clone of SGLang (the upstream remote's branch first) unless --main names it.
MAIN_REFS = ("origin/main", "main")
_SQUASHED = re.compile(r"\(#(\d+)\)\s*$")
_NAMED = re.compile(r"#(\d+)")


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    date: str  # committer date, ISO 8601
    pr: int | None  # the pull request its subject names: ``... (#24226)``, else the first ``#N``; None: none

    def to_json(self) -> dict:
        return {"sha": self.sha, "subject": self.subject, "date": self.date, "pr": self.pr}

    def describe(self) -> str:
        pr = f" (PR #{self.pr})" if self.pr else ""
        return f"{self.sha[:12]} {self.date[:10]} {self.subject!r}{pr}"


def pr_of(subject: str) -> int | None:
    """The PR a squash-merge subject names (GitHub appends ``(#N)``); else the first ``#N``; else None."""
    found = _SQUASHED.search(subject) or _NAMED.search(subject)
    return int(found.group(1)) if found else None


COMMITS_PER_CALL = 1000


class Clone:
    """One git repository, read only."""

    def __init__(self, path: Path):
        self.path = path
        if self._git("rev-parse", "--git-dir").returncode != 0:
            raise usage(f"{path} is not a git repository", expected="a clone of sgl-project/sglang (or a fork)",
                        todo="pass --repo <clone> or set SGLANG_REPO=<clone>")

    def _git(self, *args: str) -> subprocess.CompletedProcess:
        return children.run(["git", "-C", str(self.path), *args], capture_output=True, text=True)

    def _out(self, *args: str) -> str:
        done = self._git(*args)
        if done.returncode != 0:
            raise usage(f"`git {' '.join(args)}` failed in {self.path}: {done.stderr.strip()}",
                        todo=f"check the clone (`git -C {self.path} fetch --tags origin`)")
        return done.stdout.strip()

    def resolve(self, ref: str) -> str | None:
        """The commit ``ref`` names; None: the clone has no such ref."""
        done = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        return done.stdout.strip() if done.returncode == 0 else None

    def main(self, asked: str | None = None) -> str:
        """The main line's ref: ``asked``, else the first of ``MAIN_REFS`` the clone has."""
        for ref in [asked] if asked else MAIN_REFS:
            if self.resolve(ref):
                return ref
        raise usage(f"the clone at {self.path} has no {asked or ' or '.join(MAIN_REFS)}",
                    expected="the branch holding the main line (upstream's main)",
                    todo="name it with --main <ref>, or `git fetch origin main`")

    def on_main(self, ref: str, main: str) -> str:
        """Where ``ref`` meets the main line: its merge base with it (itself when it is on it)."""
        return self._out("merge-base", ref, main)

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self._git("merge-base", "--is-ancestor", older, newer).returncode == 0

    def line(self, start: str, end: str, paths: tuple[str, ...] = ()) -> list[str]:
        """``start`` and the first-parent chain after it up to ``end``, oldest first; given ``paths``, only the
        commits of that chain that change one of them (``start`` and ``end`` always)."""
        if not self.is_ancestor(start, end):
            raise usage(f"{start[:12]} is not an ancestor of {end[:12]}: there is no line from one to the other",
                        todo="give --good an older commit than --bad (the good side first)")
        chain = self._out("rev-list", "--first-parent", "--reverse", f"{start}..{end}",
                          *(["--", *paths] if paths else []))
        found = [start, *chain.split()]
        return found if found[-1] == end else [*found, end]

    def commit(self, sha: str) -> Commit:
        return self.commits([sha])[0]

    def commits(self, shas: list[str]) -> list[Commit]:
        """Each commit, in order: one git call per thousand (a range not narrowed may hold thousands)."""
        found = []
        for at in range(0, len(shas), COMMITS_PER_CALL):
            shown = self._out("show", "-s", "--format=%H%x00%s%x00%cI%x00", *shas[at:at + COMMITS_PER_CALL])
            fields = [f.strip("\n") for f in shown.split("\0")]
            found += [Commit(full, subject, date, pr_of(subject))
                      for full, subject, date in zip(fields[0::3], fields[1::3], fields[2::3])]
        return found

    def tip(self, main: str) -> str:
        return self._out("rev-parse", f"{main}^{{commit}}")
