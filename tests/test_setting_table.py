"""The container's settings table (k3rocm.setting_table) is the one home of
every K3_* setting's default: README's container table and
kimi-k3.env.example agree with it, the Dockerfile's ports and start period
follow it, and no other module in src/ names one of its variables."""

from __future__ import annotations

import re

import pytest
from vllm_trees import REPO

from k3rocm import setting_table
from k3rocm.setting_table import (
    BY_ENV,
    CONTAINER,
    IMAGE,
    LAUNCHER,
    SETTINGS,
    env_text,
    markdown_table,
)

README = (REPO / "README.md").read_text()
ENV_EXAMPLE = (REPO / "kimi-k3.env.example").read_text()
DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()
# `NAME=value` or `# NAME=value` (a default shown, commented out).
EXAMPLE_LINE = re.compile(r"^(# )?(K3_[A-Z0-9_]+)=(.*)$", re.M)


def test_every_setting_has_a_unique_variable_and_a_known_group():
    assert len(BY_ENV) == len(SETTINGS)
    assert len({setting.name for setting in SETTINGS}) == len(SETTINGS)
    for setting in SETTINGS:
        assert setting.group in (LAUNCHER, CONTAINER, IMAGE), setting
        assert (setting.option is not None) == (setting.group == LAUNCHER), setting
        assert setting.meaning.endswith("."), setting.env


def test_readme_container_table_is_the_table():
    section = README.split("### Configuration", 1)[1].split("\n### ", 1)[0]
    assert markdown_table(CONTAINER) in section, (
        "README's configuration table differs from k3rocm.setting_table; "
        "paste `python -m k3rocm.setting_table`'s container table"
    )


def test_env_example_shows_every_setting_at_its_default():
    lines = {name: (commented, value) for commented, name, value in
             EXAMPLE_LINE.findall(ENV_EXAMPLE)}  # fmt: skip
    missing = [setting.env for setting in SETTINGS if setting.env not in lines]
    assert not missing, f"not in kimi-k3.env.example: {missing}"
    for setting in SETTINGS:
        commented, value = lines[setting.env]
        # A commented line shows the default; an uncommented one (K3_MODEL)
        # is a choice, and a setting without a fixed default shows an example.
        if commented and setting.default is not None:
            assert value == env_text(setting.default), setting.env


@pytest.mark.parametrize("group", [LAUNCHER, CONTAINER])
def test_markdown_table_rows_match_the_settings(group):
    rows = markdown_table(group).splitlines()[2:]
    assert len(rows) == sum(1 for s in SETTINGS if s.group == group)


def test_dockerfile_follows_the_table():
    exposed = re.search(r"^EXPOSE (.+)$", DOCKERFILE, re.M).group(1).split()
    assert exposed == [
        str(setting_table.PORT.default),
        str(setting_table.STATUS_PORT.default),
    ]
    # The health check's start period covers loading, as the smoke test's
    # load timeout does.
    period = re.search(r"--start-period=(\d+)h", DOCKERFILE).group(1)
    assert int(period) * 3600 == setting_table.SMOKE_LOAD_TIMEOUT.default
    for setting in SETTINGS:
        assert f"{setting.env}=" not in DOCKERFILE or setting is (
            setting_table.IMAGE_TAG
        ), f"{setting.env}'s default belongs in k3rocm.setting_table"


def test_no_other_module_names_a_setting_of_the_table():
    """Modules read a setting through its row (its env and default), never
    by spelling the variable out again."""
    offenders = []
    for path in (REPO / "src" / "k3rocm").rglob("*.py"):
        if path.name == "setting_table.py" and path.parent.name == "k3rocm":
            continue
        for name in re.findall(r"""["'](K3_[A-Z0-9_]+)["']""", path.read_text()):
            if name in BY_ENV:
                offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert not offenders, offenders
