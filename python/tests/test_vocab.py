"""One tokenizer fingerprint whoever reads the vocabulary: llama.cpp (what the plugin and the pack compiler
use), Python reading the GGUF itself, and a Hugging Face tokenizer's texts through kolm_rsd.hf.vocab."""

from types import SimpleNamespace

import gguf

import kolm_rsd
from kolm_rsd.hf import vocab as hf_vocab


def gguf_tokens_in_python(model) -> list[bytes]:
    field = gguf.GGUFReader(model).fields["tokenizer.ggml.tokens"]
    return [bytes(field.parts[i]) for i in field.data]


def test_texts_read_by_python_equal_llama_cpps_and_the_packs_fingerprint(model, pack, vocab):
    texts, _ = vocab
    assert len(texts) == 49152
    assert gguf_tokens_in_python(model) == texts
    fp = kolm_rsd.tokenizer_fingerprint(texts)
    assert fp == kolm_rsd.Pack(pack).tokenizer, "the pack was compiled through llama.cpp from the same model"
    assert kolm_rsd.tokenizer_fingerprint([t.decode() for t in texts]) == fp, "str texts are taken as UTF-8"


def test_hf_vocab_matches_the_gguf_and_pads_like_llama_cpps_converter(vocab, pack):
    texts, control = vocab
    added = {i: object() for i in control}
    tok = SimpleNamespace(get_vocab=lambda: {t.decode(): i for i, t in enumerate(texts)}, added_tokens_decoder=added)
    hf_texts, hf_control = hf_vocab(tok)
    assert kolm_rsd.tokenizer_fingerprint(hf_texts) == kolm_rsd.Pack(pack).tokenizer
    assert hf_control == control
    # A model whose embedding has rows past the tokenizer (Qwen2.5: 151,936 rows, 151,665 tokens).
    padded, _ = hf_vocab(tok, vocab_size=len(texts) + 2)
    assert padded[-2:] == [f"[PAD{len(texts)}]".encode(), f"[PAD{len(texts) + 1}]".encode()]
