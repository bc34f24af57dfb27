"""The run directory's files are named once (k3rocm.common.run_files.RUN_FILES)
and the table "The run directory" of docs/container.md lists exactly them."""

from __future__ import annotations

from support.vllm_trees import REPO

from k3rocm.common import run_files
from k3rocm.common.run_files import RUN_FILES, RunFile, run_files_table

CONTAINER_DOC = (REPO / "docs" / "container.md").read_text()


def test_docs_table_lists_exactly_the_run_files():
    section = CONTAINER_DOC.split("\n## The run directory\n", 1)[1].split("\n## ", 1)[0]
    assert run_files_table() in section, (
        "docs/container.md's run directory table differs from "
        "k3rocm.common.run_files.RUN_FILES; paste "
        "k3rocm.common.run_files.run_files_table()"
    )
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [f.name for f in RUN_FILES]


def test_every_run_file_of_the_module_is_in_the_table_once():
    declared = [v for v in vars(run_files).values() if isinstance(v, RunFile)]
    assert sorted(f.name for f in declared) == sorted(f.name for f in RUN_FILES)
    assert len({f.name for f in RUN_FILES}) == len(RUN_FILES)


def test_no_other_file_spells_a_run_file_name():
    """Modules join run_files' names to the run directory; none spells one
    out again as a string (the plain words `ready` and `draining` are left
    out: they also name phases)."""
    names = [f.name for f in RUN_FILES if not f.name.isalpha()]
    offenders = []
    for folder in ("src", "docker", "scripts"):
        for path in (REPO / folder).rglob("*"):
            if (
                not path.is_file()
                or path.suffix == ".pyc"
                or path == REPO / "src" / "k3rocm" / "common" / "run_files.py"
                or "wheelhouse" in path.parts
            ):
                continue
            text = path.read_text(errors="replace")
            offenders += [
                f"{path.relative_to(REPO)}: {name}"
                for name in names
                for quote in "\"'"
                if f"{quote}{name}" in text or f"/{name}" in text
            ]
    assert not offenders, offenders
