"""kolm-rsd as a vLLM speculative proposer (vLLM 0.32, ``method: custom_class``)::

    python -m vllm.entrypoints.openai.api_server --model DIR \\
        --speculative-config '{"method": "custom_class", "model": "kolm_rsd.vllm.Proposer", "num_speculative_tokens": 8}'

or, shorter, ``--spec-model kolm_rsd.vllm.Proposer --spec-tokens 8`` (vLLM infers ``custom_class`` from a
dotted path). Importing this module needs neither vLLM nor torch.

**The pack.** ``KOLM_RSD_PACK`` names it (``off``: none); else the model directory's ``recipes.json``, or its
one ``*.recipes.json``; else the file beside a model given as a file (``M.gguf`` → ``M.recipes.json``); else
the drafter copies from the request alone. vLLM's speculative config refuses keys it does not know, so the
pack cannot ride in it. A pack for another tokenizer stops the server with :class:`TokenizerMismatchError`.

**Shared steps.** ``KOLM_RSD_SHARED_GAIN`` sets the margin over a plain step that a draft must promise when other
requests share the verify step (the llama.cpp plugin's ``shared_gain=``), ``KOLM_RSD_SHARED_SURE`` the least
estimated acceptance of a token drafted beside other requests (the plugin's ``shared_sure=``). Unset, both are 0:
the Rust core's rule for engines whose step is one forward pass of every request's tokens
(``DrafterConfig::one_pass_shared``, with the measurements behind it), where the plugin's are 0.05 and 0.95. A
step's cost is learned as vLLM runs it, one forward pass of every request's tokens, priced per request and per
drafted token (``KOLM_RSD_ONE_PASS=0``: priced as llama-server's calls of at most 16 tokens instead, kept to
measure the difference). ``KOLM_RSD_STEP_LOG=PATH`` writes a line per step: its wall time, what the drafter priced
it at, and the tokens each request verified.

**Acceptance.** vLLM has no accept callback. The next step's ``sampled_token_ids`` of a request are the draft
tokens the target kept followed by one token of its own, so the tokens accepted are the common prefix of the
last draft and those tokens less the last; the proposer reports that before it drafts again.

**Requests.** vLLM hands rows of its persistent batch, not request ids, and moves requests between rows as
others finish. A row is a request proposed for last step when its first tokens, its length before this step's
tokens and its last token then match that request's (the one that was in the same row, when a chat template's
common opening makes several match); anything else is a new request (``begin``, on a free sequence of the
engine, the longest unseen one evicted when none is free). Every sequence is free or held by one request. Drafts
only ever speed up; the target's verification decides the output, so a mistaken match costs speed, never
correctness.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ._native import Drafter

#: Tokens a row's identity is checked on, from its start.
_HEAD = 16
#: Steps between summary lines on stderr: vLLM ends its worker processes without running atexit handlers.
_REPORT_EVERY = 256


def _env_number(name: str) -> Optional[float]:
    """The number the environment variable ``name`` holds, or None when it is unset (the drafter checks its range)."""
    value = os.environ.get(name)
    try:
        return None if value is None else float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None


def find_pack(model: str, env: Optional[str] = None) -> Optional[Path]:
    """The pack for ``model`` (a directory or a file): ``env`` (``KOLM_RSD_PACK``; ``off`` for none), else the
    directory's ``recipes.json`` or its one ``*.recipes.json``, else the file's ``.recipes.json`` beside it."""
    if env:
        return None if env == "off" else Path(env)
    m = Path(model)
    if m.is_dir():
        if (m / "recipes.json").is_file():
            return m / "recipes.json"
        found = sorted(m.glob("*.recipes.json"))
        return found[0] if len(found) == 1 else None
    beside = m.with_name(m.name.removesuffix(".gguf") + ".recipes.json")
    return beside if beside.is_file() else None


@dataclass(eq=False)
class _Request:
    """What the proposer knows of one request: its engine sequence and where it stood at the last draft."""

    seq: int
    head: bytes
    n: int
    last: int
    draft: list[int] = field(default_factory=list)
    seen: int = 0
    #: The batch row it was in at the last draft: the tie-break between requests that match a row alike.
    row: int = -1


class Proposer:
    """A vLLM ``custom_class`` proposer drafting with kolm-rsd for every request of a step in one call."""

    def __init__(self, vllm_config: Any, vocab: Optional[tuple[Sequence[bytes], Sequence[int]]] = None, **options: Any):
        """Built by vLLM with its ``VllmConfig``. ``vocab`` (token texts, control ids) stands in for the
        model's Hugging Face tokenizer, which is loaded otherwise; ``options`` go to :class:`Drafter` (a test's
        simulated batch has no verify cost for the control to measure: ``adaptive=False``)."""
        mc = vllm_config.model_config
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(mc.max_model_len)
        n_seq = int(vllm_config.scheduler_config.max_num_seqs)
        if vocab is None:
            from transformers import AutoTokenizer

            from .hf import vocab as hf_vocab

            tok = AutoTokenizer.from_pretrained(
                mc.tokenizer, revision=getattr(mc, "tokenizer_revision", None), trust_remote_code=mc.trust_remote_code
            )
            vocab = hf_vocab(tok, mc.get_vocab_size())
        texts, control = vocab
        self.pack = find_pack(str(mc.model), os.environ.get("KOLM_RSD_PACK"))
        for key, env in (("shared_gain", "KOLM_RSD_SHARED_GAIN"), ("shared_sure", "KOLM_RSD_SHARED_SURE")):
            value = _env_number(env)
            if value is not None:
                options.setdefault(key, value)
        one_pass = os.environ.get("KOLM_RSD_ONE_PASS", "1")
        if one_pass not in ("0", "1"):
            raise ValueError(f"KOLM_RSD_ONE_PASS={one_pass!r} is not 0 or 1")
        options.setdefault("one_pass", one_pass == "1")
        step_log = os.environ.get("KOLM_RSD_STEP_LOG")
        if step_log:
            options.setdefault("step_log", step_log)
        self.drafter = Drafter(texts, pack=self.pack, control_tokens=control, n_seq=n_seq, n_max=self.k, **options)
        #: Every request holding a sequence, by its first tokens and its length at the last draft: requests opened
        #: by one chat template can share both.
        self._requests: dict[tuple[bytes, int], list[_Request]] = {}
        self._free = list(range(n_seq - 1, -1, -1))
        self._step = 0
        self._seconds = 0.0
        atexit.register(self._report)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the pack was read at construction."""

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Sequence[int],
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One list of draft ids per row of the batch. ``sampled_token_ids[i]``: the tokens row ``i`` got this
        step (empty: none, e.g. a prompt still being prefilled); ``token_ids_cpu[i, :num_tokens_no_spec[i]]``:
        its prompt and output, this step's tokens included."""
        import numpy as np

        t0 = time.perf_counter()
        self._step += 1
        previous, self._requests = self._requests, {}
        # First the rows that continue a request drafted for last step, so a new one never takes their sequence.
        rows, prefilled = [], False
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not len(sampled) or n < 1:
                # A request with no token this step had a chunk of its prompt prefilled (vLLM clears what it sampled).
                prefilled |= n >= 1
                continue
            tokens = np.asarray(token_ids_cpu[i, :n], dtype=np.int32)
            head, before = tokens[:_HEAD].tobytes(), n - len(sampled)
            req = self._match(previous.get((head, before), []), i, int(tokens[before - 1]) if before >= 1 else -1)
            if req is not None:
                kept = 0
                while kept < min(len(req.draft), len(sampled) - 1) and int(sampled[kept]) == req.draft[kept]:
                    kept += 1
                self.drafter.accept(req.seq, kept)
            rows.append((i, tokens, head, before, req))
        # Requests without tokens this step (a prompt being prefilled, one that ended) keep their sequence until a
        # new request needs it.
        idle = [req for group in previous.values() for req in group]
        batch, placed = [], []
        for i, tokens, head, before, req in rows:
            if req is None:
                seq = self._take(idle)
                if seq is None:
                    continue
                req = _Request(seq=seq, head=head, n=0, last=-1)
                self.drafter.begin(seq, tokens[:before].tobytes())
            n = len(tokens)
            req.n, req.last, req.seen, req.row = n, int(tokens[n - 1]), self._step, i
            self._requests.setdefault((head, n), []).append(req)
            batch.append((req.seq, tokens[: n - 1].tobytes(), req.last))
            placed.append((i, req))
        for req in idle:
            self._requests.setdefault((req.head, req.n), []).append(req)
        # That chunk has no `begin` yet, and the step's time is not verify cost (one such 1.3 s step, timed as four
        # rows' decode, once made a drafted token look free).
        if prefilled:
            self.drafter.prompt_decoded()
        drafts = self.drafter.propose_batch(batch, self.k) if batch else []
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        for (i, req), draft in zip(placed, drafts):
            req.draft = draft[: max(0, self.max_model_len - req.n)]
            out[i] = req.draft
        self._seconds += time.perf_counter() - t0
        if self._step % _REPORT_EVERY == 0:
            self._report()
        return out

    @staticmethod
    def _match(candidates: list[_Request], row: int, last: int) -> Optional[_Request]:
        """Takes from ``candidates`` (requests of the row's first tokens and length) the one whose last token
        was ``last``, preferring the one that was in ``row``."""
        same = [req for req in candidates if req.last == last]
        if not same:
            return None
        req = next((r for r in same if r.row == row), same[0])
        candidates.remove(req)
        return req

    def _take(self, idle: list[_Request]) -> Optional[int]:
        """A free engine sequence; when none is, that of the request without tokens for the most steps (None
        when every sequence is drafting this step: more rows than ``max_num_seqs``, which vLLM never sends)."""
        if self._free:
            return self._free.pop()
        if not idle:
            return None
        req = min(idle, key=lambda r: r.seen)
        idle.remove(req)
        return req.seq

    def summary(self) -> str:
        """What drafting did and the proposer's own time per step (Python and Rust)."""
        per_step = 1000.0 * self._seconds / max(1, self._step)
        return f"kolm-rsd: {self._step} steps, proposer {per_step:.3f} ms/step; {self.drafter.summary()}"

    def _report(self) -> None:
        if self._step:
            print(self.summary(), file=sys.stderr, flush=True)
