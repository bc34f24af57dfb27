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
from support.vllm_trees import CACHE, REPO

from k3rocm.common.profiles import AMD_ENV
from k3rocm.common.setting_table import (
    CONTAINER_SETTINGS,
    LAUNCHER_SETTINGS,
    SETTINGS,
    STOP_GRACE_SECONDS,
)
from k3rocm.patchtool.lines import default_line_dir
from k3rocm.patchtool.series import Series
from k3rocm.supply_chain.image import BASE_IMAGE, image_tag

# What an operator sets: the launcher's and the container's rows (the image's
# own rows, such as K3_RUN_DIR, are fixed by the image).
OPERATOR_SETTINGS = {setting.env for setting in LAUNCHER_SETTINGS + CONTAINER_SETTINGS}

SCHEMA_WHEEL = "docker_compose-1.29.2-py2.py3-none-any.whl"
SCHEMA_WHEEL_SHA256 = "8d5589373b35c8d3b1c8c1182c6e4a4ff14bffa3dd0b605fcd08f73c94cef809"
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
ENV_EXAMPLE = (REPO / "kimi-k3.env.example").read_text()
SERVER = COMPOSE["services"]["kimi-k3"]
MONITORING_SERVICES = ("prometheus", "grafana", "alertmanager")
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
        # Unchanged: compose.yaml uses nothing newer than Compose 1.29.2 knows.
        return json.loads(archive.read("compose/config/compose_spec.json"))


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
    # With the host's IPC namespace a shm_size would do nothing.
    assert "shm_size" not in SERVER
    assert SERVER["ulimits"]["memlock"] == -1
    assert "seccomp=unconfined" in SERVER["security_opt"]
    targets = [VARIABLE.sub("", volume).split(":")[1] for volume in SERVER["volumes"]]
    assert targets == ["/models", "/home/k3/.cache"]


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(
        float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", duration)
    )


def test_server_stop_budget_is_one_number():
    """Docker's grace and the container's budget are the same variable with
    the same default (k3rocm.common.stop_budget derives every inner wait)."""
    period = re.fullmatch(r"(\$\{[^}]+\})s", SERVER["stop_grace_period"])
    assert period, SERVER["stop_grace_period"]
    assert SERVER["environment"][STOP_GRACE_SECONDS.env] == period.group(1)
    variable = VARIABLE.fullmatch(period.group(1))
    assert variable.group(1) == STOP_GRACE_SECONDS.env
    assert int(variable.group(3)) == STOP_GRACE_SECONDS.default
    assert SERVER["restart"].startswith("on-failure:")
    # The image's HEALTHCHECK applies; compose must not weaken it.
    assert "healthcheck" not in SERVER


def test_server_gets_an_allow_list_of_variables_and_no_secrets():
    assert "env_file" not in SERVER
    environment = SERVER["environment"]
    server_reads = OPERATOR_SETTINGS | {name for name, _ in AMD_ENV} | {"HF_TOKEN_PATH"}
    assert set(environment) == server_reads
    for name, value in environment.items():
        if name != "HF_TOKEN_PATH":
            assert VARIABLE.fullmatch(value).group(1) == name, name
    assert SERVER["secrets"] == ["k3_api_key", "hf_token"]
    assert environment["HF_TOKEN_PATH"] == "/run/secrets/hf_token"
    for secret in COMPOSE["secrets"].values():
        default = VARIABLE.fullmatch(secret["file"]).group(3)
        assert (REPO / default).parent == REPO / "secrets"
    assert (REPO / "secrets" / "empty").read_bytes() == b""


def test_every_service_rotates_its_logs():
    for name, service in COMPOSE["services"].items():
        options = service["logging"]["options"]
        assert service["logging"]["driver"] == "json-file", name
        assert options["max-size"] and int(options["max-file"]) >= 2, name


def test_images_are_pinned_and_the_build_matches_the_series():
    server_image = VARIABLE.fullmatch(SERVER["image"])
    assert server_image and server_image.group(1) == "K3_IMAGE"
    series = Series(default_line_dir(REPO / "patches"))
    tag = image_tag(series)
    assert server_image.group(3) == f"kimi-k3-rocm:{tag}"
    assert f"K3_IMAGE=kimi-k3-rocm:{tag}\n" in ENV_EXAMPLE
    build = SERVER["build"]
    assert build["dockerfile"] == "docker/Dockerfile" and build["context"] == "."
    assert build["args"]["K3_IMAGE_VERSION"] == tag, "update compose.yaml's build"
    assert build["args"]["K3_SERIES_ID"] == series.series_id, (
        "update compose.yaml's build args to the series (k3rocm pins --write)"
    )
    base = VARIABLE.fullmatch(build["args"]["BASE_IMAGE"])
    assert base.group(1) == "K3_BASE_IMAGE" and base.group(3) == BASE_IMAGE
    for name in MONITORING_SERVICES:
        image = COMPOSE["services"][name]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image


def test_monitoring_is_localhost_only_and_grafana_has_no_default_password():
    for name in MONITORING_SERVICES:
        for port in COMPOSE["services"][name]["ports"]:
            bind = VARIABLE.match(port)
            assert bind and bind.group(1) == "MONITORING_BIND"
            assert bind.group(3) == "127.0.0.1"
    env = COMPOSE["services"]["grafana"]["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == (
        "/run/secrets/grafana_admin_password"
    )
    # A file the operator creates (README's quickstart); none is tracked.
    secret = COMPOSE["secrets"]["grafana_admin_password"]["file"]
    assert not (REPO / VARIABLE.fullmatch(secret).group(3)).exists()


def test_monitoring_is_provisioned_from_the_repo():
    for name in MONITORING_SERVICES:
        for volume in COMPOSE["services"][name]["volumes"]:
            # A ${NAME:-./default} source is checked at its default.
            source = VARIABLE.sub(lambda m: m.group(3) or "", volume).split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), source
    scrape = yaml.safe_load((REPO / "monitoring" / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["kimi-k3:8000"]  # the service name, vLLM's port


def documented() -> set[str]:
    return set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]+)=", ENV_EXAMPLE, re.M))


def test_every_variable_is_documented_in_the_env_example():
    used = {match.group(1) for match in VARIABLE.finditer(yaml.safe_dump(COMPOSE))}
    missing = (used | {setting.env for setting in SETTINGS}) - documented()
    assert not missing, f"not in kimi-k3.env.example: {sorted(missing)}"


def test_env_example_sets_only_what_it_must():
    """Uncommented lines reach the container: no empty optional settings."""
    assigned = re.findall(r"^([A-Z][A-Z0-9_]+)=(.*)$", ENV_EXAMPLE, re.M)
    empty = {name for name, value in assigned if not value}
    assert empty == {"RENDER_GID"}


def test_prometheus_gets_every_rule_file_it_loads():
    """rule_files are globs: a file that is not mounted loads nothing, silently."""
    config = yaml.safe_load((REPO / "monitoring" / "prometheus.yml").read_text())
    mounts = {
        volume.split(":")[1]: volume.split(":")[0]
        for volume in COMPOSE["services"]["prometheus"]["volumes"]
    }
    for rule_file in config["rule_files"]:
        assert mounts[f"/etc/prometheus/{rule_file}"] == f"./monitoring/{rule_file}"
