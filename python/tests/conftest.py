"""Fixtures of the Python package's tests: the real SmolLM2 GGUF and a pack compiled from it by the project's
compiler (tests/python.rs passes both; run alone, the cached model and ``KOLM_RSD_TEST_PACK`` are used)."""

import os
from pathlib import Path

import pytest

import kolm_rsd


def _path(var: str, fallback: Path) -> Path:
    p = Path(os.environ.get(var, fallback))
    if not p.is_file():
        pytest.skip(f"{var} names no file ({p}); `cargo test --release --test python` sets it")
    return p


@pytest.fixture(scope="session")
def model() -> Path:
    cache = Path(os.environ.get("KOLM_RSD_CACHE", Path.home() / ".cache/kolm-rsd"))
    return _path("KOLM_RSD_TEST_MODEL", cache / "models/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def pack(model: Path) -> Path:
    return _path("KOLM_RSD_TEST_PACK", model.with_name("missing.recipes.json"))


@pytest.fixture(scope="session")
def vocab(model: Path) -> tuple[list[bytes], list[int]]:
    """SmolLM2's token texts and control ids, as llama.cpp reads them."""
    return kolm_rsd.gguf_vocab(model)


# GPT-2's byte-level alphabet: how a byte-level BPE vocabulary spells bytes (space → Ġ, newline → Ċ).
_BYTES = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
_SHIFTED = [b for b in range(256) if b not in _BYTES]
BYTE_CHAR = {**{b: chr(b) for b in _BYTES}, **{b: chr(256 + i) for i, b in enumerate(_SHIFTED)}}


def tokenize(texts: list[bytes], text: str) -> list[int]:
    """Greedy longest-match over a byte-level BPE vocabulary: real token ids of ``text``, not always the ones
    BPE would pick (no merge ranks), which is all a drafter test needs."""
    ids = {t.decode("utf-8", "replace"): i for i, t in enumerate(texts)}
    longest = max(len(t) for t in ids)
    spelled = "".join(BYTE_CHAR[b] for b in text.encode())
    out, i = [], 0
    while i < len(spelled):
        for j in range(min(len(spelled), i + longest), i, -1):
            if spelled[i:j] in ids:
                out.append(ids[spelled[i:j]])
                i = j
                break
        else:
            raise ValueError(f"no token for {spelled[i]!r}")
    return out
