"""kolm_rsd.vllm.Proposer driven as vLLM 0.32's model runner drives a ``custom_class`` proposer: a persistent
batch of rows (``token_ids_cpu``, ``num_tokens_no_spec``), each step's sampled tokens, rows that move — with
numpy and lists only, no vLLM."""

from types import SimpleNamespace

import numpy as np
import pytest

import kolm_rsd
from conftest import tokenize
from kolm_rsd.vllm import Proposer, find_pack
from test_drafter import ANSWER, PROMPT

MAX_LEN, K = 512, 8


def config(model_dir, max_num_seqs=4):
    return SimpleNamespace(
        model_config=SimpleNamespace(model=str(model_dir), max_model_len=MAX_LEN),
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


@pytest.fixture
def model_dir(tmp_path, pack):
    """A model directory as vLLM loads one, with the pack in it."""
    (tmp_path / "smollm2.recipes.json").write_bytes(pack.read_bytes())
    return tmp_path


class Batch:
    """vLLM's persistent batch, reduced to what the proposer sees, with greedy verification of known answers."""

    def __init__(self, rows: int):
        self.tokens = np.zeros((rows, MAX_LEN), dtype=np.int32)
        self.n = np.zeros(rows, dtype=np.int32)
        self.answers: list = [None] * rows
        self.done = [0] * rows
        self.sampled: list[list[int]] = [[] for _ in range(rows)]
        self.kept = 0

    def add(self, row, prompt, answer):
        """A request after its prefill: the prompt and the first token sampled."""
        self.tokens[row, : len(prompt)] = prompt
        self.tokens[row, len(prompt)] = answer[0]
        self.n[row] = len(prompt) + 1
        self.answers[row], self.done[row], self.sampled[row] = answer, 1, [answer[0]]

    def verify(self, drafts):
        """The target keeps the drafted tokens its answer has, and samples one more."""
        for row, draft in enumerate(drafts):
            answer = self.answers[row]
            if answer is None or self.done[row] >= len(answer):
                self.sampled[row] = []
                continue
            kept = 0
            while kept < len(draft) and self.done[row] + kept < len(answer) - 1 and draft[kept] == answer[self.done[row] + kept]:
                kept += 1
            self.kept += kept
            new = answer[self.done[row] : self.done[row] + kept + 1]
            self.tokens[row, self.n[row] : self.n[row] + len(new)] = new
            self.n[row] += len(new)
            self.done[row] += len(new)
            self.sampled[row] = list(new)

    def swap(self, a, b):
        """vLLM's condense and reorder move requests between rows."""
        for arr in (self.tokens, self.n):
            arr[[a, b]] = arr[[b, a]]
        for lst in (self.answers, self.done, self.sampled):
            lst[a], lst[b] = lst[b], lst[a]


def test_the_pack_is_found_beside_the_model_or_named(tmp_path, model_dir, monkeypatch):
    assert find_pack(str(model_dir)) == model_dir / "smollm2.recipes.json"
    (model_dir / "recipes.json").write_text("{}")
    assert find_pack(str(model_dir)) == model_dir / "recipes.json"
    assert find_pack(str(model_dir), env="off") is None
    assert str(find_pack(str(model_dir), env="/p.json")) == "/p.json"
    assert find_pack(str(tmp_path / "m.gguf")) is None
    (tmp_path / "m.recipes.json").write_text("{}")
    assert find_pack(str(tmp_path / "m.gguf")) == tmp_path / "m.recipes.json"


def test_a_pack_for_another_tokenizer_stops_the_proposer(model_dir, vocab):
    texts, control = vocab
    other = list(texts)
    other[7], other[8] = other[8], other[7]
    with pytest.raises(kolm_rsd.TokenizerMismatchError, match="smollm2.recipes.json"):
        Proposer(config(model_dir), vocab=(other, control))


@pytest.mark.parametrize(
    "env, good, out_of_range, message",
    [("KOLM_RSD_SHARED_GAIN", "0.05", "11", "shared_gain=11"), ("KOLM_RSD_SHARED_SURE", "0.95", "2", "shared_sure=2")],
)
def test_the_shared_step_settings_come_from_the_environment_and_are_checked(
    model_dir, vocab, monkeypatch, env, good, out_of_range, message
):
    monkeypatch.setenv(env, good)
    Proposer(config(model_dir), vocab=vocab)
    monkeypatch.setenv(env, "lots")
    with pytest.raises(ValueError, match=f"{env}='lots'"):
        Proposer(config(model_dir), vocab=vocab)
    monkeypatch.setenv(env, out_of_range)
    with pytest.raises(ValueError, match=message):
        Proposer(config(model_dir), vocab=vocab)


def test_steps_are_priced_as_one_pass_unless_the_environment_says_otherwise(model_dir, vocab, monkeypatch):
    monkeypatch.delenv("KOLM_RSD_ONE_PASS", raising=False)
    Proposer(config(model_dir), vocab=vocab)
    monkeypatch.setenv("KOLM_RSD_ONE_PASS", "0")
    Proposer(config(model_dir), vocab=vocab)
    monkeypatch.setenv("KOLM_RSD_ONE_PASS", "yes")
    with pytest.raises(ValueError, match="KOLM_RSD_ONE_PASS='yes'"):
        Proposer(config(model_dir), vocab=vocab)


def test_drafts_for_every_row_learn_acceptance_and_follow_rows_that_move(model_dir, vocab, monkeypatch, tmp_path):
    monkeypatch.delenv("KOLM_RSD_PACK", raising=False)
    monkeypatch.setenv("KOLM_RSD_STEP_LOG", str(tmp_path / "steps.tsv"))
    texts, control = vocab
    p = Proposer(config(model_dir), vocab=vocab, adaptive=False)
    assert p.pack == model_dir / "smollm2.recipes.json"
    prompt, answer = tokenize(texts, PROMPT), tokenize(texts, ANSWER)
    other = tokenize(texts, PROMPT.replace("Maria Lopez", "Ana Ruiz"))
    b = Batch(rows=4)
    b.add(0, prompt, answer)
    b.add(2, other, tokenize(texts, ANSWER.replace("Maria Lopez", "Ana Ruiz")))
    step = 0
    while any(b.sampled):
        drafts = p.propose(b.sampled, b.n, b.tokens, slot_mappings=None)
        assert len(drafts) == 4 and all(d == [] for d, got in zip(drafts, b.sampled) if not got), "no row, no draft"
        assert all(len(d) <= K for d in drafts)
        b.verify(drafts)
        step += 1
        if step == 3:
            b.swap(0, 1)  # the first request moves to row 1
        if step == 5:
            b.add(3, prompt[:40], answer)  # a third request arrives
    s = p.drafter.stats()
    assert s.tokens_drafted > 40 and s.pack_hits > 0 and s.context_hits > 0
    assert s.tokens_accepted == b.kept, "every kept token reported, also after the move"
    assert "proposer" in p.summary() and "ms/step" in p.summary()
    # A line per step, written as it ends: the tokens each engine sequence verified (two requests, then three).
    lines = (tmp_path / "steps.tsv").read_text().splitlines()
    assert lines[0].startswith("wall_us\t") and len(lines) == step
    slots = [line.split("\t")[5].split(",") for line in lines[1:]]
    assert all(len(s) == 4 for s in slots) and sum(int(x) > 0 for x in slots[5]) == 3, slots[:6]


def test_finished_requests_free_their_sequence(model_dir, vocab, monkeypatch):
    monkeypatch.setenv("KOLM_RSD_PACK", "off")
    texts, _ = vocab
    p = Proposer(config(model_dir, max_num_seqs=1), vocab=vocab, adaptive=False)
    assert p.pack is None
    words = list(range(3000, 3030))
    for first in (3000, 3100):  # one request after the other in the one row
        req = [t - 3000 + first for t in words]
        b = Batch(rows=1)
        b.add(0, req + req[:2], req[2:] + [7] * 10)
        while any(b.sampled):
            b.verify(p.propose(b.sampled, b.n, b.tokens))
        assert b.kept > 0, "the copy of the prompt drafted"
    assert p.propose([[]], np.zeros(1, dtype=np.int32), np.zeros((1, MAX_LEN), dtype=np.int32)) == [[]]


def test_requests_of_one_chat_template_at_the_same_length_keep_their_own_sequences(model_dir, vocab, monkeypatch):
    """A chat template opens every request with the same system prompt, so requests share their first tokens; two
    of them at the same length in one step must still stay two requests on two sequences (session 53: one was
    dropped at each such step and its sequence lost, until one of eight rows was drafted for)."""
    monkeypatch.setenv("KOLM_RSD_PACK", "off")
    texts, _ = vocab
    p = Proposer(config(model_dir, max_num_seqs=4), vocab=vocab, adaptive=False)

    class Spy:
        """The drafter, counting the rows of each batch it drafts for."""

        def __init__(self, inner):
            self.inner, self.rows = inner, []

        def propose_batch(self, batch, k):
            self.rows.append(len(batch))
            return self.inner.propose_batch(batch, k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    p.drafter = spy = Spy(p.drafter)
    system = tokenize(texts, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert len(system) >= 16
    b = Batch(rows=4)
    for row, name in enumerate(("Maria Lopez", "Ana Ruiz", "Li Wei", "Omar Haddad")):
        # Prompts of one length whose answers no draft gets right: every row advances one token a step, in step.
        prompt = system + tokenize(texts, f"Name: {name}.")[:6]
        prompt += [prompt[-1]] * (len(system) + 6 - len(prompt))
        b.add(row, prompt, [4000 + 50 * row + i for i in range(40)])
    assert len(set(b.n.tolist())) == 1
    while any(b.sampled):
        b.verify(p.propose(b.sampled, b.n, b.tokens))
    assert spy.rows[:39] == [4] * 39, spy.rows
    # The engine's four sequences are all held or free: new requests get every one of them.
    b = Batch(rows=4)
    for row in range(4):
        b.add(row, system + [5000 + row] * 6, [6000 + row] * 5)
    b.verify(p.propose(b.sampled, b.n, b.tokens))
    assert spy.rows[-1] == 4


def test_a_step_that_prefilled_part_of_a_prompt_is_not_timed(model_dir, vocab, monkeypatch):
    monkeypatch.setenv("KOLM_RSD_PACK", "off")
    texts, _ = vocab
    p = Proposer(config(model_dir), vocab=vocab)

    class Spy:
        """The drafter, counting what the proposer tells it of prefills."""

        def __init__(self, inner):
            self.inner, self.prefills = inner, 0

        def prompt_decoded(self):
            self.prefills += 1
            self.inner.prompt_decoded()

        def __getattr__(self, name):
            return getattr(self.inner, name)

    p.drafter = spy = Spy(p.drafter)
    b = Batch(rows=2)
    b.add(0, tokenize(texts, PROMPT), tokenize(texts, ANSWER))
    b.verify(p.propose(b.sampled, b.n, b.tokens))
    assert spy.prefills == 0, "every row decoded a token"
    # Row 1 holds a long prompt's first chunk: vLLM clears its sampled tokens until the prefill completes.
    b.tokens[1, :40], b.n[1] = tokenize(texts, PROMPT)[:40], 40
    b.verify(p.propose(b.sampled, b.n, b.tokens))
    assert spy.prefills == 1 and b.sampled[1] == []
