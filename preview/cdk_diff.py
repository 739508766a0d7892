"""The CDK CLI's diff (``cdk diff --template``), run on a synthesized cloud assembly and read.

The CLI decides which changes replace a resource from CloudFormation's resource specifications
(``replace`` / ``may be replaced`` after a resource line, ``(requires replacement)`` after the
property that causes it); this module only reads its lines, never re-derives them.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CDK = ROOT / "node_modules" / ".bin" / "cdk"
# [~] AWS::EKS::Nodegroup Eks/Cluster/NodegroupDecodeNodes EksClusterNodegroupDecodeNodes6526137E replace
# [-] AWS::EKS::AccessEntry EksClusterAdmin1E23D5C9A destroy      (a removed resource has no path)
RESOURCE_LINE = re.compile(r"^\[(?P<op>[+\-~])\] (?P<type>\S+) (?P<rest>.+)$")
PROPERTY_LINE = re.compile(r"^ [├└]─ \[(?P<op>[+\-~])\] (?P<name>[^\s(]+)(?: \((?P<impact>[^)]+)\))?")
# What the CLI writes after a resource's logical id, longest first.
IMPACTS = ("may be replaced", "replace", "destroy", "orphan")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class DiffError(RuntimeError):
    pass


@dataclass
class ResourceChange:
    op: str  # "+" added, "-" removed, "~" modified
    type: str
    path: str
    logical_id: str
    impact: str = ""  # "replace", "may be replaced", "destroy", "orphan" ...
    properties: dict[str, str] = field(default_factory=dict)  # property -> its impact ("" if none)

    @property
    def replaced(self) -> bool:
        return self.op == "~" and self.impact.startswith("replace")

    @property
    def may_be_replaced(self) -> bool:
        return self.op == "~" and "may be replaced" in self.impact


def run(assembly: Path, old_template: Path, *, stack: str, timeout_s: int = 300) -> str:
    """``cdk diff`` of ``stack`` in a synthesized assembly against a template file (no AWS call)."""
    command = [
        str(CDK),
        "diff",
        stack,
        "--app",
        str(assembly),
        "--template",
        str(old_template),
        "--no-notices",
        "--no-version-reporting",
        "--no-color",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    if result.returncode not in (0, 1):  # the CLI exits 1 when it finds differences with --fail only
        raise DiffError(f"cdk diff failed ({result.returncode}): {(result.stderr.strip().splitlines() or [''])[-1]}")
    return ANSI.sub("", result.stdout + result.stderr)


def parse(text: str) -> list[ResourceChange]:
    """The resource changes in the CLI's output, with the properties it marks on each."""
    changes: list[ResourceChange] = []
    in_resources = False
    for line in text.splitlines():
        if line.strip() == "Resources":
            in_resources = True
            continue
        if in_resources and line and not line.startswith(("[", " ")):
            in_resources = False  # the next section (Outputs, Parameters, ...)
        if not in_resources:
            continue
        resource = RESOURCE_LINE.match(line)
        if resource:
            # A construct path may hold spaces ("…SecurityGroup99CFA6E5:ALL TRAFFIC"): the impact is read
            # off the end, the logical id is the word before it, and the path is whatever precedes that.
            rest, impact = resource["rest"].strip(), ""
            for phrase in IMPACTS:
                if rest.endswith(f" {phrase}"):
                    rest, impact = rest[: -len(phrase) - 1], phrase
                    break
            path, _, logical_id = rest.rpartition(" ")
            changes.append(
                ResourceChange(
                    op=resource["op"], type=resource["type"], path=path, logical_id=logical_id, impact=impact.strip()
                )
            )
            continue
        prop = PROPERTY_LINE.match(line)
        if prop and changes:
            changes[-1].properties[prop["name"]] = (prop["impact"] or "").strip()
    return changes
