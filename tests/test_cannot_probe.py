"""Releases the registry declares cannot be probed on a CPU (``[cannot_probe]``): declared with their cause, each
declaration checked as it is loaded."""

from __future__ import annotations

import re

import pytest
from synthetic import REGISTRY, make_project

from pdevidence import registry
from pdevidence.core import errors
from pdevidence.core.paths import PROJECT

RAISES = "module 'torch' has no attribute 'hip'"
DECLARED = REGISTRY + f"""
[cannot_probe."1.0.5"]
why = "its scheduler does not import without a GPU"
raises = "{RAISES}"
"""


def load(tmp_path, text: str = DECLARED) -> registry.Registry:
    return registry.load(make_project(tmp_path / "project", text))


def test_the_project_declares_the_releases_known_not_probeable_on_a_cpu():
    reg = registry.load(PROJECT)
    assert reg.declared("0.4.0.post1", "war_barrier").raises == RAISES
    for version in ("0.5.8", "0.5.8.post1"):
        assert reg.declared(version, "swa_free") is not None and reg.declared(version, "swa_tail") is not None
        assert reg.declared(version, "admission") is None  # the other experiments run there
    assert reg.declared("0.5.9", "swa_free") is None


@pytest.mark.parametrize("declaration, message", [
    ('[cannot_probe."one.two"]\nwhy = "x"\nraises = "y"', 'cannot_probe."one.two": \'one.two\' is not a PEP 440 version'),
    ('[cannot_probe."1.0.5"]\nwhy = " "\nraises = "y"', 'cannot_probe."1.0.5".why: empty'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = ""', 'cannot_probe."1.0.5".raises: empty'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"', "cannot_probe.\"1.0.5\": missing key 'raises'"),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\nexperiments = ["demo", "dmeo"]',
     'cannot_probe."1.0.5".experiments: dmeo is not an experiment (one of: demo)'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\nexperiments = []', 'cannot_probe."1.0.5".experiments: empty'),
    ('[cannot_probe."0.9"]\nwhy = "x"\nraises = "y"\nexperiments = ["demo"]',
     'cannot_probe."0.9".experiments: demo is not swept on 0.9 (below its release floor)'),
    ('[cannot_probe."0.9"]\nwhy = "x"\nraises = "y"', 'cannot_probe."0.9": 0.9 is below every experiment\'s release floor'),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\ncause = "z"', "unknown key cannot_probe.\"1.0.5\".cause"),
    ('[cannot_probe."1.0.5"]\nwhy = "x"\nraises = "y"\n[cannot_probe."1.0.5.0"]\nwhy = "x"\nraises = "y"',
     'cannot_probe."1.0.5.0": the release \'1.0.5\' is declared already'),
])
def test_a_bad_declaration_is_a_registry_error_naming_it(tmp_path, declaration, message):
    with pytest.raises(errors.HarnessError, match=re.escape(message)) as err:
        load(tmp_path, REGISTRY + "\n" + declaration + "\n")
    assert err.value.code == errors.USAGE
