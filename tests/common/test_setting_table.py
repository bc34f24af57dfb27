"""The container's settings table (k3rocm.common.setting_table) is the one home of
every K3_* setting's default: README's container table and
kimi-k3.env.example agree with it, the Dockerfile's ports and start period
follow it, and no other module in src/ names one of its variables."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.vllm_trees import REPO

from k3rocm.common import setting_kinds, setting_table
from k3rocm.common.setting_kinds import CONTAINER, IMAGE, LAUNCHER, env_text
from k3rocm.common.setting_table import BY_ENV, BY_NAME, SETTINGS, markdown_table

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


def test_readme_container_table_has_one_row_per_container_setting():
    """Read from the README itself, not through the generator: a row the
    generator dropped, or one it doubled, fails here."""
    section = README.split("### Configuration", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `(K3_[A-Z0-9_]+)` \|", section, re.M)
    assert sorted(rows) == sorted(s.env for s in SETTINGS if s.group == CONTAINER)


def test_readme_container_table_is_the_table():
    section = README.split("### Configuration", 1)[1].split("\n### ", 1)[0]
    assert markdown_table(CONTAINER) in section, (
        "README's configuration table differs from k3rocm.common.setting_table; "
        "paste `python -m k3rocm.common.setting_table`'s container table"
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
        ), f"{setting.env}'s default belongs in k3rocm.common.setting_table"


def test_no_other_module_names_a_setting_of_the_table():
    """Modules read a setting through its row (its env and default), never
    by spelling the variable out again."""
    offenders = []
    for path in (REPO / "src" / "k3rocm").rglob("*.py"):
        if path.name == "setting_table.py" and path.parent.name == "common":
            continue
        for name in re.findall(r"""["'](K3_[A-Z0-9_]+)["']""", path.read_text()):
            if name in BY_ENV:
                offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert not offenders, offenders


# One number parser for every setting: a whole number is ASCII digits only
# (leading zeros too), within the row's bounds, whatever the text; checked
# against a reference written from that rule, not from the parser.
WHOLE_ROWS = [s for s in SETTINGS if isinstance(s.kind, setting_kinds.Whole)]
PORT = next(s for s in WHOLE_ROWS if s.env == "K3_PORT")


# Leading zeros past the bound's digits (hypothesis found the parser
# refusing it while it counted the zeros as digits).
@example(row=PORT, text="000001")
@given(
    row=st.sampled_from(WHOLE_ROWS),
    text=st.one_of(
        st.integers(-10, 10**7).map(str),
        st.text(alphabet="0123456789 +-_.e٣x", min_size=1, max_size=25),
    ),
)
def test_every_whole_number_setting_parses_as_the_rule_says(row, text):
    text = text.strip()
    high = row.kind.high if row.kind.high is not None else 10**18 - 1
    expected = (
        int(text)
        if re.fullmatch(r"[0-9]+", text) and row.kind.low <= int(text) <= high
        else None
    )
    try:
        got = row.read({row.env: text})
    except setting_kinds.SettingError as err:
        assert expected is None and text, (text, expected)
        assert str(err).startswith(f"{row.env} is "), err
        return
    assert got == (expected if text else row.default)


def test_a_refused_value_names_the_setting_and_a_value_that_works():
    _, problems = setting_kinds.read_all(
        {"K3_STATUS_PORT": "80a", "K3_SMOKE_ON_FAILURE": "ignore",
         "K3_SMOKE_STAGE1_TIMEOUT": "-1", "K3_STALL_SECONDS": "4"},
        SETTINGS,
    )  # fmt: skip
    assert problems == [
        "K3_SMOKE_ON_FAILURE is 'ignore'; set one of stop, warn (default stop)",
        "K3_SMOKE_STAGE1_TIMEOUT is '-1', not a number of seconds above 0 and "
        "below 1e+07; set one, e.g. K3_SMOKE_STAGE1_TIMEOUT=900.",
        "K3_STATUS_PORT is '80a', not a whole number from 1 to 65535; set a "
        "whole number in that range, e.g. K3_STATUS_PORT=8001.",
        "K3_STALL_SECONDS is '4', not a whole number from 5 to 86400; set a "
        "whole number in that range, e.g. K3_STALL_SECONDS=300.",
    ]


def test_every_default_is_a_value_its_row_accepts():
    for setting in SETTINGS:
        if setting.default is not None and setting.takes_value:
            assert setting.parse(env_text(setting.default)) == setting.default


def test_the_launch_settings_are_the_launcher_rows():
    """LaunchSettings has one typed field per launcher row and nothing else
    but the stop budget; unset, a field not worked out is its row's default,
    and the budget is the default grace's."""
    from dataclasses import fields

    from k3rocm.launcher.settings import WORKED_OUT, LaunchSettings, resolve

    rows = {s.name for s in SETTINGS if s.group == LAUNCHER}
    declared = {f.name for f in fields(LaunchSettings)}
    assert declared == rows | {"stop_budget"}
    assert WORKED_OUT <= rows
    settings = resolve(dict.fromkeys(rows))
    for name in rows - WORKED_OUT:
        assert getattr(settings, name) == BY_NAME[name].default, name
    assert settings.stop_budget.grace_seconds == BY_NAME["stop_grace_seconds"].default


def test_a_typed_row_has_no_unchecked_text():
    """Only a text row hands out its text unparsed; a typed row (a number,
    a choice, a path, a flag) is read through its kind."""
    for setting in SETTINGS:
        if isinstance(setting.kind, setting_kinds.Text):
            assert setting.text({}) == env_text(setting.default)
        else:
            with pytest.raises(TypeError, match=setting.env):
                setting.text({setting.env: "x"})


def test_owned_flags_come_from_the_rows():
    from k3rocm.launcher.owned_flags import FALLBACK_OWNED_FLAGS, OWNED_DESTS

    for setting in SETTINGS:
        assert not setting.owns or setting.group == LAUNCHER, setting.env
        for flag in setting.owns:
            assert FALLBACK_OWNED_FLAGS[flag] == setting.name
    assert OWNED_DESTS["tensor_parallel_size"] == "profile"
    assert OWNED_DESTS["model_tag"] == "model"


TABLE_MODULE = "k3rocm.common.setting_table"
# Each row by its Python name in the table.
ROW_NAMES = {
    id(value): name
    for name, value in vars(setting_table).items()
    if isinstance(value, setting_table.Setting)
}


def table_names_in(reader: str) -> tuple[set[str], set[str], set[str]]:
    """What a reader module (every module of a package) takes from
    k3rocm.common.setting_table, as ``from k3rocm.common.setting_table import NAME`` or
    ``setting_table.NAME``, the strings its code holds, and the attributes
    it reads of a LaunchSettings (``settings.NAME``)."""
    spec = importlib.util.find_spec(f"k3rocm.{reader}")
    assert spec is not None and spec.origin, f"no module k3rocm.{reader}"
    if spec.submodule_search_locations:  # a package: all its modules
        paths = sorted(
            path
            for location in spec.submodule_search_locations
            for path in Path(location).rglob("*.py")
        )
    else:
        paths = [Path(spec.origin)]
    names: set[str] = set()
    strings: set[str] = set()
    launch_attributes: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == TABLE_MODULE:
                names.update(alias.name for alias in node.names)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "setting_table"
            ):
                names.add(node.attr)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "settings"
            ):
                launch_attributes.add(node.attr)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
    return names, strings, launch_attributes


def test_every_reader_named_by_a_row_reads_it():
    """Each module a row names as a reader takes the row from the table: by
    its Python name, or, where it looks rows up by name (BY_NAME: the
    launcher's resolver), by the row's name, or, where it reads every
    launcher row (LAUNCHER_SETTINGS), as the LaunchSettings attribute of the
    row's name. A module that no longer reads the setting fails, as does one
    that does not exist."""
    stale = []
    for setting in SETTINGS:
        for reader in setting.readers:
            names, strings, launch_attributes = table_names_in(reader)
            if (
                ROW_NAMES[id(setting)] not in names
                and not ("BY_NAME" in names and setting.name in strings)
                and not (
                    "LAUNCHER_SETTINGS" in names and setting.name in launch_attributes
                )
            ):
                stale.append(f"{setting.env}: k3rocm.{reader}")
    assert not stale, f"readers that do not read the setting: {stale}"
