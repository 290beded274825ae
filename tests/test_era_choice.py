"""A source tree's era: the version it tells when that is its own, else what its pyproject.toml pins.

The pins of every release below are what its wheel's METADATA requires (read from PyPI's wheels;
``test_forks_real.py`` reads them again from the real wheels): chosen by pins alone, each release
must run in the era its version puts it in, against the real registry and closures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version
from synthetic import REGISTRY, make_project

from pdevidence import registry
from pdevidence.core.paths import PROJECT
from pdevidence.sources import era_choice, pins
from pdevidence.sources.era_choice import Basis
from pdevidence.sources.pins import TreePins
from pdevidence.sources.version import TreeVersion

# version: (torch, transformers, kernel package, kernel)
RELEASE_PINS = {
    "0.4.3.post3": ("2.5.1", "4.48.3", "sgl-kernel", "0.0.3.post6"),
    "0.4.3.post4": ("2.5.1", "4.48.3", "sgl-kernel", "0.0.3.post6"),
    "0.4.4": ("2.5.1", "4.48.3", "sgl-kernel", "0.0.5"),
    "0.4.4.post1": ("2.5.1", "4.48.3", "sgl-kernel", "0.0.5"),
    "0.4.4.post2": ("2.5.1", "4.50.0", "sgl-kernel", "0.0.5.post3"),
    "0.4.4.post3": ("2.5.1", "4.50.0", "sgl-kernel", "0.0.5.post4"),
    "0.4.4.post4": ("2.5.1", "4.51.0", "sgl-kernel", "0.0.8"),
    "0.4.5": ("2.5.1", "4.51.0", "sgl-kernel", "0.0.8"),
    "0.4.5.post1": ("2.5.1", "4.51.1", "sgl-kernel", "0.0.9.post1"),
    "0.4.5.post2": ("2.5.1", "4.51.1", "sgl-kernel", "0.0.9.post2"),
    "0.4.5.post3": ("2.6.0", "4.51.1", "sgl-kernel", "0.0.9.post2"),
    "0.4.6": ("2.6.0", "4.51.1", "sgl-kernel", "0.0.9.post2"),
    "0.4.6.post1": ("2.6.0", "4.51.1", "sgl-kernel", "0.1.0"),
    "0.4.6.post2": ("2.6.0", "4.51.1", "sgl-kernel", "0.1.1"),
    "0.4.6.post3": ("2.6.0", "4.51.1", "sgl-kernel", "0.1.1"),
    "0.4.6.post4": ("2.6.0", "4.51.1", "sgl-kernel", "0.1.2.post1"),
    "0.4.6.post5": ("2.6.0", "4.51.1", "sgl-kernel", "0.1.4"),
    "0.4.7": ("2.7.1", "4.52.3", "sgl-kernel", "0.1.7"),
    "0.4.7.post1": ("2.7.1", "4.52.3", "sgl-kernel", "0.1.9"),
    "0.4.8": ("2.7.1", "4.52.3", "sgl-kernel", "0.1.9"),
    "0.4.8.post1": ("2.7.1", "4.52.3", "sgl-kernel", "0.1.9"),
    "0.4.9": ("2.7.1", "4.53.0", "sgl-kernel", "0.2.4"),
    "0.4.9.post1": ("2.7.1", "4.53.0", "sgl-kernel", "0.2.4"),
    "0.4.9.post2": ("2.7.1", "4.53.0", "sgl-kernel", "0.2.5"),
    "0.4.9.post3": ("2.7.1", "4.53.2", "sgl-kernel", "0.2.6.post1"),
    "0.4.9.post4": ("2.7.1", "4.53.2", "sgl-kernel", "0.2.7"),
    "0.4.9.post5": ("2.7.1", "4.54.0", "sgl-kernel", "0.2.7"),
    "0.4.9.post6": ("2.7.1", "4.54.0", "sgl-kernel", "0.2.7"),
    "0.4.10": ("2.7.1", "4.54.1", "sgl-kernel", "0.2.8"),
    "0.4.10.post1": ("2.7.1", "4.54.1", "sgl-kernel", "0.2.8"),
    "0.4.10.post2": ("2.7.1", "4.54.1", "sgl-kernel", "0.2.8"),
    "0.5.1": ("2.8.0", "4.55.2", "sgl-kernel", "0.3.5"),
    "0.5.1.post1": ("2.8.0", "4.55.2", "sgl-kernel", "0.3.5"),
    "0.5.1.post2": ("2.8.0", "4.55.2", "sgl-kernel", "0.3.5"),
    "0.5.1.post3": ("2.8.0", "4.55.2", "sgl-kernel", "0.3.7"),
    "0.5.2": ("2.8.0", "4.56.1", "sgl-kernel", "0.3.9.post2"),
    "0.5.3": ("2.8.0", "4.57.0", "sgl-kernel", "0.3.14.post1"),
    "0.5.3.post1": ("2.8.0", "4.57.0", "sgl-kernel", "0.3.15"),
    "0.5.3.post2": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.15"),
    "0.5.3.post3": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.15"),
    "0.5.4": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.16.post3"),
    "0.5.4.post1": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.16.post4"),
    "0.5.4.post2": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.16.post4"),
    "0.5.4.post3": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.16.post4"),
    "0.5.5": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.16.post5"),
    "0.5.5.post1": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.17"),
    "0.5.5.post2": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.17"),
    "0.5.5.post3": ("2.8.0", "4.57.1", "sgl-kernel", "0.3.17.post1"),
    "0.5.6": ("2.9.1", "4.57.1", "sgl-kernel", "0.3.18.post2"),
    "0.5.6.post1": ("2.9.1", "5.0.0rc0", "sgl-kernel", "0.3.19"),
    "0.5.6.post2": ("2.9.1", "4.57.1", "sgl-kernel", "0.3.19"),
    "0.5.7": ("2.9.1", "4.57.1", "sgl-kernel", "0.3.20"),
    "0.5.8": ("2.9.1", "4.57.1", "sgl-kernel", "0.3.21"),
    "0.5.8.post1": ("2.9.1", "4.57.1", "sgl-kernel", "0.3.21"),
    "0.5.9": ("2.9.1", "4.57.1", "sgl-kernel", "0.3.21"),
    "0.5.10": ("2.9.1", "5.3.0", "sglang-kernel", "0.4.1"),
    "0.5.10.post1": ("2.9.1", "5.3.0", "sglang-kernel", "0.4.1"),
    "0.5.11": ("2.11.0", "5.6.0", "sglang-kernel", "0.4.2"),
    "0.5.12": ("2.11.0", "5.6.0", "sglang-kernel", "0.4.2.post2"),
    "0.5.12.post1": ("2.11.0", "5.6.0", "sglang-kernel", "0.4.2.post2"),
    "0.5.13": ("2.11.0", "5.8.1", "sglang-kernel", "0.4.3"),
    "0.5.13.post1": ("2.11.0", "5.8.1", "sglang-kernel", "0.4.3"),
    "0.5.14": ("2.11.0", "5.8.1", "sglang-kernel", "0.4.4"),
    "0.5.15": ("2.11.0", "5.12.1", "sglang-kernel", "0.4.4"),
    "0.5.15.post1": ("2.11.0", "5.12.1", "sglang-kernel", "0.4.4"),
    "0.5.16": ("2.11.0", "5.12.1", "sglang-kernel", "0.4.5"),
    "0.5.17": ("2.11.0", "5.12.1", "sglang-kernel", "0.4.5"),
    "0.5.18": ("2.13.0", "5.12.1", "sglang-kernel", "0.4.6.post1"),
    "0.5.19": ("2.13.0", "5.12.1", "sglang-kernel", "0.4.6.post1"),
    "0.5.20": ("2.13.0", "5.12.1", "sglang-kernel", "0.4.7"),
    "0.5.21": ("2.13.0", "5.12.1", "sglang-kernel", "0.4.7"),
    "0.5.22": ("2.14.1", "5.19.0", "sglang-kernel", "0.4.9"),
    "0.5.23": ("2.14.1", "5.19.0", "sglang-kernel", "0.4.10"),
}


# Post-releases whose own pins are those of a later era: 0.4.5.post3 pins torch 2.6.0, 0.5.6.post1 transformers 5.0.0rc0.
PINS_AHEAD_OF_ERA = {"0.4.5.post3": "torch2.6-tf4", "0.5.6.post1": "torch2.9-tf5"}


def tree_pins(torch=None, transformers=None, kernel_package=None, kernel=None) -> TreePins:
    return TreePins(torch, transformers, kernel, kernel_package, "python/pyproject.toml")


@pytest.mark.parametrize("version", sorted(RELEASE_PINS, key=Version))
def test_each_releases_pins_choose_the_era_its_version_is_in(version):
    reg = registry.load(PROJECT)
    torch, transformers, package, kernel = RELEASE_PINS[version]
    chosen, why = era_choice.match_pins(reg, tree_pins(torch, transformers, package, kernel))
    by_version = reg.era_of(version)
    if version == "0.5.17":
        # Its pins are exactly 0.5.15/0.5.16's, which that era's closure was compiled from; the release
        # itself runs in today's closure. Either fits it: the pins choose the closure that equals them.
        assert by_version is None and chosen.name == "torch2.11-tf5"
        assert "has torch 2.11.0, transformers 5.12.1" in why
    elif version in PINS_AHEAD_OF_ERA:
        # A post-release that pins its next release's torch or transformers runs in the era of its version
        # (its published sweep row shows it probed cleanly there); pins choose only for a tree whose version
        # tells nothing trustworthy, and would choose the closure those pins name.
        assert chosen.name == PINS_AHEAD_OF_ERA[version] != by_version.name, why
    else:
        assert (chosen.name if chosen else None) == (by_version.name if by_version else None), why


def test_the_evidence_names_the_pins_the_closure_and_each_rule_that_decided():
    reg = registry.load(PROJECT)
    _, why = era_choice.match_pins(reg, tree_pins("2.11.0", "5.6.0", "sglang-kernel", "0.4.2"))
    assert why == ("python/pyproject.toml pins torch 2.11.0, transformers 5.6.0, sglang-kernel 0.4.2; "
                   "era torch2.11-tf5-sgl-kernel's closure has torch 2.11.0, transformers 5.12.1 "
                   "(the same torch 2.11; era torch2.11-tf5's closure, era torch2.11-tf5-sgl-kernel's closure "
                   "share it; sglang-kernel 0.4.2 is in torch2.11-tf5-sgl-kernel's kernel range <0.4.3)")
    era, why = era_choice.match_pins(reg, tree_pins("2.13.0", "5.12.1"))
    assert era is None and "(no closure has torch 2.13: the nearest newer, 2.14.1)" in why


@pytest.mark.parametrize(("pinned", "era"), [
    (tree_pins("2.9.1"), "torch2.9-tf5"),  # no transformers pin: the newest closure of that torch
    (tree_pins(transformers="4.57.1"), "torch2.9-tf4"),  # no torch pin: transformers alone, then the newest
    (tree_pins("2.4.0", "4.46.0"), "torch2.5-tf4.48"),  # older than every closure: the nearest newer torch, then
    # transformers (4.48.3, which torch2.5-tf4-vllm's closure has too: the first declared of the tied closures)
    (tree_pins("2.10.0", "5.4.0", "sglang-kernel", "0.4.3"), "torch2.11-tf5"),  # between closures: the nearest newer
    (tree_pins("2.20.0", "6.0.0"), None),  # newer than every closure: the newest (today's)
    (tree_pins("2.9.1", "6.1.0"), "torch2.9-tf5"),  # no closure of its transformers major: the nearest
    (tree_pins("2.11.0", "5.8.1"), "torch2.11-tf5-sgl-kernel"),  # no kernel pin: the era with stand-ins
    # PD's first commits' pins: torch2.5-tf4-vllm's closure ties (torch 2.5.1, transformers 4.48.3) and is declared
    # after it: the vLLM of the 0.3.x-0.4.2 era never runs a 0.4.4 tree.
    (tree_pins("2.5.1", "4.48.3", "sgl-kernel", "0.0.5.post3"), "torch2.5-tf4.48"),
])
def test_pins_without_an_exact_closure_take_the_nearest(pinned, era):
    chosen, _ = era_choice.match_pins(registry.load(PROJECT), pinned)
    assert (chosen.name if chosen else None) == era


@pytest.mark.parametrize(("told", "pinned", "era", "set_aside"), [
    # PD's first code (c7c7dbebbe): 0.4.4.post1 by its version file, its pins (transformers 4.48.3) agree.
    ("0.4.4.post1", tree_pins("2.5.1", "4.48.3", "sgl-kernel", "0.0.5.post3"), "torch2.5-tf4.48", None),
    # f8f9244a61 on (transformers 4.50.0, still 0.4.4.post1): the version's closure is older than the pin; the
    # nearest newer one with its torch (4.51.0) runs it.
    ("0.4.4.post1", tree_pins("2.5.1", "4.50.0", "sgl-kernel", "0.0.5.post3"), "torch2.5-tf4",
     "version 0.4.4.post1 is in era torch2.5-tf4.48 (<0.4.4.post2,>=0.4.3.post1) (python/sglang/version.py), but its "
     "closure has transformers 4.48.3, older than the tree's pin 4.50.0, and era torch2.5-tf4's closure has its "
     "torch and a transformers at or above it"),
    # A 0.4.5 version file on pins of transformers 4.48: the newer closure would refuse its own Qwen2.5-VL config.
    ("0.4.5", tree_pins("2.5.1", "4.48.3", "sgl-kernel", "0.0.5"), "torch2.5-tf4.48",
     "version 0.4.5 is in era torch2.5-tf4 (<0.4.6,>=0.4.4.post2) (python/sglang/version.py), but its closure has "
     "transformers 4.51.0, newer than the tree's pin 4.48.3, and era torch2.5-tf4.48's closure has its torch and "
     "transformers"),
    # a torch no closure has: the version chooses.
    ("0.4.4.post1", tree_pins("2.4.0", "4.50.0", "sgl-kernel", "0.0.5.post3"), "torch2.5-tf4.48", None),
    ("0.4.4.post1", None, "torch2.5-tf4.48", None),
])
def test_a_version_file_whose_closure_does_not_fit_its_pins_transformers_gives_way_to_one_that_does(
        told, pinned, era, set_aside):
    from pdevidence.sources.trees import Tree

    tree = Tree("git", "c7c7dbebbe", "git-0", Path("/x"), "0" * 64, "git", "/x", None,
                described(told, told, "python/sglang/version.py"), pinned)
    chosen = era_choice.choose(registry.load(PROJECT), tree)
    assert (chosen.name, chosen.basis) == (era, Basis.PINS if set_aside else Basis.VERSION), chosen.describe()
    assert chosen.set_aside == set_aside


# --- reading a tree's pins --------------------------------------------------------------------------


def write_pyproject(tmp_path: Path, text: str) -> Path:
    package = tmp_path / "python"
    (package / "sglang").mkdir(parents=True, exist_ok=True)
    (package / "pyproject.toml").write_text(text)
    return package


def test_pins_are_read_from_dependencies_then_the_optional_groups_in_their_order(tmp_path):
    # 0.4.x's layout: torch pinned in `srt`, unpinned for other platforms, another pin in a later group.
    package = write_pyproject(tmp_path, """
[project]
name = "sglang"
dependencies = ["aiohttp", "requests"]

[project.optional-dependencies]
runtime_common = ["transformers==4.51.0", "xgrammar==0.1.17"]
srt = ["sglang[runtime_common]", "sgl-kernel==0.0.8", "torch==2.5.1"]
blackwell = ["sglang[runtime_common]", "sgl-kernel", "torch==2.7.1"]
srt_hip = ["torch"]
""")
    assert pins.read(package, tmp_path) == TreePins("2.5.1", "4.51.0", "0.0.8", "sgl-kernel", "python/pyproject.toml")
    # 0.5.x: one list; a dependency wins over an extra's pin, and a range or a wildcard is no pin.
    package = write_pyproject(tmp_path, """
[project]
name = "sglang"
dependencies = ["sglang-kernel==0.4.2", "torch==2.11.0", "transformers>=5.6,<6", "numpy==2.*"]

[project.optional-dependencies]
cu130 = ["torch==2.12.0", "transformers==5.7.0"]
""")
    found = pins.read(package, tmp_path)
    assert found == TreePins("2.11.0", "5.7.0", "0.4.2", "sglang-kernel", "python/pyproject.toml")
    assert found.describe() == "torch 2.11.0, transformers 5.7.0, sglang-kernel 0.4.2"


@pytest.mark.parametrize("text", [
    '[project]\nname = "sglang"\ndependencies = ["numpy", "torch>=2.5"]\n',  # ranges only
    '[project]\nname = "sglang"\ndynamic = ["dependencies"]\n',
    "not toml [",
])
def test_a_tree_that_pins_none_of_them_has_no_pins(tmp_path, text):
    assert pins.read(write_pyproject(tmp_path, text), tmp_path) is None
    assert pins.read(tmp_path / "nowhere", tmp_path) is None


def test_a_closures_pins_are_read_from_its_compiled_lines(tmp_path):
    closure = tmp_path / "closure.txt"
    closure.write_text("torch==2.9.1 \\\n    --hash=sha256:00\n    # via sglang\nTransformers==4.57.1 \\\n")
    assert pins.closure_pins(closure) == {"torch": "2.9.1", "transformers": "4.57.1"}
    assert pins.closure_pins(tmp_path / "missing.txt") == {}


# --- when the version decides, and when it is set aside ---------------------------------------------


def described(version: str, told: str, source: str = "git describe --tags") -> TreeVersion:
    return TreeVersion(version, None, source, told)


@pytest.mark.parametrize(("told", "aside"), [
    (described("0.5.10", "v0.5.10"), None),
    (described("0.5.10", "v0.5.10-npu.rc1-100-gabc1234"), None),  # a fork's own work on a release
    (described("0.5.6.post2", "v0.5.6.post2-7527-gabc1234"), "is 7527 commits behind (over 100)"),
    (described("0.5.21", "v0.5.21-3-gabc1234"), None),  # in no era, but a release the lock pins
    (described("1.2.0", "v1.2.0"), "names no SGLang release the harness knows"),  # a vendor's own numbering
    (described("0.3.1", "v0.3.1-2-gabc1234"), None),  # older than PD disaggregation: the torch2.5-tf4-vllm era holds it
    (described("0.5.24", "v0.5.24"), "names no SGLang release the harness knows"),  # newer than the lock: its pins tell
    (described("9.9.9", "9.9.9", "python/sglang/version.py"), None),  # the tree states it: its own
])
def test_a_tag_far_behind_or_naming_no_known_release_is_set_aside(told, aside):
    found = era_choice.set_aside(registry.load(PROJECT), told)
    assert (found is None) if aside is None else (aside in found)


def test_a_version_read_from_a_file_always_chooses_even_in_a_project_without_a_lock(tmp_path):
    reg = registry.load(make_project(tmp_path, REGISTRY))
    assert era_choice.set_aside(reg, described("0.5.10", "0.5.10", "python/pyproject.toml")) is None
    assert "not pinned in constraints/trees.lock.json" in era_choice.set_aside(reg, described("0.5.10", "v0.5.10"))


def test_choice_by_version_says_whether_the_pins_agree():
    from pdevidence.sources.trees import Tree

    reg = registry.load(PROJECT)

    def tree(version: TreeVersion | None, pinned: TreePins | None) -> Tree:
        return Tree("path", "fork", "local-0", Path("/x"), "0" * 64, "path", "/x", None, version, pinned)

    agree = era_choice.choose(reg, tree(described("0.5.8", "v0.5.8"), tree_pins("2.9.1", "4.57.1")))
    assert (agree.name, agree.basis) == ("torch2.9-tf4", Basis.VERSION)
    assert agree.evidence.endswith("(git describe --tags); its pins agree")
    differ = era_choice.choose(reg, tree(described("0.5.8", "v0.5.8"), tree_pins("2.9.1", "5.3.0")))
    assert (differ.name, differ.basis) == ("torch2.9-tf4", Basis.VERSION)
    assert "; its pins would choose era torch2.9-tf5's closure (" in differ.evidence
    far = era_choice.choose(reg, tree(described("0.5.6.post2", "v0.5.6.post2-7527-gabc"), tree_pins("2.9.1", "5.3.0")))
    assert (far.name, far.basis) == ("torch2.9-tf5", Basis.PINS) and "7527 commits behind" in far.set_aside
    nothing = era_choice.choose(reg, tree(described("0.5.6.post2", "v0.5.6.post2-7527-gabc"), None))
    assert (nothing.era, nothing.basis) == (None, Basis.NONE) and nothing.set_aside
    older = era_choice.choose(reg, tree(described("0.5.8", "v0.5.8"), tree_pins("2.9.1", "4.51.1")))
    assert (older.name, older.basis) == ("torch2.9-tf4", Basis.VERSION)  # no closure has torch 2.9, transformers 4.51
    release = era_choice.choose(reg, Tree("release", "0.5.8", "0.5.8", Path("/w.whl"), "0" * 64, "pypi", "w.whl"))
    assert (release.name, release.basis, release.set_aside) == ("torch2.9-tf4", Basis.VERSION, None)
    assert release.evidence == "release 0.5.8 is in era torch2.9-tf4 (<0.5.10,>=0.5.6)"


def test_closures_tied_on_torch_and_transformers_go_to_the_first_declared_in_every_process():
    """torch2.5-tf4.48 and torch2.5-tf4-vllm both hold torch 2.5.1 and transformers 4.48.3: the choice must not
    follow a set's order (it varies with the process's hash seed), and says why it fell where it did."""
    code = ("from pdevidence import registry; from pdevidence.core.paths import PROJECT; "
            "from pdevidence.sources import era_choice; from pdevidence.sources.pins import TreePins; "
            "era, why = era_choice.match_pins(registry.load(PROJECT), TreePins('2.5.1', '4.48.3', None, None, "
            "'python/pyproject.toml')); print(era.name); print(why)")
    said = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(6)}
    assert len(said) == 1, said
    name, why = said.pop().splitlines()
    assert name == "torch2.5-tf4.48" and "the first declared of the closures left" in why
