"""Packs load, describe themselves and are refused with the file and the reason, as in the plugin."""

import pytest

import kolm_rsd


def test_pack_loads_and_describes_itself(pack, vocab):
    texts, _ = vocab
    p = kolm_rsd.Pack(pack, texts)
    assert len(p) > 0
    assert p.model == "smollm2" and p.arch == "llama"
    assert p.compile["prompts"] == 12 and p.compile["heldout"] == 4
    assert len(p.content_hash) == 64
    assert str(pack) in repr(p) and str(p.path) == str(pack)


def other_tokenizer(texts: list[bytes]) -> list[bytes]:
    """The same vocabulary with two tokens swapped: another tokenizer of the same size."""
    other = list(texts)
    other[100], other[101] = other[101], other[100]
    return other


def test_a_pack_for_another_tokenizer_is_refused(pack, vocab):
    texts, control = vocab
    with pytest.raises(kolm_rsd.TokenizerMismatchError) as e:
        kolm_rsd.Pack(pack, other_tokenizer(texts))
    assert str(pack) in str(e.value) and "tokenizer mismatch" in str(e.value)
    with pytest.raises(kolm_rsd.TokenizerMismatchError, match="tokenizer mismatch"):
        kolm_rsd.Drafter(other_tokenizer(texts), pack=pack, control_tokens=control)


def test_unreadable_and_broken_packs_name_the_file_and_the_reason(tmp_path, pack, vocab):
    texts, _ = vocab
    missing = tmp_path / "none.recipes.json"
    with pytest.raises(kolm_rsd.PackError) as e:
        kolm_rsd.Drafter(texts, pack=missing)
    assert str(missing) in str(e.value) and "No such file" in str(e.value)
    cut = tmp_path / "cut.recipes.json"
    cut.write_bytes(pack.read_bytes()[:300])
    with pytest.raises(kolm_rsd.PackError, match=f"{cut}: bad JSON at line"):
        kolm_rsd.Pack(cut)
    other = tmp_path / "other.json"
    other.write_text('{"format": "something/else", "version": 1}')
    with pytest.raises(kolm_rsd.PackError, match="not a recipe pack"):
        kolm_rsd.Pack(other)
    assert issubclass(kolm_rsd.TokenizerMismatchError, kolm_rsd.PackError)
    assert issubclass(kolm_rsd.PackError, kolm_rsd.KolmRsdError)


def test_where_the_plugin_looks(tmp_path):
    assert str(kolm_rsd.pack_beside("/m/qwen.gguf")) == "/m/qwen.recipes.json"
    assert str(kolm_rsd.default_miss_log("/m/qwen.gguf")).endswith("misses/qwen.jsonl")
