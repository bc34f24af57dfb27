"""Checks that look at this machine: the model checkpoint, the API key file,
the GPUs visible here and the inherited environment."""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from pathlib import Path

from k3rocm.launcher.profiles import REQUIRED_AMD_ENV
from k3rocm.launcher.settings import InvalidSettings, LaunchSettings, label

# A Hugging Face model id: a name, optionally under an owner.
MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def check_machine(settings: LaunchSettings, environ: Mapping[str, str]) -> str | None:
    """Return the API key (None without a key file); raise InvalidSettings
    listing every problem found."""
    problems: list[str] = []
    _check_model(settings.model, problems)
    api_key = _read_api_key(settings.api_key_file, problems)
    if settings.profile.kimi_on_rocm:
        _check_gpus(settings, problems)
        _check_inherited_env(environ, problems)
    if problems:
        raise InvalidSettings(problems)
    return api_key


def is_local_path(model: str) -> bool:
    """Explicit paths, and anything naming an existing directory, are local;
    the rest must be model ids."""
    return model.startswith(("/", ".", "~")) or Path(model).is_dir()


def _check_model(model: str, problems: list[str]) -> None:
    if not is_local_path(model):
        if not MODEL_ID.fullmatch(model):
            problems.append(
                f"{label('model')} is {model!r}: no such directory, and not a "
                "Hugging Face model id (OWNER/NAME); set it to the checkpoint "
                "directory or a model id such as moonshotai/Kimi-K3."
            )
        return
    directory = Path(model).expanduser()
    if not directory.is_dir():
        problems.append(
            f"{label('model')} is {model!r}, which does not exist (or is not a "
            "directory) on this node; mount the checkpoint there or point the "
            "setting at its directory."
        )
    elif not (directory / "config.json").is_file():
        problems.append(
            f"{label('model')} is {model!r}, which has no config.json; point it at "
            "the checkpoint's top directory (the one holding config.json and the "
            "weights)."
        )


def _read_api_key(path: Path | None, problems: list[str]) -> str | None:
    if path is None:
        return None
    fix = f"create it with the key as its only content and `chmod 600 {path}`"
    if not path.is_file():
        problems.append(
            f"{label('api_key_file')} is {str(path)!r}, which is not an existing "
            f"file; {fix}, or unset the setting to serve without a key."
        )
        return None
    if path.stat().st_mode & stat.S_IROTH:
        problems.append(
            f"{label('api_key_file')} {str(path)!r} is readable by every user; "
            f"restrict it: `chmod o-rwx {path}` (or `chmod 600 {path}`)."
        )
        return None
    try:
        key = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        problems.append(
            f"{label('api_key_file')} {str(path)!r} cannot be read as text "
            f"({error}); {fix}."
        )
        return None
    if not key or any(char.isspace() for char in key):
        problems.append(
            f"{label('api_key_file')} {str(path)!r} must hold exactly one key "
            f"without spaces; {fix}."
        )
        return None
    return key


def count_render_devices(dri_dir: Path) -> int:
    """One renderD* node per GPU the kernel driver exposes here."""
    return len(list(dri_dir.glob("renderD*")))


def _check_gpus(settings: LaunchSettings, problems: list[str]) -> None:
    profile = settings.profile
    needed = profile.world_size // settings.num_nodes
    if settings.gpu_count is not None:
        visible, source = settings.gpu_count, f"set by {label('gpu_count')}"
    else:
        visible = count_render_devices(settings.dri_dir)
        source = f"renderD* devices in {settings.dri_dir}"
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
                f"{name} is {value!r} in the environment, but Kimi-K3 on ROCm "
                f"requires {name}={required}; unset it."
            )
