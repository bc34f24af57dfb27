"""Everything the launcher checks before vLLM starts, as a library: the
launcher's main runs it, and so does the container's start
(``k3rocm.container.supervise run``) before anything loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from k3rocm.common.setting_kinds import read_all
from k3rocm.common.setting_table import CONTAINER_SETTINGS
from k3rocm.launcher.settings import LaunchSettings, raw_settings, resolve_all
from k3rocm.launcher.spec_mode import spec_mode_problems
from k3rocm.launcher.step_bound import step_bound_problems
from k3rocm.launcher.validation import inspect_machine


def check(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[LaunchSettings, str | None, list[str]]:
    """The settings, the API key and every problem with them: what the
    container's start would refuse, its own settings included (so a dry run
    reports all of it). ``k3rocm.container.supervise run`` asks this before
    anything starts."""
    raw, passthrough = raw_settings(argv, environ)
    resolution = resolve_all(raw, passthrough)
    settings = resolution.settings
    # The machine is looked at even when settings are wrong, so one run
    # reports every problem; checks building on a refused setting are skipped.
    api_key, machine_problems = inspect_machine(settings, environ, resolution.invalid)
    container_problems = read_all(environ, CONTAINER_SETTINGS)[1]
    # The KDA kernels' proven step reads the profile and the extra arguments.
    step_problems = (
        []
        if {"profile", "extra_args"} & resolution.invalid
        else step_bound_problems(settings)
    )
    # dspark's PIECEWISE CUDA graphs, which the extra arguments must not undo.
    spec_problems = (
        []
        if {"features", "extra_args"} & resolution.invalid
        else spec_mode_problems(settings)
    )
    return (
        settings,
        api_key,
        [
            *resolution.problems,
            *machine_problems,
            *container_problems,
            *step_problems,
            *spec_problems,
        ],
    )
