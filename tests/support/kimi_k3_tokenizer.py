"""A small tokenizer with Kimi-K3's channel grammar: ``<|open|>``, ``<|sep|>``
and ``<|close|>`` are special tokens, as in Kimi-K3's own tokenizer, and the
channel names between them are ordinary text. Byte-level BPE trained here
(no hub download), so any text (quotes, unicode, JSON) round-trips. A
stand-in for Kimi-K3's 160k-token vocabulary, which the parsers never see:
they work on the marker strings and on the ids the tokenizer gives them."""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

MARKERS = ["<|open|>", "<|sep|>", "<|close|>"]
_CORPUS = [
    "think response tools call argument message",
    'tool="get_weather" index="1" key="city" type="string" type="object"',
    "The user asks for the weather in Paris, so I call the tool.",
    '{"a": 1, "b": [true, false, null], "c": {"d": "e"}}',
]


@functools.cache
def kimi_k3_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=MARKERS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)
