"""vLLM's own route table, walked route by route: by the API access tests in
process (tests/container/test_api_access.py) and against the running
container (tests/deploy/test_compose_live.py)."""

from __future__ import annotations

import importlib
import re

from vllm.utils.argparse_utils import FlexibleArgumentParser

from k3rocm.common.vllm_release import TARGET

# Where the installed release has them (they moved in 0.32.0).
build_app = importlib.import_module(TARGET.openai_server_module).build_app
make_arg_parser = importlib.import_module(TARGET.serve_args_module).make_arg_parser


def routes(app) -> list[tuple[str, str, str]]:
    """(method, route path, a concrete path) for every route of the app."""
    found = []
    for route in app.routes:
        methods = sorted(getattr(route, "methods", None) or {"GET"})
        concrete = re.sub(r"\{[^}]+\}", "x", route.path)
        found += [(m, route.path, concrete) for m in methods if m != "HEAD"]
    return found


def plain_app():
    """vLLM's app with none of our middlewares: its route table only."""
    parser = make_arg_parser(FlexibleArgumentParser())
    return build_app(parser.parse_args(["--model", "m"]), supported_tasks=("generate",))
