"""Scale-out deployment files (#18): the compose scale variant, the HAProxy config and the
Kubernetes manifests validate, and they agree with each other and with the server's flags."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from server_helpers import REPO_ROOT

from backend.config import ServerConfig

K8S_DIR = REPO_ROOT / "deploy" / "k8s"
HAPROXY_CFG = REPO_ROOT / "deploy" / "haproxy" / "haproxy.cfg"
COMPOSE_FILES = [REPO_ROOT / "docker-compose.yml", REPO_ROOT / "docker-compose.scale.yml"]
KUBERNETES_VERSION = "1.30.0"


def k8s_documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    documents = []
    for name in kustomization["resources"]:
        documents += [d for d in yaml.safe_load_all((K8S_DIR / name).read_text()) if d]
    return documents


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in k8s_documents() if d["kind"] == kind]


def server_args(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)


def test_every_manifest_is_valid_against_the_kubernetes_schema() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    documents = k8s_documents()
    assert {d["kind"] for d in documents} == {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    for document in documents:  # raises ValidationError naming the field
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_bites() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = of_kind("Deployment")[0]
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 45  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_deployment_drains_within_its_grace_period_and_probes_the_right_paths() -> None:
    deployment = of_kind("Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = server_args(deployment)
    drain_timeout = float(args["drain-timeout"])
    assert pod["terminationGracePeriodSeconds"] > drain_timeout + 5  # + CLOSE_GRACE_S
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[:3] == ["python", "-m", "backend.prestop"]
    assert float(prestop[prestop.index("--timeout") + 1]) > drain_timeout
    assert args["replica"] == "$(POD_NAME)"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    ServerConfig(drain_timeout_s=drain_timeout)  # the flags are ones the server accepts


def test_the_requested_memory_holds_the_pool() -> None:
    deployment = of_kind("Deployment")[0]
    args = server_args(deployment)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    memory_gib = float(container["resources"]["requests"]["memory"].removesuffix("Gi"))
    kib_per_block = 384  # the bundled Whisper-CTC: 4 layers x 6 heads x 64 x 32 frames x K,V x 4 B
    pool_gib = int(args["max-num-blocks"]) * kib_per_block / 2**20
    assert int(args["max-num-blocks"]) >= int(args["max-batch-size"]) * 2
    assert memory_gib >= pool_gib + 1.5, (memory_gib, pool_gib)


def test_selectors_and_targets_agree() -> None:
    deployment = of_kind("Deployment")[0]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for document in of_kind("Service"):
        assert document["spec"]["selector"].items() <= labels.items()
    pdb = of_kind("PodDisruptionBudget")[0]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = of_kind("HorizontalPodAutoscaler")[0]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1


def test_haproxy_config_balances_sessions_on_readiness() -> None:
    text = HAPROXY_CFG.read_text()
    assert re.search(r"^\s*balance leastconn$", text, re.M)
    assert re.search(r"^\s*option httpchk GET /readyz$", text, re.M)
    directives = [line.split("#")[0] for line in text.splitlines()]
    # a replica that turns 503 keeps its live sessions: HAProxy must not cut them
    assert not any("on-marked-down" in line for line in directives)
    tunnel = int(re.search(r"timeout tunnel (\d+)s", text).group(1))  # type: ignore[union-attr]
    assert tunnel > ServerConfig().engine.max_session_s
    assert re.search(r"server-template oasr \d+ oasr:8000 .*resolvers docker", text)


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_the_config() -> None:
    result = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose (Debian package) is not installed; .ci/run installs it")
def test_the_scaled_compose_variant_validates_and_publishes_no_fixed_replica_port() -> None:
    args = ["docker-compose"] + [a for f in COMPOSE_FILES for a in ("-f", str(f))]
    result = subprocess.run([*args, "config", "-q"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    scaled = subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60,
                            env={"OASR_PORTS": "8000", "PATH": "/usr/bin:/bin"})
    services = yaml.safe_load(scaled.stdout)["services"]
    assert [p.get("published") for p in services["oasr"]["ports"]] == [None]
    assert any(str(v).endswith("deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro")
               for v in services["haproxy"]["volumes"])
    assert services["oasr"]["stop_grace_period"] == "45s"


def test_prestop_signals_the_server_and_waits_for_it_to_exit() -> None:
    from backend.prestop import main

    # stands in for oasr-server: exits 0.3 s after its SIGTERM, as a short drain would
    child = subprocess.Popen(["python3", "-c", (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(30)")], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    with child.stdout:
        assert main(["--pid", str(child.pid), "--timeout", "10"]) == 0
    assert child.wait(10) == 0


def test_prestop_reports_a_server_that_does_not_exit() -> None:
    from backend.prestop import main

    child = subprocess.Popen(["python3", "-c", (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(30)")], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert main(["--pid", str(child.pid), "--timeout", "1"]) == 1
    finally:
        child.kill()
        child.wait(10)
        assert child.stdout is not None
        child.stdout.close()
