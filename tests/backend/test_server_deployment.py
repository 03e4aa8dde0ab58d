"""Deployment files: compose files validate, the Dockerfile follows README's install steps."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from server_helpers import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
COMPOSE_GPU = REPO_ROOT / "docker-compose.gpu.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"


def readme_demo_commands() -> list[str]:
    """The shell commands of README's "Run the demo" code block, split at ``&&``."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Run the demo", 1)[1]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S)
    assert block, "README's 'Run the demo' section has no code block"
    return [c.strip() for line in block.group(1).splitlines() for c in line.split("&&")
            if c.strip() and not c.strip().startswith("#")]


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose (Debian package) is not installed; .ci/run installs it")
@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_GPU]])
def test_compose_files_validate(files: list) -> None:  # type: ignore[type-arg]
    args = ["docker-compose"] + [a for f in files for a in ("-f", str(f))] + ["config", "-q"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_compose_serves_8000_with_a_healthcheck_and_gpu_reservation() -> None:
    service = yaml.safe_load(COMPOSE.read_text())["services"]["oasr"]
    assert service["ports"] == ["${OASR_PORTS:-8000:8000}"]  # 8000:8000 unless scaled
    # the container's health is liveness; /readyz (capacity) is for load balancers
    assert any("/healthz" in part for part in service["healthcheck"]["test"])
    gpu = yaml.safe_load(COMPOSE_GPU.read_text())["services"]["oasr"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "cuda" in gpu["command"]


def test_dockerfile_runs_the_readme_steps() -> None:
    readme = readme_demo_commands()
    steps = dockerfile_instructions()
    runs = " && ".join(arg for op, arg in steps if op == "RUN")
    assert steps[0] == ("FROM", "python:3.11-slim")
    torch_pins = {re.search(r"torch==([\w.]+)", c).group(1) for c in readme if "torch==" in c}
    assert torch_pins, f"README installs no pinned torch: {readme}"
    for pin in torch_pins:
        assert f"pip install torch=={pin} " in runs
    assert re.search(r"pip install (-e )?\.(\s|$)", runs)
    assert any(re.fullmatch(r"pip install (-e )?\.", c) for c in readme)
    cmd = next(arg for op, arg in steps if op == "CMD")
    assert readme[-1].split()[0] == "oasr-server" and '"oasr-server"' in cmd
    assert "EXPOSE" in dict(steps) and dict(steps)["EXPOSE"] == "8000"


def test_the_image_serves_the_copied_frontend() -> None:
    steps = dockerfile_instructions()
    workdir = next(arg for op, arg in steps if op == "WORKDIR")
    copied = next(arg.split()[-1] for op, arg in steps if op == "COPY" and arg.startswith("frontend"))
    env = dict(arg.split("=", 1) for op, arg in steps if op == "ENV" and "=" in arg and
               arg.startswith("OASR_"))
    assert env["OASR_FRONTEND_DIR"] == str(Path(workdir) / copied)


def test_docker_build_context_holds_what_the_dockerfile_copies() -> None:
    ignored = {line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copies = [arg.split()[:-1] for op, arg in dockerfile_instructions() if op == "COPY"]
    for sources in copies:
        for source in sources:
            assert (REPO_ROOT / source).exists(), source
            assert source not in ignored, f"{source} is excluded by .dockerignore"
