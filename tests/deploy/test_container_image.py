"""docker/Dockerfile and its build steps, without a Docker engine: the linters
on the files, the tag scheme, scripts/build-image's printed commands, and
each step of docker/build-steps.sh run for real on a copy of the installed
vLLM (0.27.1, or 0.32.0 in that line's environment; the only stand-in: a
ROCm version file, since no ROCm exists here)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.vllm_trees import REPO, SERIES, copy_tree, installed_root

from k3rocm.patchtool.lines import default_line_dir, line_versions
from k3rocm.patchtool.series import Series
from k3rocm.supply_chain.image import ROCM_VERSION, base_image, image_tag

# The Dockerfile's defaults build the default line.
DEFAULT_SERIES = Series(default_line_dir(REPO / "patches"))
BIN = Path(sys.executable).parent
BUILD_STEPS = REPO / "docker" / "build-steps.sh"
DOCKERFILE = REPO / "docker" / "Dockerfile"
STANDIN_DOCKERFILE = REPO / "docker" / "standin" / "Dockerfile"
PIP = (sys.executable, "-m", "pip")


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, STANDIN_DOCKERFILE])
def test_hadolint_is_clean(dockerfile):
    result = subprocess.run(
        [str(BIN / "hadolint"), str(dockerfile)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_is_clean():
    result = subprocess.run(
        ["shellcheck", str(BUILD_STEPS), str(REPO / "scripts" / "docker-engine")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match, name
    return match.group(1)


def test_dockerfile_shape():
    text = DOCKERFILE.read_text()
    assert dockerfile_arg("BASE_IMAGE") == base_image(DEFAULT_SERIES)
    assert dockerfile_arg("ROCM_VERSION") == ROCM_VERSION
    assert dockerfile_arg("K3_VLLM_VERSION") == DEFAULT_SERIES.vllm_version
    # Thin: every RUN is a build step the tests run.
    runs = re.findall(r"^RUN (.*)$", text.replace("\\\n", " "), re.M)
    steps = re.findall(r"build-steps\.sh (\w+)", " ".join(runs))
    assert steps == ["wheel", "install", "patch", "finish"]
    # Builds with the legacy builder and with Engines before 25.
    assert "--start-interval" not in text
    assert "RUN --mount" not in text and "<<" not in text
    for label in (
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.source",
        "k3rocm.vllm.version",
        "k3rocm.supply_chain.rocm.version",
        "k3rocm.patch-series",
    ):
        assert f"{label}=" in text
    assert 'CMD ["python3", "-m", "k3rocm.container.health"]' in text
    assert 'ENTRYPOINT ["dumb-init", "--single-child", "--"]' in text
    assert re.search(r"^USER \$\{K3_UID\}$", text, re.M)


def test_dockerfile_names_versions_only_in_build_argument_defaults():
    """The default line's series.toml and k3rocm.supply_chain.image are the
    versions' homes; the Dockerfile repeats them only where Docker needs a
    default (a build without arguments, as compose's), and the test above
    holds those equal."""
    text = DOCKERFILE.read_text()
    for version in (SERIES.vllm_version, ROCM_VERSION):
        lines = [line for line in text.splitlines() if version in line]
        assert lines and all(line.startswith("ARG ") for line in lines), lines


def test_tag_scheme():
    version = SERIES.vllm_version
    assert image_tag(SERIES) == f"{version}-rocm{ROCM_VERSION}-{SERIES.revision}"
    assert image_tag(SERIES, "7.3") == f"{version}-rocm7.3-{SERIES.revision}"


def build_image(tmp_path, *args: str) -> subprocess.CompletedProcess:
    # A PATH whose `docker` cannot reach an engine (or is absent, as in CI).
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-image"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize("line", [None, *line_versions(REPO / "patches")])
def test_build_image_prints_the_build_without_a_docker_engine(tmp_path, line):
    """Each release line's build (--line), and the default line's without it:
    its tag, its vLLM, its series, vLLM's ROCm image of its vLLM as the base."""
    series = Series(REPO / "patches" / line if line else default_line_dir())
    result = build_image(tmp_path, "--push", *(["--line", line] if line else []))
    assert result.returncode == 0, result.stderr
    assert "no Docker engine reachable" in result.stderr
    lines = result.stdout.splitlines()
    build = shlex.split(next(line for line in lines if line.startswith("docker build")))
    tag = image_tag(series)
    assert build[build.index("--tag") + 1] == f"kimi-k3-rocm:{tag}"
    assert build[build.index("--file") + 1] == "docker/Dockerfile"
    args = dict(
        build[i + 1].split("=", 1) for i, a in enumerate(build) if a == "--build-arg"
    )
    assert args["BASE_IMAGE"] == base_image(series)
    assert args["BASE_IMAGE"] == f"vllm/vllm-openai-rocm:v{series.vllm_version}"
    assert args["K3_VLLM_VERSION"] == series.vllm_version
    assert args["K3_IMAGE_VERSION"] == tag
    assert args["K3_SERIES_ID"] == series.series_id
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", args["K3_GIT_REVISION"])
    # Immutable tags: the push is guarded by a registry lookup.
    guard = next(line for line in lines if "manifest inspect" in line)
    assert "exit 1" in guard
    assert lines.index(guard) < lines.index(f"docker push kimi-k3-rocm:{tag}")


@pytest.fixture
def rocm_root(tmp_path) -> Path:
    """Stand-in for the base image's /opt/rocm: only its version file."""
    info = tmp_path / "rocm" / ".info"
    info.mkdir(parents=True)
    (info / "version").write_text("7.2.0-43\n")
    return info.parent


def build_step(step: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BUILD_STEPS), step],
        capture_output=True,
        text=True,
        env={**os.environ, "K3_PYTHON": sys.executable, **env},
        timeout=300,
    )


def patch_step_env(tree: Path, rocm_root: Path) -> dict[str, str]:
    """The patch step's environment, with the copy ``tree`` as the vLLM this
    interpreter finds, as the base image's is."""
    return {
        "PYTHONPATH": str(tree),
        "K3_ROCM_ROOT": str(rocm_root),
        "ROCM_VERSION": ROCM_VERSION,
        "K3_SERIES_ID": SERIES.series_id,
    }


@pytest.mark.every_line
def test_patch_step_applies_the_series_and_finish_records_it(tmp_path, rocm_root):
    tree = copy_tree(installed_root(), tmp_path / "site")
    env = patch_step_env(tree, rocm_root)
    patched = build_step("patch", **env)
    assert patched.returncode == 0, patched.stderr
    assert f"applied: series {SERIES.series_id}" in patched.stdout
    marker = json.loads((tree / "vllm" / ".k3rocm-patchset.json").read_text())
    assert marker["series_id"] == SERIES.series_id
    assert (tree / "vllm" / "models" / "kimi_k3" / "amd" / "kda_metadata.py").is_file()

    root = tmp_path / "image-root"
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow", "login.defs"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), root / "etc" / name)
    finished = build_step(
        "finish",
        K3_ROOT=str(root),
        K3_UID="4242",
        K3_IMAGE_VERSION=image_tag(SERIES),
        **env,
    )
    assert finished.returncode == 0, finished.stderr
    versions = json.loads((root / "etc" / "k3rocm" / "versions.json").read_text())
    assert versions["vllm"] == SERIES.vllm_version
    assert versions["patch_series"] == SERIES.series_id
    assert versions["rocm"] == "7.2.0-43"
    assert versions["image_tag"] == image_tag(SERIES)
    assert versions["supervisor"] == "4.3.0"
    groups = (root / "etc" / "group").read_text()
    assert re.search(r"^video:.*\bk3\b", groups, re.M)
    assert re.search(r"^render:.*\bk3\b", groups, re.M)
    assert "k3:x:4242:" in (root / "etc" / "passwd").read_text()
    assert (root / "run" / "k3rocm").stat().st_uid == 4242


@pytest.mark.every_line
def test_patch_step_fails_the_build_on_a_drifted_base(tmp_path, rocm_root):
    tree = copy_tree(installed_root(), tmp_path / "site")
    drifted = tree / sorted(SERIES.pristine_files)[0]
    drifted.write_text(drifted.read_text() + "\n# drift\n")
    env = patch_step_env(tree, rocm_root)
    result = build_step("patch", **env)
    assert result.returncode != 0
    assert "has drifted" in result.stderr
    assert not (tree / "vllm" / ".k3rocm-patchset.json").exists()

    wrong_rocm = build_step("patch", **{**env, "ROCM_VERSION": "6.4"})
    assert wrong_rocm.returncode != 0
    assert "ROCm 7.2.0-43, but the image is tagged and labelled ROCm 6.4" in (
        wrong_rocm.stderr
    )


def test_wheel_and_install_steps_build_and_install_hash_pinned(tmp_path):
    """The wheel and install steps in a scratch venv, from PyPI with
    --require-hashes (the wheelhouse is empty in a checkout)."""
    wheels = tmp_path / "dist"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    built = build_step(
        "wheel", K3_PYTHON=python, K3_SOURCE_DIR=str(REPO), K3_DIST=str(wheels)
    )
    assert built.returncode == 0, built.stderr
    assert [w.name for w in wheels.glob("k3rocm-*.whl")] == [
        "k3rocm-0.1.0-py3-none-any.whl"
    ]
    result = build_step("install", K3_PYTHON=python, K3_DIST=str(wheels))
    assert result.returncode == 0, result.stderr
    init = subprocess.run(
        [str(venv / "bin" / "dumb-init"), "--version"], capture_output=True, text=True
    )
    assert "v1.2.5" in init.stdout + init.stderr
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import k3rocm.container.supervise, supervisor",
        ],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
