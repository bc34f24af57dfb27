"""Properties of the launcher over generated input, run in this process with
--dry-run (so nothing starts):

- every spelling vLLM 0.27.1's parser accepts for a flag the launcher owns
  (unambiguous prefixes, `=` forms, `_` for `-`, short aliases) is refused
  with exit 2, naming the setting to use instead;
- any settings at all (unicode, NUL, huge numbers, whitespace, paths that
  exist or not, any profile and features) end in exit 0, 2 or 127, never in a
  traceback, and never show the API key.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import shlex
import tempfile
import traceback
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from k3rocm.common.profiles import FEATURES, PROFILES
from k3rocm.common.vllm_release import TARGET
from k3rocm.launcher.__main__ import main

API_KEY = "k3-prop-key-9d1e7b40"

# The destinations of vLLM's flags the launcher owns, and the variable to
# use instead; written out from issue 11, not taken from the launcher.
OWNED_DESTS = {
    "model": "K3_MODEL",
    "served_model_name": "K3_SERVED_MODEL_NAME",
    "host": "K3_HOST",
    "port": "K3_PORT",
    "max_model_len": "K3_MAX_MODEL_LEN",
    "max_num_seqs": "K3_MAX_NUM_SEQS",
    "tensor_parallel_size": "K3_PROFILE",
    "data_parallel_size": "K3_PROFILE",
    "nnodes": "K3_NUM_NODES",
    "node_rank": "K3_NODE_RANK",
    "master_addr": "K3_MASTER_ADDR",
    "master_port": "K3_MASTER_PORT",
    "headless": "K3_NODE_RANK",
    "api_key": "K3_API_KEY_FILE",
    "shutdown_timeout": "K3_STOP_GRACE_SECONDS",
}
# Flags that go with any profile, to surround the owned one.
HARMLESS_ARGS = (
    ("--enable-prefix-caching",),
    ("--seed", "7"),
    ("--max-num-batched-tokens", "8192"),
    ("--middleware", "my.Middleware"),
)


@functools.cache
def vllm_options() -> dict:
    """The installed vLLM's `vllm serve` option strings and their actions, built
    as `vllm serve` builds its parser."""
    make_arg_parser = importlib.import_module(TARGET.serve_args_module).make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    return dict(parser._option_string_actions)


def spellings(option: str) -> list[str]:
    """option and each prefix of it that vLLM resolves to the same flag:
    argparse takes an exact option string, else a prefix of exactly one."""
    options = vllm_options()
    action = options[option]
    if not option.startswith("--"):
        return [option]
    found = []
    for length in range(3, len(option) + 1):
        prefix = option[:length]
        if prefix in options:
            if options[prefix] is action:
                found.append(prefix)
        elif sum(name.startswith(prefix) for name in options) == 1:
            found.append(prefix)
    return found


@st.composite
def owned_flag_spelling(draw) -> tuple[str, list[str]]:
    """(the owning variable, the argument(s) for one owned flag)."""
    dest = draw(st.sampled_from(sorted(OWNED_DESTS)))
    action = next(a for a in vllm_options().values() if a.dest == dest)
    option = draw(st.sampled_from(sorted(action.option_strings)))
    flag = draw(st.sampled_from(spellings(option)))
    if flag.startswith("--"):
        # vLLM reads `_` for `-` anywhere in a long flag's name.
        dashes = [i for i, char in enumerate(flag) if char == "-" and i >= 2]
        underscored = draw(st.sets(st.sampled_from(dashes))) if dashes else set()
        flag = "".join("_" if i in underscored else c for i, c in enumerate(flag))
    if action.nargs == 0:
        return OWNED_DESTS[dest], [flag]
    value = API_KEY if dest == "api_key" else draw(st.sampled_from(["2", "x"]))
    if draw(st.booleans()):
        return OWNED_DESTS[dest], [f"{flag}={value}"]
    return OWNED_DESTS[dest], [flag, value]


@functools.cache
def scratch() -> Path:
    """A node's files: a checkpoint, private and world-readable key files,
    eight GPU render devices."""
    root = Path(tempfile.mkdtemp(prefix="k3-launcher-props-"))
    (root / "Kimi-K3").mkdir()
    (root / "Kimi-K3" / "config.json").write_text("{}")
    (root / "empty-model").mkdir()
    for name, mode in (("api-key", 0o600), ("open-key", 0o644)):
        (root / name).write_text(API_KEY + "\n")
        (root / name).chmod(mode)
    (root / "dri").mkdir()
    for minor in range(128, 136):
        (root / "dri" / f"renderD{minor}").touch()
    return root


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv, env)
        except SystemExit as exit_:
            code = exit_.code
        except Exception:  # reported as output, so the property names it
            traceback.print_exc()
            code = None
    return code, out.getvalue(), err.getvalue()


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    owned=owned_flag_spelling(),
    before=st.lists(st.sampled_from(HARMLESS_ARGS), max_size=2),
    after=st.lists(st.sampled_from(HARMLESS_ARGS), max_size=2),
    after_separator=st.booleans(),
)
def test_every_spelling_of_an_owned_flag_is_refused(
    owned, before, after, after_separator
):
    owner, flag_args = owned
    args = [arg for group in before for arg in group]
    args += flag_args + [arg for group in after for arg in group]
    env = {"K3_MODEL": str(scratch() / "Kimi-K3"), "K3_GPU_COUNT": "8"}
    if after_separator:
        code, out, err = run(["--dry-run", "--", *args], env)
    else:
        code, out, err = run(["--dry-run"], {**env, "K3_EXTRA_ARGS": shlex.join(args)})
    assert code == 2, (args, out, err)
    assert f"set {owner} (" in err, (args, err)
    assert "Traceback" not in err
    assert API_KEY not in out + err


# -- any settings ------------------------------------------------------------

ODD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8") | st.sampled_from(["\0", " ", "\t", "\n"]),
    max_size=30,
)
NUMBERS = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.integers(min_value=4000, max_value=6000).map(lambda digits: "9" * digits),
    st.sampled_from(["0", "1", "2", "8", "16", "65535", "65536", " 8 ", "1e3", "٣"]),
)
WHITESPACE = st.sampled_from(["", " ", "\t", " \n ", " , "])


def paths() -> st.SearchStrategy[str]:
    root = scratch()
    return st.sampled_from(
        [
            str(root / "Kimi-K3"),
            str(root / "empty-model"),
            str(root / "api-key"),
            str(root / "open-key"),
            str(root / "dri"),
            str(root / "missing"),
            str(root / ("x" * 300)),
            "~/Kimi-K3",
            "~no-such-user-k3/x",
            "./relative",
            "/",
            "/dev/null",
            "moonshotai/Kimi-K3",
        ]
    )


def any_value(*specific: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), *specific, ODD_TEXT, NUMBERS, WHITESPACE, paths())


features = st.lists(
    st.sampled_from([*FEATURES, "none", "vision", " "]), max_size=4
).map(",".join)
owned_tokens = owned_flag_spelling().map(lambda owned: shlex.join(owned[1]))
extra_args = st.lists(
    st.one_of(
        st.sampled_from(["--enable-prefix-caching", "--seed 7", "--bogus", "'x"]),
        owned_tokens,
        ODD_TEXT.map(shlex.quote),
    ),
    max_size=4,
).map(" ".join)

# What an operator would set, so that some examples launch.
SENSIBLE = {
    "K3_MODEL": st.sampled_from([str(scratch() / "Kimi-K3"), "moonshotai/Kimi-K3"]),
    "K3_SERVED_MODEL_NAME": st.just("k3-prod"),
    "K3_PROFILE": st.sampled_from(sorted(PROFILES)),
    "K3_FEATURES": features,
    "K3_MAX_MODEL_LEN": st.just("262144"),
    "K3_MAX_NUM_SEQS": st.just("64"),
    "K3_HOST": st.just("127.0.0.1"),
    "K3_PORT": st.just("9000"),
    "K3_API_KEY_FILE": st.just(str(scratch() / "api-key")),
    "K3_EXTRA_ARGS": st.just("--enable-prefix-caching --seed 7"),
    "K3_NUM_NODES": st.just("2"),
    "K3_NODE_RANK": st.sampled_from(["0", "1"]),
    "K3_MASTER_ADDR": st.just("10.0.0.1"),
    "K3_MASTER_PORT": st.just("29600"),
    "K3_GPU_COUNT": st.sampled_from(["8", "16"]),
    "K3_DRI_DIR": st.just(str(scratch() / "dri")),
    "K3_VLLM_COMMAND": st.just("/opt/venv/bin/vllm serve"),
    "K3_STOP_GRACE_SECONDS": st.just("300"),
    "K3_DRY_RUN": st.just("1"),
    "VLLM_USE_BREAKABLE_CUDAGRAPH": st.just("0"),
}
ANY = {
    **{name: any_value() for name in SENSIBLE},
    "K3_FEATURES": any_value(features),
    "K3_EXTRA_ARGS": any_value(extra_args),
}


@st.composite
def environments(draw) -> dict[str, str]:
    """Sensible values for some settings, anything at all for a few."""
    env = draw(st.fixed_dictionaries({}, optional=SENSIBLE))
    for name in draw(st.sets(st.sampled_from(sorted(ANY)), max_size=4)):
        value = draw(ANY[name])
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(environments())
def test_any_settings_give_an_answer_not_a_traceback(env):
    code, out, err = run(["--dry-run"], env)
    event(f"exit {code}")
    assert code in (0, 2, 127), (env, out, err)
    assert "Traceback" not in out + err, err
    assert API_KEY not in out + err
    if code == 2:
        assert "nothing started" in err
