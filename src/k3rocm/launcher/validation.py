"""Checks that look at this machine: the model checkpoint, the API key file,
the GPUs visible here and the inherited environment."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Set
from pathlib import Path
from typing import TypeVar

from k3rocm.common.api_key import ApiKeyFileError, read_api_key
from k3rocm.common.profiles import REQUIRED_AMD_ENV, MultiNode
from k3rocm.launcher.addresses import check_node_addresses
from k3rocm.launcher.messages import InvalidSettings, label, shown
from k3rocm.launcher.settings import LaunchSettings

# A Hugging Face model id: a name, optionally under an owner.
MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# Far beyond any model's config.json.
MAX_CONFIG_BYTES = 16 * 2**20
# Settings the GPU count check builds on.
GPU_CHECK_INPUTS = frozenset({"profile", "num_nodes", "gpu_count", "dri_dir"})
# Settings the address checks build on.
NODE_INPUTS = frozenset({"profile", "node_rank", "master_addr"})

T = TypeVar("T")


class _Unexaminable(Exception):
    """A path this user cannot look at; the problem is already reported."""


def check_machine(settings: LaunchSettings, environ: Mapping[str, str]) -> str | None:
    """Return the API key (None without a key file); raise InvalidSettings
    listing every problem found."""
    api_key, problems = inspect_machine(settings, environ)
    if problems:
        raise InvalidSettings(problems)
    return api_key


def inspect_machine(
    settings: LaunchSettings,
    environ: Mapping[str, str],
    invalid: Set[str] = frozenset(),
) -> tuple[str | None, list[str]]:
    """The API key (None without a key file) and every problem found; checks
    building on a setting in invalid (already reported) are left out."""
    problems: list[str] = []
    if "model" not in invalid:
        _check_model(settings.model, problems)
    api_key = None
    if "api_key_file" not in invalid:
        api_key = _read_api_key(settings.api_key_file, problems)
    if settings.profile.kimi_on_rocm and "profile" not in invalid:
        if not GPU_CHECK_INPUTS & invalid:
            _check_gpus(settings, problems)
        _check_inherited_env(environ, problems)
    if settings.profile.multi_node is MultiNode.NATIVE and not NODE_INPUTS & invalid:
        check_node_addresses(settings, environ, problems)
    return api_key, problems


def _examine(
    name: str, path: str | Path, look: Callable[[], T], problems: list[str]
) -> T:
    """look() at path, turning what the file system refuses (no permission,
    a name too long, ...) into a problem for setting name."""
    try:
        return look()
    except (OSError, ValueError) as error:
        reason = os.strerror(error.errno) if getattr(error, "errno", None) else error
        problems.append(
            f"{label(name)} is {shown(str(path))}, which cannot be examined on this "
            f"node ({reason}); make every directory on the way enterable (and the "
            "file readable) for this user, or point the setting elsewhere."
        )
        raise _Unexaminable from error


def is_local_path(model: str) -> bool:
    """Explicit paths, and anything naming an existing directory, are local;
    the rest must be model ids."""
    return model.startswith(("/", ".", "~")) or Path(model).is_dir()


def _check_model(model: str, problems: list[str]) -> None:
    try:
        _check_model_path(model, problems)
    except _Unexaminable:
        pass


def _check_model_path(model: str, problems: list[str]) -> None:
    if not _examine("model", model, lambda: is_local_path(model), problems):
        if not MODEL_ID.fullmatch(model):
            problems.append(
                f"{label('model')} is {shown(model)}: no such directory, and not a "
                "Hugging Face model id (OWNER/NAME); set it to the checkpoint "
                "directory or a model id such as moonshotai/Kimi-K3."
            )
        return
    directory = Path(model)
    if not _examine("model", model, directory.is_dir, problems):
        problems.append(
            f"{label('model')} is {shown(model)}, which does not exist (or is not "
            "a directory) on this node; mount the checkpoint there or point the "
            "setting at its directory."
        )
    elif not _examine("model", model, (directory / "config.json").is_file, problems):
        problems.append(
            f"{label('model')} is {shown(model)}, which has no config.json; point "
            "it at the checkpoint's top directory (the one holding config.json "
            "and the weights)."
        )
    else:
        _check_config_json(directory / "config.json", problems)


def _check_config_json(path: Path, problems: list[str]) -> None:
    """vLLM reads config.json first thing; a file it cannot read or parse
    would end in tracebacks and retried starts instead of one line."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES // 2**20} MiB")
        config = json.loads(data)
    except OSError as error:
        problems.append(
            f"{label('model')}'s {shown(str(path))} cannot be read "
            f"({os.strerror(error.errno) if error.errno else error}); make it "
            "readable for this user (uid 1000 in the image)."
        )
        return
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError included
        problems.append(
            f"{label('model')}'s {shown(str(path))} is not valid JSON "
            f"({str(error)[:200]}); restore the checkpoint's config.json."
        )
        return
    if not isinstance(config, dict):
        problems.append(
            f"{label('model')}'s {shown(str(path))} holds a JSON "
            f"{type(config).__name__}, not an object; restore the checkpoint's "
            "config.json."
        )


def _read_api_key(path: Path | None, problems: list[str]) -> str | None:
    if path is None:
        return None
    try:
        return read_api_key(path, label("api_key_file"))
    except ApiKeyFileError as error:
        problems.append(str(error))
        return None


def count_render_devices(dri_dir: Path) -> int:
    """One renderD* node per GPU the kernel driver exposes here."""
    return len(list(dri_dir.glob("renderD*")))


def _check_gpus(settings: LaunchSettings, problems: list[str]) -> None:
    profile = settings.profile
    needed = profile.world_size // settings.num_nodes
    if settings.gpu_count is not None:
        visible, source = settings.gpu_count, f"set by {label('gpu_count')}"
    else:
        dri_dir = settings.dri_dir
        try:
            visible = _examine(
                "dri_dir", dri_dir, lambda: count_render_devices(dri_dir), problems
            )
        except _Unexaminable:
            return
        source = f"renderD* devices in {dri_dir}"
    if visible >= needed:
        return
    layout = (
        f"TP {profile.tensor_parallel} x DP {profile.data_parallel} = "
        f"{profile.world_size} GPUs over {settings.num_nodes} node(s)"
    )
    problems.append(
        f"profile {profile.name} needs {needed} GPUs on this node ({layout}), but "
        f"{visible} are visible ({source}); give the container every GPU "
        "(--device /dev/dri and /dev/kfd), pick a profile that fits, or set "
        f"{label('gpu_count')} if the count is wrong."
    )


def _check_inherited_env(environ: Mapping[str, str], problems: list[str]) -> None:
    for name, required in REQUIRED_AMD_ENV.items():
        value = environ.get(name) or None  # compose passes unset as empty
        if value is not None and value != required:
            problems.append(
                f"{name} is {shown(value)} in the environment, but Kimi-K3 on ROCm "
                f"requires {name}={required}; unset it."
            )
