"""kolm-rsd for Python: the drafter of the llama.cpp plugin (recipe packs, copies of the request, the
break-even control, the miss log), built on the same Rust engine, for hosts such as vLLM.

Token ids go in as lists of ints or as the bytes of an int32 array (``numpy_array.astype("int32").tobytes()``,
one copy instead of a Python int per token). A drafter is made from the tokenizer's raw token texts
(:func:`kolm_rsd.hf.vocab` reads them from a Hugging Face tokenizer), or from a GGUF model with
:meth:`Drafter.from_gguf`. ``kolm_rsd.vllm.Proposer`` is the vLLM speculative proposer (docs/vllm.md).
"""

from ._native import (
    MAX_DRAFT,
    Drafter,
    KolmRsdError,
    Pack,
    PackError,
    Stats,
    TokenizerMismatchError,
    default_miss_log,
    gguf_vocab,
    pack_beside,
    tokenizer_fingerprint,
)

__all__ = [
    "MAX_DRAFT",
    "Drafter",
    "KolmRsdError",
    "Pack",
    "PackError",
    "Stats",
    "TokenizerMismatchError",
    "default_miss_log",
    "gguf_vocab",
    "pack_beside",
    "tokenizer_fingerprint",
]
