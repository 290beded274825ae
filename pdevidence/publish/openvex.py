"""OpenVEX v0.2.0 from a check: one statement per experiment, for the product checked.

The document's ``@id`` is a hash of its content and the timestamp is an
argument, so the same check at the same time gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse

from ..documents.observations import explained_text
from ..documents.vocabulary import GateState
from ..lanes.check import CheckResult, Status, Target
from ..registry import Registry
from ..sources import images, trees
from .osv import PR_URL, vuln_id

CONTEXT = "https://openvex.dev/ns/v0.2.0"
AUTHOR = "pdevidence check"
# A build that departs from both sides on a control is not the fixed code, nor shown to be the pre-fix code:
# under investigation, the controls and their values in the status notes.
VEX_STATUS = {Status.FIXED: "fixed", Status.AFFECTED: "affected", Status.PARTIAL: "under_investigation",
              Status.UNKNOWN: "under_investigation", Status.CANNOT_RUN: "under_investigation",
              Status.NOT_AFFECTED: "not_affected", Status.DEVIATES: "under_investigation"}
GIT_URL = "git+https://github.com/sgl-project/sglang"


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def purl_of_release(version: str) -> str:
    return f"pkg:pypi/sglang@{_quote(version)}"


def purl(target: Target) -> str:
    """``pkg:pypi/sglang@<version>``; a path, commit or interpreter goes in as a qualifier."""
    quote = _quote
    if target.kind in ("release", "wheel"):
        return purl_of_release(target.resolved)
    if target.kind == images.KIND:  # the version its dist-info says
        return purl_of_release(target.resolved) if target.resolved else "pkg:pypi/sglang"
    if target.kind == "git":
        return f"pkg:pypi/sglang?vcs_url={quote(f'{GIT_URL}@{target.resolved}')}"
    if target.kind == "path":
        commit = f"&vcs_url={quote(f'git+file://{target.ref}@{target.resolved}')}" \
            if target.resolved and trees.commit_of(target.resolved) else ""
        return f"pkg:pypi/sglang?path={quote(target.ref)}{commit}"
    version = f"@{quote(target.resolved)}" if target.resolved else ""
    return f"pkg:pypi/sglang{version}?interpreter={quote(target.ref)}"


def oci_purl(image: images.Image) -> str:
    """``pkg:oci/<name>@<digest>`` (the purl spec's oci type): the digest of the image's manifest where the
    archive records one (an OCI layout), else of its config (the image ID); repository, tag and
    architecture as qualifiers. The name is the repository's last part, else the archive's name."""
    repository, tag = image.repository()
    name = repository.rsplit("/", 1)[-1] if repository else re.sub(r"(\.tar|\.tgz|\.gz|\.zst|\.oci)+$", "",
                                                                    image.archive.name)
    qualifiers = {"arch": image.architecture, "repository_url": repository, "tag": tag}
    query = "&".join(f"{key}={urllib.parse.quote(value, safe='/')}" for key, value in sorted(qualifiers.items())
                     if value)
    digest = image.manifest_digest or image.config_digest
    return f"pkg:oci/{_quote(name.lower())}@{_quote(digest)}" + (f"?{query}" if query else "")


def product(target: Target) -> dict:
    """The build checked; an image's SGLang package is a subcomponent of the image."""
    if target.image is not None:
        image = target.image.image
        digest = image.manifest_digest or image.config_digest
        found = {"@id": oci_purl(image), "identifiers": {"purl": oci_purl(image)},
                 "subcomponents": [{"@id": purl(target), "identifiers": {"purl": purl(target)}}]}
        if digest.startswith("sha256:"):
            found["hashes"] = {"sha-256": digest.removeprefix("sha256:")}
        return found
    found = {"@id": purl(target), "identifiers": {"purl": purl(target)}}
    if target.sha256:
        found["hashes"] = {"sha-256": target.sha256}
    return found


def statement(reg: Registry, result: CheckResult, index: int) -> dict:
    e = result.experiments[index]
    exp = reg.experiment(e.experiment)
    notes = f"pdevidence check: {e.status.value}"
    if result.target.image is not None:  # an image may hold several: which one this is
        notes += f"; sglang at {result.target.image.install.package}"
    if e.deciding:
        notes += f"; deciding scenarios: {', '.join(e.deciding)}"
    if e.deviations:
        notes += ("; not the fixed code: it departs from both the pre-fix and the fixed release on the controls "
                  + "; ".join(explained_text(e.deviations)))
    if e.error:
        notes += f"; error: {e.error}"
    if result.configuration is not None and e.config is not None:
        args = " ".join(result.configuration.given.args) or "(no arguments)"
        if e.rests_on_configuration:
            notes += (f"; rests on the server configuration given ({result.configuration.given.source}: {args}), "
                      f"which never enters the vulnerable code path; {e.config.describe()}")
        elif e.config.enters_path:
            notes += f"; the server configuration given ({result.configuration.given.source}: {args}) enters its path"
        else:
            notes += f"; {e.config.describe()}"
    for outside in result.outside_of(e.experiment):  # never read as an all-clear for a backend no probe saw
        notes += f"; {outside.describe()}"
    if e.gate is not None:
        notes += f"; {e.gate.describe()}"
    notes += f"; result sha256: {e.result_sha256 or 'none (no result)'}"
    found = {
        "vulnerability": {"@id": PR_URL.format(pr=exp.pr), "name": vuln_id(exp), "description": exp.title},
        "products": [product(result.target)],
        "status": VEX_STATUS[e.status],
        "status_notes": notes,
    }
    if e.status is Status.NOT_AFFECTED:  # OpenVEX requires a justification or an impact statement
        found["justification"] = e.justification
        found["impact_statement"] = "; ".join(e.evidence)
    if e.status is Status.AFFECTED and e.gated_off and e.gate.state is GateState.UNDEFINED:  # nothing turns it on
        found["action_statement"] = (f"This build carries PR #{exp.pr} but runs it only on "
                                     f"{', '.join(e.gate.gate.platforms)}, and defines no {e.gate.gate.variable}: "
                                     f"upgrade to an SGLang release that does, set {e.gate.turns_on} in the server's "
                                     f"environment, then rerun `python -m pdevidence check` with --server-env "
                                     f"{e.gate.turns_on} --server-platform {e.gate.platform}.")
    elif e.status is Status.AFFECTED and e.gated_off:  # the fix is there: the server's environment turns it on
        on = f" on {e.gate.platform}" if e.gate.gate.platforms else ""
        found["action_statement"] = (f"Set {e.gate.turns_on} in the server's environment (this build carries PR "
                                     f"#{exp.pr}, off by default{on}: {e.gate.gate.why}), then rerun `python -m "
                                     f"pdevidence check` with --server-env {e.gate.turns_on}"
                                     + (f" --server-platform {e.gate.platform}" if on else "") + ".")
    elif e.status is Status.AFFECTED:
        found["action_statement"] = (f"Upgrade to an SGLang release with PR #{exp.pr} (see the OSV record "
                                     f"{vuln_id(exp)}) or apply the PR, then rerun `python -m pdevidence check`.")
    return found


def document(reg: Registry, result: CheckResult | list[CheckResult], timestamp: str) -> dict:
    """One document for one check or several: one statement per experiment and product checked."""
    checked = result if isinstance(result, list) else [result]
    body = {
        "@context": CONTEXT,
        "author": AUTHOR,
        "timestamp": timestamp,
        "version": 1,
        "statements": [statement(reg, r, i) for r in checked for i in range(len(r.experiments))],
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {"@id": f"https://openvex.dev/docs/public/vex-{digest}", **body}
