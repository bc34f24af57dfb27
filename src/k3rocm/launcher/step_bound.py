"""The largest step a profile's command can make, against the largest the
KDA kernels were proven to run.

A chunk KDA call takes a step's prefill tokens at the KDA heads of one rank;
its pointer offsets grow with tokens x heads. Patch 0012 forms them in 64
bits, and on the lent H200 one call of 9,984,000 token-heads (96 heads and
104,000 tokens; 12 heads and 832,000 tokens) ran and agreed with the same
sequences in smaller calls, where vLLM 0.27.1's kernels end in an illegal
memory access (docs/benchmarks.md, "Long steps"). No larger call was run,
so none is allowed: a step is at most --max-num-batched-tokens tokens, or a
whole prompt (--max-model-len) with chunked prefill off.
"""

from __future__ import annotations

import re

from k3rocm.common.profiles import AMD_ARGS, Profile
from k3rocm.common.vllm_release import TARGET
from k3rocm.launcher.messages import label
from k3rocm.launcher.owned_flags import exact_values, last_values
from k3rocm.launcher.settings import LaunchSettings

# The largest chunk KDA call proven on the H200 (tokens x heads a rank).
PROVEN_TOKEN_HEADS = 9_984_000
_BATCHED_FLAG = TARGET.serve.max_num_batched_tokens
_BATCHED = _BATCHED_FLAG.dest
_CHUNKED = TARGET.serve.enable_chunked_prefill.dest


def largest_tokens(profile: Profile) -> int:
    """The most tokens one step of ``profile`` may hold."""
    return PROVEN_TOKEN_HEADS // profile.kda_heads_per_rank


def step_bound_problems(settings: LaunchSettings) -> list[str]:
    """One message if the command's largest step exceeds the proven bound."""
    profile = settings.profile
    if not profile.kimi_on_rocm:
        return []
    recipe = [arg for line in AMD_ARGS for arg in line]
    dests = (_BATCHED, _CHUNKED)
    # The recipe alone is spelled as the launcher writes (a test holds the
    # two readings equal): only the operator's extra arguments need vLLM's
    # parser, whose import costs seconds at every start.
    values = (
        last_values([*recipe, *settings.extra_args], dests)
        if settings.extra_args
        else exact_values(recipe, dests)
    )
    batched = _tokens(values.get(_BATCHED))
    if batched is None:  # a value vLLM itself refuses
        return []
    bound = largest_tokens(profile)
    heads = profile.kda_heads_per_rank
    where = (
        f"with profile {profile.name} ({heads} KDA heads a rank) the KDA kernels "
        f"are proven up to {bound:,} tokens a step ({PROVEN_TOKEN_HEADS:,} "
        "token-heads, docs/launching.md)"
    )
    if values.get(_CHUNKED) is False:
        model_len = settings.max_model_len
        if model_len is None:
            return [
                f"{label('extra_args')} turns chunked prefill off, so a step holds "
                f"a whole prompt of the model's length; {where}: set "
                f"{label('max_model_len')} to at most {bound:,}."
            ]
        if max(model_len, batched) > bound:
            return [
                f"{label('extra_args')} turns chunked prefill off, so a step holds "
                f"a whole prompt of {label('max_model_len')} {model_len:,} tokens; "
                f"{where}: set {label('max_model_len')} and "
                f"{_BATCHED_FLAG.long} to at most {bound:,}."
            ]
        return []
    if batched > bound:
        return [
            f"{label('extra_args')} sets {_BATCHED_FLAG.long} {batched:,}; "
            f"{where}: set it to at most {bound:,}."
        ]
    return []


def _tokens(value: object) -> int | None:
    """A token count as vLLM reads it ('200k' too); None if unreadable."""
    if not isinstance(value, str):
        return None
    if re.fullmatch(r"[0-9]+", value):  # vLLM reads a plain number as int does
        return int(value)
    try:
        from vllm.utils.argparse_utils import human_readable_int
    except ImportError:  # no vLLM here: plain numbers only
        human_readable_int = int
    try:
        return human_readable_int(value)
    except ValueError:
        return None
