"""``python -m k3rocm.accept``: the command of the acceptance run
(k3rocm.accept.run): vLLM's own ``vllm bench serve`` at each concurrency,
then the accuracy gate, against a running server; a JSON and a Markdown
report in --output-dir, the Markdown also on stdout.

Exit codes: 0 passed; 1 accuracy under --threshold; 2 bad options or no
server to talk to; 3 the benchmark failed (vLLM's benchmark exited non-zero,
or requests failed in it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
from pathlib import Path

from k3rocm.accept import report
from k3rocm.accept.accuracy import ENDPOINTS
from k3rocm.accept.bench import Workload
from k3rocm.accept.run import PASSED, accuracy_gate, bench_runs, verdict_of
from k3rocm.common.api_address import BadAddress, api_base_url
from k3rocm.common.api_key import api_key_from_env, read_api_key
from k3rocm.common.line_log import line_logger
from k3rocm.common.setting_table import KDA_METADATA

EXIT_PASS, EXIT_ACCURACY, EXIT_USAGE, EXIT_BENCH = 0, 1, 2, 3


log = line_logger("k3rocm.accept")


def positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 10**7):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number > 0")
    return int(text)


def whole(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) < 10**7):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number >= 0")
    return int(text)


def concurrencies(text: str) -> tuple[int, ...]:
    values = tuple(positive(part.strip()) for part in text.split(","))
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text[:60]!r} names a concurrency twice")
    return values


def _number(text: str, fits, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not fits(value):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what}")
    return value


def fraction(text: str) -> float:
    return _number(text, lambda value: 0 <= value <= 1, "a number from 0 to 1")


def seconds(text: str) -> float:
    return _number(text, lambda value: 0 < value < 1e7, "a number of seconds")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m k3rocm.accept",
        description="vllm bench serve (random data set) at each concurrency, then "
        "an accuracy gate of generated arithmetic word problems, against the "
        "running server (README, 'Check it on your hardware').",
    )
    p.add_argument("--base-url", help="the API server (default: K3_HOST and K3_PORT)")
    p.add_argument(
        "--api-key-file", help="file holding the API key (default: K3_API_KEY_FILE)"
    )
    p.add_argument(
        "--concurrency",
        type=concurrencies,
        default=(8, 16, 32, 64),
        help="comma-separated concurrencies (default 8,16,32,64)",
    )
    p.add_argument(
        "--input-len",
        type=positive,
        default=1024,
        help="prompt tokens per request (default 1024)",
    )
    p.add_argument(
        "--output-len",
        type=positive,
        default=512,
        help="output tokens per request, EOS ignored (default 512)",
    )
    p.add_argument(
        "--prompts-per-concurrency",
        type=positive,
        default=8,
        help="measured prompts = this x concurrency (default 8)",
    )
    p.add_argument(
        "--warmups-per-concurrency",
        type=whole,
        default=1,
        help="warm-up requests (not measured) = this x concurrency (default 1)",
    )
    p.add_argument(
        "--seed",
        type=whole,
        default=0,
        help="seed of the prompts and the problems (default 0)",
    )
    p.add_argument(
        "--problems",
        type=whole,
        default=100,
        help="arithmetic problems of the accuracy gate; 0 skips it (default 100)",
    )
    p.add_argument(
        "--threshold",
        type=fraction,
        default=0.9,
        help="lowest accuracy that passes (default 0.9)",
    )
    p.add_argument(
        "--accuracy-concurrency",
        type=positive,
        default=32,
        help="problems asked at once (default 32)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive,
        default=4096,
        help="tokens a reply may take, reasoning included (default 4096)",
    )
    p.add_argument(
        "--accuracy-endpoint",
        choices=ENDPOINTS,
        default="chat",
        help="chat (the model's chat template) or completions "
        "(a plain prompt; default chat)",
    )
    p.add_argument("--no-bench", action="store_true", help="only the accuracy gate")
    p.add_argument(
        "--bench-timeout",
        type=seconds,
        default=7200,
        help="seconds for one concurrency's benchmark (default 7200)",
    )
    p.add_argument(
        "--request-timeout",
        type=seconds,
        default=1800,
        help="seconds for one accuracy request (default 1800)",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        help="where the reports go (default ./k3rocm-accept-<UTC time>)",
    )
    return p


def served_model(base_url: str, api_key: str | None) -> tuple[str, str]:
    """The served model's name and its root (the checkpoint, which has the
    tokenizer vLLM's benchmark loads), from /v1/models."""
    import urllib.request

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(base_url + "/v1/models", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        first = json.loads(response.read())["data"][0]
    return first["id"], first.get("root") or first["id"]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    environ = os.environ
    try:
        base_url = (args.base_url or api_base_url(environ)).rstrip("/")
        path_name = KDA_METADATA.read(environ)
        api_key = (
            read_api_key(Path(args.api_key_file), "--api-key-file")
            if args.api_key_file
            else api_key_from_env(environ)
        )
    except (BadAddress, ValueError, OSError) as err:
        log(f"cannot start: {err}")
        return EXIT_USAGE
    try:
        served_name, model = served_model(base_url, api_key)
    except urllib.error.HTTPError as err:
        log(f"cannot start: {base_url}/v1/models answered HTTP {err.code}")
        return EXIT_USAGE
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        log(f"cannot start: no model list from {base_url}/v1/models: {err}")
        return EXIT_USAGE
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    directory = args.output_dir or Path(f"k3rocm-accept-{stamp}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log(f"cannot start: cannot write the reports in {directory}: {err}")
        return EXIT_USAGE
    workload = Workload(
        args.input_len,
        args.output_len,
        args.prompts_per_concurrency,
        args.warmups_per_concurrency,
        args.seed,
    )
    runs, bench_error = bench_runs(
        base_url,
        model,
        served_name,
        workload,
        () if args.no_bench else args.concurrency,
        directory,
        environ,
        api_key,
        args.bench_timeout,
        log,
    )
    accuracy = None
    if args.problems and bench_error is None:
        log(f"accuracy gate: {args.problems} problems ...")
        accuracy = accuracy_gate(
            base_url,
            api_key,
            served_name,
            count=args.problems,
            seed=args.seed,
            concurrency=args.accuracy_concurrency,
            endpoint=args.accuracy_endpoint,
            max_tokens=args.max_tokens,
            timeout=args.request_timeout,
            threshold=args.threshold,
        )
    verdict = verdict_of(bench_error, accuracy)
    document = {
        "format": report.FORMAT,
        "verdict": verdict,
        "time": stamp,
        "server": {
            "base_url": base_url,
            "served_model_name": served_name,
            "model": model,
            "kda_metadata": path_name,
        },
        "bench": {
            "workload": {**vars(workload), "concurrency": list(args.concurrency)},
            "runs": runs,
            "error": bench_error,
        },
        "accuracy": accuracy,
    }
    as_json, _ = report.write(document, directory)
    sys.stdout.write(report.markdown(document))
    log(f"{verdict}; reports in {as_json.parent}")
    if bench_error is not None:
        log(bench_error)
        return EXIT_BENCH
    return EXIT_ACCURACY if verdict != PASSED else EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
