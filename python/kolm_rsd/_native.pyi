"""Types of the Rust extension; the documentation of each item is in its docstring at run time too."""

from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path
from typing import Union

#: Token ids: a sequence of ints, or the bytes of an int32 array in native byte order.
Tokens = Union[bytes, Sequence[int]]
#: A path as ``open`` takes it.
StrPath = Union[str, PathLike[str]]

#: The longest draft the engine ever proposes (a verify batch of 16 stays exact in patched llama.cpp).
MAX_DRAFT: int

class KolmRsdError(Exception):
    """Base class of kolm-rsd's errors."""

class PackError(KolmRsdError):
    """A recipe pack was refused or could not be read; the message names the file and the reason."""

class TokenizerMismatchError(PackError):
    """The pack was compiled for another tokenizer than the one whose token texts were given."""

class Pack:
    """A validated recipe pack (``*.recipes.json``)."""

    def __init__(self, path: StrPath, token_texts: Iterable[Union[bytes, str]] | None = None) -> None:
        """Loads and validates the pack; with ``token_texts`` also refuses one for another tokenizer."""
    @property
    def path(self) -> Path: ...
    @property
    def tokenizer(self) -> str:
        """Fingerprint of the tokenizer it was compiled for (see :func:`tokenizer_fingerprint`)."""
    @property
    def model(self) -> str:
        """Name of the model it was compiled from."""
    @property
    def arch(self) -> str: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def coverage(self) -> float | None:
        """Share of held-out positions its recipes covered at compile time, when measured."""
    @property
    def compile(self) -> dict[str, float]:
        """``prompts``, ``heldout``, ``k`` (samples per prompt), ``temperature``, ``max_tokens``."""
    def __len__(self) -> int:
        """Number of recipes."""

class Stats:
    """What a drafter did since it was made (the C API's ``kolm_rsd_stats``)."""

    @property
    def propose_calls(self) -> int: ...
    @property
    def drafts(self) -> int:
        """Calls that proposed at least one token."""
    @property
    def tokens_drafted(self) -> int: ...
    @property
    def tokens_accepted(self) -> int: ...
    @property
    def pack_hits(self) -> int:
        """Drafted tokens that came from the recipe pack."""
    @property
    def context_hits(self) -> int:
        """Drafted tokens copied from the request's own text."""
    @property
    def steps_off(self) -> int:
        """Steps on which the break-even control held drafting off."""
    @property
    def misses_logged(self) -> int: ...
    @property
    def pack_entries(self) -> int: ...
    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens (0 when nothing was drafted)."""

class Drafter:
    """A drafter for ``n_seq`` concurrent sequences of one tokenizer, with an optional recipe pack.

    Per sequence: :meth:`begin` a request, then each step :meth:`propose` (or :meth:`propose_batch` for
    all sequences of a step) and, once the target has verified the draft, :meth:`accept`. The GIL is
    released while the engine works; one caller at a time is in the engine.
    """

    def __init__(
        self,
        token_texts: Iterable[Union[bytes, str]],
        *,
        pack: StrPath | None = None,
        control_tokens: Iterable[int] | None = None,
        n_seq: int = 1,
        n_max: int = ...,
        adaptive: bool = True,
        shared_gain: float | None = None,
        shared_sure: float | None = None,
        one_pass: bool = False,
        context: bool = True,
        live: bool = True,
        miss_log: StrPath | None = None,
        miss_log_cap: int = ...,
        step_log: StrPath | None = None,
    ) -> None:
        """From the tokenizer's raw token texts in id order (``convert_ids_to_tokens``, bytes or str).

        ``control_tokens`` are never proposed by a copy of the prompt (chat-template markers, end of
        turn). ``pack`` is checked against the texts' fingerprint (:class:`TokenizerMismatchError`).
        ``adaptive=False`` turns the break-even control off (drafts whatever the evidence gives);
        ``shared_gain`` is the margin over a plain step a draft must promise when other sequences share the
        verify call (the plugin's ``shared_gain=``), ``shared_sure`` the least estimated acceptance of a token drafted
        beside other sequences (the plugin's ``shared_sure=``); None: 0 for both, the rule of engines whose step is one
        forward pass of every sequence's tokens (vLLM), where the plugin's defaults are 0.05 and 0.95;
        ``one_pass=True``: every step is one
        forward pass of all sequences' tokens with no call limit (vLLM), its cost learned per row count and
        drafted token, instead of llama-server's calls and passes;
        ``context=False`` drafts from the pack alone; ``live=False`` turns off the live index (recipes learned
        from the answers this drafter has seen, in memory); ``miss_log`` collects what no recipe predicted;
        ``step_log`` writes a line per step (the plugin's ``steplog=``: its wall time, price and tokens per sequence).
        """
    @staticmethod
    def from_gguf(model: StrPath, arg: str = "", n_seq: int = 1) -> Drafter:
        """The llama.cpp plugin's drafter for a GGUF model; ``arg`` is its ``--spec-plugin-arg``."""
    @property
    def n_seq(self) -> int: ...
    def begin(self, seq: int, prompt: Tokens) -> None:
        """A new request starts on ``seq`` with this prompt."""
    def prompt_decoded(self) -> None:
        """The step that just ended also evaluated part of a prompt (a chunked prefill): not timed as verify cost."""
    def predict(self, seq: int, tokens: Tokens) -> None:
        """The request on ``seq`` comes with a predicted output, a text to copy drafts from."""
    def propose(self, seq: int, tokens: Tokens, id_last: int, n_max: int = ...) -> list[int]:
        """Up to ``n_max`` tokens to follow ``tokens`` + ``id_last`` (the token just sampled, not in
        ``tokens``); empty where drafting does not pay."""
    def propose_batch(self, requests: Iterable[tuple[int, Tokens, int]], n_max: int = ...) -> list[list[int]]:
        """:meth:`propose` for ``(seq, tokens, id_last)`` of every sequence of a step, in one call. The call
        marks the step, so its sequences may come in any order; single :meth:`propose` calls are told into steps
        by their sequences coming in ascending order, as llama-server asks them."""
    def accept(self, seq: int, n_accepted: int) -> None:
        """The target kept the first ``n_accepted`` tokens of the last draft proposed for ``seq``."""
    def observe_miss(self, context: Tokens, token: int) -> None:
        """After ``context`` the target produced ``token`` and nothing predicted it (for the next compile)."""
    def flush_misses(self) -> None: ...
    def stats(self) -> Stats: ...
    def describe(self) -> str:
        """One line: the pack, the sequences, the miss log."""
    def summary(self) -> str:
        """One line on what drafting did (the plugin's shutdown line)."""

def tokenizer_fingerprint(token_texts: Iterable[Union[bytes, str]]) -> str:
    """The fingerprint packs are checked against: SHA-256 over each token's raw text (u32 LE length, then
    bytes) in id order, first 16 bytes in hex; what the plugin computes from llama.cpp's vocabulary."""

def pack_beside(model: StrPath) -> Path:
    """Where the plugin finds a model's pack: ``dir/M.gguf`` → ``dir/M.recipes.json``."""

def default_miss_log(model: StrPath) -> Path:
    """The plugin's default miss log for a model: ``~/.cache/kolm-rsd/misses/<stem>.jsonl``."""

def gguf_vocab(path: StrPath) -> tuple[list[bytes], list[int]]:
    """A GGUF model's raw token texts in id order and its control and end-of-generation token ids, as
    llama.cpp reads them (loads the model)."""
