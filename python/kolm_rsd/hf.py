"""A Hugging Face tokenizer's vocabulary as kolm-rsd reads a GGUF's: raw token texts in id order and the
control tokens, so a pack compiled through llama.cpp is recognised (same fingerprint) in vLLM.

Needs no import of transformers: any tokenizer with ``convert_ids_to_tokens``, ``get_vocab`` and
``added_tokens_decoder`` (a ``PreTrainedTokenizerFast``) will do.
"""

from __future__ import annotations

from typing import Any


def vocab(tokenizer: Any, vocab_size: int | None = None) -> tuple[list[bytes], list[int]]:
    """The raw token texts (UTF-8) of ids ``0 .. vocab_size-1`` and the ids of the added tokens.

    Texts are the tokenizer's own strings (``Ġword`` for a byte-level BPE, ``▁word`` for SentencePiece),
    which is what llama.cpp's converter writes into a GGUF. Ids the tokenizer lacks below ``vocab_size``
    (the model's embedding rows past the tokenizer, e.g. Qwen2.5's) get the converter's ``[PAD<id>]``.
    Added tokens are the chat-template markers and end-of-turn tokens, which llama.cpp marks control or
    user-defined: a copy of the prompt never proposes them.
    """
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    n = vocab_size if vocab_size is not None else max(by_id) + 1
    texts = [by_id[i].encode() if i in by_id else f"[PAD{i}]".encode() for i in range(n)]
    control = sorted(i for i in tokenizer.added_tokens_decoder if i < n)
    return texts, control
