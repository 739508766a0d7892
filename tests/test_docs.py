"""What README.md and docs/ point at exists: every relative link and #anchor lands (GitHub's heading
slugs), every `make <target>` they name is a Makefile target, and the versions table in
docs/configuration.md says what config/versions.py pins, checked both ways."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from config import versions
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def prose(path: Path) -> str:
    """The file without its fenced code blocks, where a link or a heading is text, not markdown."""
    return FENCE.sub("", path.read_text())


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text, lower case, every character
    but letters, digits, '_', '-' and spaces dropped, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(path)):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links() -> list[tuple[Path, str]]:
    return [
        (path, target)
        for path in DOCS
        for target in LINK.findall(prose(path))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize(("path", "target"), relative_links(), ids=lambda value: str(value).replace(str(ROOT), ""))
def test_every_relative_link_and_anchor_lands(path, target):
    file_part, _, anchor = target.partition("#")
    landing = (path.parent / file_part).resolve() if file_part else path
    assert landing.exists(), f"{path.relative_to(ROOT)}: {target} names no file"
    if anchor:
        assert landing.suffix == ".md", f"{path.relative_to(ROOT)}: {target} has an anchor into a non-markdown file"
        assert anchor in anchors(landing), f"{path.relative_to(ROOT)}: {target}: no heading has the slug #{anchor}"


def test_the_links_are_found():
    assert len(relative_links()) > 20


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {target for line in re.findall(r"^([\w. -]+):(?!=)", text, re.M) for target in line.split()}


def named_make_targets() -> list[tuple[str, str]]:
    """(file, target) for each `make …` in a code span or a code block of the docs; variable
    assignments (ENV=prod) and flags before the target are skipped, as make skips them."""
    named = []
    for path in DOCS:
        text = path.read_text()
        code = CODE_SPAN.findall(FENCE.sub("", text)) + [block.group(0) for block in FENCE.finditer(text)]
        for snippet in code:
            for words in re.findall(r"(?:^|[\s;&|(])make((?:\s+[^\s;&|)`]+)+)", snippet):
                for word in words.split():
                    if "=" in word or word.startswith("-"):
                        continue
                    if re.fullmatch(r"[a-z][\w-]*", word):
                        named.append((str(path.relative_to(ROOT)), word))
                    break
    return named


def test_every_make_target_the_docs_name_exists():
    named = named_make_targets()
    assert ("README.md", "synth") in named
    missing = sorted({(path, target) for path, target in named if target not in makefile_targets()})
    assert not missing, missing


VERSION = re.compile(r"\bv?\d+\.\d+(?:\.\d+)*(?:\.post\d+)?\b")


def versions_table() -> list[tuple[str, str]]:
    section = (ROOT / "docs" / "configuration.md").read_text().split("\n## Versions", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return [(what.strip(), version.strip()) for what, version in rows[1:]]


def pinned_strings() -> list[str]:
    """Every string config/versions.py holds, at any depth of its constants."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, (tuple, list, frozenset, set)):
            for item in value:
                walk(item)
        elif hasattr(value, "__dataclass_fields__"):
            for field in value.__dataclass_fields__:
                walk(getattr(value, field))

    for name in dir(versions):
        if name.isupper():
            walk(getattr(versions, name))
    return found


def must_be_in_the_table() -> dict[str, str]:
    """What versions.py pins that a reader picks a cluster by: each chart, each *_VERSION and *_TAG,
    the engine of the GCS store, each Cluster Autoscaler release, the mirror Job's image."""
    pins: dict[str, str] = {}
    for name in dir(versions):
        value = getattr(versions, name)
        if isinstance(value, versions.HelmChartPin):
            pins[name] = value.version
        elif isinstance(value, str) and name.isupper() and (name.endswith(("_VERSION", "_TAG", "_ENGINE"))):
            pins[name] = value
    for minor, release in versions.CLUSTER_AUTOSCALER_RELEASES.items():
        pins[f"CLUSTER_AUTOSCALER_RELEASES[{minor}]"] = release
    pins["MIRROR_JOB_IMAGE"] = versions.MIRROR_JOB_IMAGE.rsplit("/", 1)[1]
    return pins


def test_every_pin_of_versions_py_is_in_the_table():
    table = " ".join(version for _, version in versions_table())
    missing = {name: pin for name, pin in must_be_in_the_table().items() if pin.removeprefix("v") not in table}
    assert not missing, f"docs/configuration.md's versions table leaves out {missing}"


def test_every_version_in_the_table_is_pinned_where_pins_live():
    """versions.py, and the CDK's own pins: aws-cdk-lib and the kubectl layer in requirements.txt,
    the CDK CLI in package.json."""
    pinned = " ".join(pinned_strings())
    pinned += " " + (ROOT / "requirements.txt").read_text()
    pinned += " " + json.dumps(json.loads((ROOT / "package.json").read_text()))
    known = {token.removeprefix("v") for token in VERSION.findall(pinned)}
    unpinned = [
        (what, token)
        for what, version in versions_table()
        for token in VERSION.findall(version)
        if token.removeprefix("v") not in known
    ]
    assert versions_table() and not unpinned, unpinned
