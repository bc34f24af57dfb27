"""compose.yaml made into the stack of a machine without a GPU: the server
without AMD's devices, groups and limits, on the cpu-dev profile and the
tiny model; the monitoring services as they are (or from other images,
where Docker Hub cannot be reached).

    python -m k3rocm.tryout.stack [--image SERVICE=REF ...] < compose.yaml

prints the stack as JSON (which Compose reads as YAML). scripts/try-cpu runs
it inside the image it built, so the host needs no YAML library.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping

import yaml

from k3rocm.common.line_log import line_logger
from k3rocm.tryout.cpu import CPU_SERVER_ENV, SERVER

log = line_logger("k3rocm.tryout.stack")

# What compose.yaml gives the server for AMD GPUs, which a CPU machine lacks
# (and `build`: the try-out runs the image it built on the stand-in base).
GPU_ONLY_KEYS = ("devices", "group_add", "ulimits", "build")


def cpu_stack(compose: dict, images: Mapping[str, str] | None = None) -> dict:
    """compose.yaml's stack for a CPU machine; images (none by default)
    replace the named services' images."""
    stack = copy.deepcopy(compose)
    server = stack["services"][SERVER]
    for key in GPU_ONLY_KEYS:
        server.pop(key, None)
    server["environment"] = {**server["environment"], **CPU_SERVER_ENV}
    for service, image in (images or {}).items():
        if service not in stack["services"]:
            raise ValueError(f"compose.yaml has no service {service!r}")
        stack["services"][service]["image"] = image
    return stack


def _image(text: str) -> tuple[str, str]:
    service, _, image = text.partition("=")
    if not service or not image:
        raise argparse.ArgumentTypeError(f"{text!r} is not SERVICE=IMAGE")
    return service, image


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m k3rocm.tryout.stack")
    parser.add_argument("--image", type=_image, action="append", default=[])
    args = parser.parse_args(argv)
    try:
        stack = cpu_stack(yaml.safe_load(sys.stdin), dict(args.image))
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        log(f"not a usable compose.yaml: {err}")
        return 2
    json.dump(stack, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
