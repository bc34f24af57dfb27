"""Upstream triage: what newer vLLM releases change in the files we watch.

    python -m k3rocm.patchtool.triage RELEASE [RELEASE ...] [--base TREE]

``RELEASE`` is a vLLM tree (the directory that holds ``vllm/``) or a vLLM
wheel; ``--base`` is the tree the series targets (default: the installed
vLLM, which must be the series' version). The releases are sorted by
version and compared step by step, base first, function by function: every
top-level function, every method of a top-level class (``Class.method``),
each class's own body (``Class``), each top-level assignment (by the names
it binds) and the rest of the module (``<module>``: imports, ``if``/``try``
blocks). Two units are the same when their syntax trees are, docstrings
left out: comments, formatting and docstrings do not count as changes.

``patches/0.27.1/upstream-triage.toml`` holds one entry per upstream change to
the watched files (its pull request, the first release containing it, its
kind, the units it changes and the decision). A unit that changes in the
step ``(previous, release]`` is covered by an entry of a release in that
step that names it. The command prints every step's changes with the
entries covering them and exits 1 when a change is uncovered, when an
entry names a unit that did not change in its step (checked where the step
spans one triaged release; pass every release for the full check) or a
backport names a patch the series does not list; 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.patchtool.lines import installed_line_dir
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.patching import find_installed_target
from k3rocm.patchtool.series import Series
from k3rocm.patchtool.triage_file import (
    TRIAGE_NAME,
    Triage,
    TriageError,
    load_triage,
    shipped_triage,
    unlisted_patches,
    version_key,
)
from k3rocm.patchtool.triage_steps import Step, triage_chain
from k3rocm.patchtool.triage_trees import read_tree

EXIT_OK, EXIT_UNCOVERED, EXIT_USAGE = 0, 1, 2


def render(steps: list[Step], triage: Triage) -> str:
    lines = []
    for step in steps:
        lines.append(
            f"== vLLM {step.old.version} -> {step.new.version} "
            f"({step.new.label}{'; ' + step.new.note if step.new.note else ''})"
        )
        if version_key(step.new.version) > version_key(triage.through):
            lines.append(
                f"   newer than the triage (through {triage.through}): add "
                f"entries for its changes to {triage.path.name}"
            )
        if not step.files:
            lines.append("   no watched unit changed")
        for file in step.files:
            lines.append(f"   {file.status} file {file.path}")
            for change in file.units:
                by = step.covering[change]
                mark = ", ".join(e.label for e in by)
                lines.append(
                    f"     {change.status:8} {change.unit} (line {change.line})  "
                    + (mark if by else "UNCOVERED")
                )
        for entry, pattern in step.stale:
            if step.failing_stale:
                lines.append(
                    f"   STALE {entry.label} ({entry.release}) names {pattern}, "
                    "which did not change in this step"
                )
            else:
                lines.append(
                    f"   note: {entry.label} ({entry.release}) names {pattern}, "
                    f"unchanged across these {step.spans} releases (pass the "
                    "releases between them to check it)"
                )
    uncovered = sum(len(s.uncovered) for s in steps)
    stale = sum(len(s.failing_stale) for s in steps)
    changed = sum(len(s.covering) for s in steps)
    lines.append(
        f"{changed} changed units, {uncovered} uncovered, {stale} stale entry "
        f"names ({triage.path})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.patchtool.triage",
        description="What newer vLLM releases change in the watched files, "
        "function by function, and which changes no entry of the upstream "
        "triage covers.",
    )
    parser.add_argument(
        "releases",
        nargs="+",
        type=Path,
        metavar="RELEASE",
        help="a newer vLLM: a directory holding vllm/, or a wheel",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="the series' vLLM (a directory or a wheel; default: the installed vLLM)",
    )
    parser.add_argument(
        "--triage",
        type=Path,
        help=f"the triage file (default: the series' {TRIAGE_NAME})",
    )
    args = parser.parse_args(argv)
    try:
        series = Series(installed_line_dir())
        triage = (
            load_triage(args.triage, series) if args.triage else shipped_triage(series)
        )
        if args.base is None:
            try:
                args.base = find_installed_target()
            except Refusal as err:
                raise TriageError(f"{err} (or pass --base)") from None
        base = read_tree(args.base, triage)
        if base.version != triage.base:
            raise TriageError(
                f"the base {base.label} is vLLM {base.version}; the triage starts "
                f"at {triage.base}"
            )
        steps = triage_chain(
            base, [read_tree(p, triage) for p in args.releases], triage
        )
        unlisted_patches(triage, series)
    except TriageError as err:
        line_logger("triage")(str(err))
        return EXIT_USAGE
    print(render(steps, triage))
    unlisted = unlisted_patches(triage, series)
    for problem in unlisted:
        print(f"backport names a patch the series does not list: {problem}")
    failed = unlisted or any(s.uncovered or s.failing_stale for s in steps)
    return EXIT_UNCOVERED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
