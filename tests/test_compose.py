"""compose.yaml against the Compose specification's JSON schema (the copy in
the docker-compose 1.29.2 wheel from PyPI, hash-checked), plus what the
schema cannot express: AMD devices and groups, pinned images, localhost-only
monitoring, no default passwords, every variable documented."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import sys
import zipfile

import jsonschema
import pytest
import yaml
from vllm_trees import CACHE, REPO

from k3rocm.image import image_tag
from k3rocm.launcher.settings import SETTINGS
from k3rocm.series import Series
from k3rocm.supervise import DEFAULTS

SCHEMA_WHEEL = "docker_compose-1.29.2-py2.py3-none-any.whl"
SCHEMA_WHEEL_SHA256 = "8d5589373b35c8d3b1c8c1182c6e4a4ff14bffa3dd0b605fcd08f73c94cef809"
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
ENV_EXAMPLE = (REPO / "kimi-k3.env.example").read_text()
SERVER = COMPOSE["services"]["kimi-k3"]
PIP_DOWNLOAD = (sys.executable, "-m", "pip", "download", "--quiet", "--no-deps")
# ${NAME}, ${NAME:-default}, ${NAME:?message}
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    wheel = CACHE / "artifacts" / SCHEMA_WHEEL
    if not wheel.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--dest",
                str(wheel.parent),
                "docker-compose==1.29.2",
            ],
            check=True,
        )
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == SCHEMA_WHEEL_SHA256
    with zipfile.ZipFile(wheel) as archive:
        schema = json.loads(archive.read("compose/config/compose_spec.json"))
    # The spec gained healthcheck.start_interval in 2023, after this copy;
    # add exactly that property, typed like its siblings.
    healthcheck = schema["definitions"]["healthcheck"]["properties"]
    assert "start_interval" not in healthcheck
    healthcheck["start_interval"] = healthcheck["start_period"]
    return schema


def test_compose_file_matches_the_compose_spec_schema(compose_schema):
    jsonschema.Draft201909Validator(compose_schema).validate(COMPOSE)


def test_the_schema_rejects_a_broken_service(compose_schema):
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["kimi-k3"]["shm_sise"] = "64g"
    with pytest.raises(jsonschema.ValidationError, match="shm_sise"):
        jsonschema.Draft201909Validator(compose_schema).validate(broken)


def test_server_has_what_an_amd_gpu_container_needs():
    assert SERVER["devices"] == ["/dev/kfd", "/dev/dri"]
    assert SERVER["group_add"][0] == "video"
    render = VARIABLE.fullmatch(SERVER["group_add"][1])
    assert render and render.group(1) == "RENDER_GID" and render.group(2) == ":?"
    assert SERVER["ipc"] == "host"
    assert SERVER["ulimits"]["memlock"] == -1
    assert "seccomp=unconfined" in SERVER["security_opt"]
    shm = VARIABLE.fullmatch(SERVER["shm_size"])
    assert shm and shm.group(3) == "64g"
    targets = [VARIABLE.sub("", volume).split(":")[1] for volume in SERVER["volumes"]]
    assert targets == ["/models", "/home/k3/.cache"]
    assert SERVER["env_file"] == ".env"


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(
        float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", duration)
    )


def test_server_health_restart_and_stop_policies():
    check = SERVER["healthcheck"]
    assert check["test"] == ["CMD", "python3", "-m", "k3rocm.health"]
    assert seconds(check["start_period"]) >= 4 * 3600  # a multi-hour load
    assert seconds(check["start_interval"]) <= 30
    assert SERVER["restart"].startswith("on-failure:")
    # docker's SIGKILL must come after supervisord's own grace for vLLM.
    grace = float(DEFAULTS["K3_STOP_GRACE_SECONDS"])
    assert seconds(SERVER["stop_grace_period"]) >= grace + 20


def test_images_are_pinned():
    server_image = VARIABLE.fullmatch(SERVER["image"])
    assert server_image and server_image.group(1) == "K3_IMAGE"
    tag = image_tag(Series(REPO / "patches"))
    assert server_image.group(3) == f"kimi-k3-rocm:{tag}"
    assert f"K3_IMAGE=kimi-k3-rocm:{tag}\n" in ENV_EXAMPLE
    for name in ("prometheus", "grafana"):
        image = COMPOSE["services"][name]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image


def test_monitoring_is_localhost_only_and_grafana_has_no_default_password():
    for name in ("prometheus", "grafana"):
        for port in COMPOSE["services"][name]["ports"]:
            bind = VARIABLE.match(port)
            assert bind and bind.group(1) == "MONITORING_BIND"
            assert bind.group(3) == "127.0.0.1"
    env = COMPOSE["services"]["grafana"]["environment"]
    password = VARIABLE.fullmatch(env["GF_SECURITY_ADMIN_PASSWORD"])
    assert password and password.group(1) == "GRAFANA_ADMIN_PASSWORD"
    assert password.group(2) == ":?"  # required, no default
    assert re.search(r"^GRAFANA_ADMIN_PASSWORD=$", ENV_EXAMPLE, re.M)


def test_monitoring_is_provisioned_from_the_repo():
    for name in ("prometheus", "grafana"):
        for volume in COMPOSE["services"][name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), source
    scrape = yaml.safe_load((REPO / "monitoring" / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["kimi-k3:8000"]  # the service name, vLLM's port


def documented() -> set[str]:
    return set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]+)=", ENV_EXAMPLE, re.M))


def test_every_variable_is_documented_in_the_env_example():
    used = {match.group(1) for match in VARIABLE.finditer(yaml.safe_dump(COMPOSE))}
    server = {setting.env for setting in SETTINGS}
    container = set(DEFAULTS) | {
        "K3_SMOKE_ON_FAILURE",
        "K3_SMOKE_LOAD_TIMEOUT",
        "K3_SMOKE_STAGE2_TIMEOUT",
        "K3_SMOKE_REPORT",
        "K3_IMAGE_TAG",
    }
    missing = (used | server | container) - documented()
    assert not missing, f"not in kimi-k3.env.example: {sorted(missing)}"


def test_env_example_sets_only_what_it_must():
    """Uncommented lines reach the container: no empty optional settings."""
    assigned = re.findall(r"^([A-Z][A-Z0-9_]+)=(.*)$", ENV_EXAMPLE, re.M)
    empty = {name for name, value in assigned if not value}
    assert empty == {"RENDER_GID", "GRAFANA_ADMIN_PASSWORD"}
