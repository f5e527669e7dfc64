"""The image as built (Docker): the virtual environment's native parser pass imports, the probe
tools a worker runs are there and run, and the image does not run as root.

Where no Docker engine answers, these tests are skipped with the reason printed;
tests/unit/test_dockerfile.py checks the Dockerfile's stages as written everywhere.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]  # the build

ROOT = Path(__file__).resolve().parents[2]
TAG = "rl-job-health:image-test"


def _skip(reason: str) -> NoReturn:
    print(f"the image is not built here: {reason}; tests/unit/test_dockerfile.py checks its stages")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def docker() -> str:
    binary = shutil.which("docker")
    if binary is None:
        _skip("no docker CLI")
    info = subprocess.run([binary, "info"], capture_output=True, text=True, timeout=60, check=False)
    if info.returncode != 0:
        _skip(f"no Docker engine answers (docker info: {info.stderr.strip()[-200:]})")
    return binary


@pytest.fixture(scope="module")
def image(docker: str) -> Iterator[str]:
    """The image built from this checkout (the Dockerfile's final stage)."""
    subprocess.run([docker, "build", "-t", TAG, str(ROOT)], check=True, timeout=3600)
    yield TAG
    subprocess.run([docker, "image", "rm", "-f", TAG], capture_output=True, check=False)


def _run(docker: str, image: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker, "run", "--rm", "--network", "none", image, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_venv_imports_the_native_pass(docker: str, image: str) -> None:
    """`_fastscan` imports from the installed package in the image's virtual environment (not a
    source tree), so the parser takes its C pass."""
    module = "worker.evidence.logs._fastscan"
    ran = _run(docker, image, "python", "-c", f"import {module} as m; print(m.__file__)")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().startswith("/opt/venv/") and ran.stdout.strip().endswith(".so")


@pytest.mark.parametrize(
    "argv",
    [
        ("iris", "--help"),
        ("py-spy", "--version"),
        ("kubectl", "version", "--client"),
        ("ps", "-e"),
        ("rl-health", "--help"),
    ],
)
def test_the_probe_tools_run(docker: str, image: str, argv: tuple[str, ...]) -> None:
    """Each tool a worker's probes or commands run is on the image's PATH and starts."""
    ran = _run(docker, image, *argv)
    assert ran.returncode == 0, (argv, ran.stderr[-500:])


def test_the_image_does_not_run_as_root(docker: str, image: str) -> None:
    """The default user has a non-zero uid."""
    ran = _run(docker, image, "id", "-u")
    assert ran.returncode == 0 and ran.stdout.strip() not in {"", "0"}, ran
