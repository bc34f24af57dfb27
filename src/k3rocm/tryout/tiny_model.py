"""A tiny Llama checkpoint that a real vLLM 0.27.1 CPU server can load in under
a minute: a config, a tokenizer trained here with the `tokenizers` package,
and no weights (the server runs with ``--load-format dummy``). The tests and
the CPU try-out use it.

    python -m k3rocm.tryout.tiny_model DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

MAX_POSITIONS = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
# Letters and lengths of the made-up words the tokenizer learns from; prompts
# built from the same alphabet encode without <unk>.
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def random_words(rng: random.Random, count: int) -> list[str]:
    return [
        "".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 7)))
        for _ in range(count)
    ]


def _train_tokenizer(seed: int) -> Tokenizer:
    rng = random.Random(seed)
    corpus = [" ".join(random_words(rng, 40)) for _ in range(400)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def build_tiny_llama(directory: Path, seed: int = 0) -> Path:
    """Write a loadable tiny Llama (hidden 128, 2 layers, 4 heads of 32) into
    ``directory`` and return it. Prompts need no BOS: the tokenizer adds no
    special tokens, so a prompt's length is what ``tokenizer.json`` encodes."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(seed)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "add_bos_token": False,
                "model_max_length": MAX_POSITIONS,
            }
        )
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": tokenizer.token_to_id("</s>"),
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def count_tokens(model_dir: Path, text: str) -> int:
    """Prompt length by the tokenizer file itself, independent of vLLM."""
    return len(Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids)


def build_for_containers(directory: Path) -> Path:
    """The tiny Llama, readable by the container's uid 1000 whoever wrote it."""
    model = build_tiny_llama(directory)
    for path in (directory, *directory.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return model


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m k3rocm.tryout.tiny_model DIR")
    print(build_for_containers(Path(sys.argv[1])))
