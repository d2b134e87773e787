"""The drafter from Python: copies of the request, the pack, batches, acceptance, and the same engine as the
plugin's (a drafter from token texts drafts exactly what the plugin's drafter from the GGUF drafts)."""

import numpy as np
import pytest

import kolm_rsd
from conftest import tokenize

PROMPT = (
    "<|im_start|>user\nExtract the contact as a single JSON object: name, job_title, company, email.\n"
    "Maria Lopez is a Senior Data Analyst at Northwind Traders; write to maria.lopez@northwind.com.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
ANSWER = (
    '```json\n{\n  "name": "Maria Lopez",\n  "job_title": "Senior Data Analyst",\n'
    '  "company": "Northwind Traders",\n  "email": "maria.lopez@northwind.com"\n}\n```<|im_end|>'
)


def test_copies_of_the_prompt_are_drafted_and_control_tokens_are_not(vocab):
    texts, control = vocab
    # live=False: the second request would otherwise also draft what the live index learned from the first.
    d = kolm_rsd.Drafter(texts, control_tokens=control, adaptive=False, live=False)
    words = list(range(1000, 1012))
    prompt = words + [2] + words[:3] + [5]  # 2 is <|im_end|>, a control token
    d.begin(0, prompt)
    draft = d.propose(0, prompt + words[:4], words[4], n_max=8)
    assert draft == words[5:13], "the copy runs on to the end of the copied text"
    d.begin(0, prompt)
    draft = d.propose(0, prompt + words[:8], words[8])
    assert draft == words[9:12], "a copy stops before the control token"
    s = d.stats()
    assert (s.drafts, s.tokens_drafted, s.context_hits) == (2, 10, 10)


def test_token_bytes_lists_and_numpy_arrays_are_the_same_tokens(vocab):
    texts, control = vocab
    words = np.arange(2000, 2010, dtype=np.int32)
    drafts = []
    for as_tokens in (list, lambda a: a.tobytes(), lambda a: a):
        d = kolm_rsd.Drafter(texts, control_tokens=control, adaptive=False)
        d.begin(0, as_tokens(words))
        drafts.append(d.propose(0, as_tokens(np.concatenate([words, words[:3]])), int(words[3])))
    assert drafts[0][:6] == list(range(2004, 2010)) and drafts[0] == drafts[1] == drafts[2]
    with pytest.raises(ValueError, match="whole number of int32"):
        d.begin(0, b"\x01\x02\x03")
    with pytest.raises(ValueError, match="sequence 1 out of range 0..1"):
        d.propose(1, [1, 2], 3)


def serve(d: kolm_rsd.Drafter, prompt: list[int], answer: list[int], seq: int = 0) -> list[list[int]]:
    """Greedy verification of ``answer``: each step drafts, keeps the drafted tokens the answer has, and the next."""
    d.begin(seq, prompt)
    drafts, done = [], 1
    while done < len(answer):
        draft = d.propose(seq, prompt + answer[: done - 1], answer[done - 1])
        kept = 0
        while kept < len(draft) and done + kept < len(answer) and draft[kept] == answer[done + kept]:
            kept += 1
        d.accept(seq, kept)
        drafts.append(draft)
        done += kept + 1
    return drafts


def test_the_pack_drafts_and_texts_drive_the_same_engine_as_the_gguf(model, pack, vocab):
    texts, control = vocab
    prompt, answer = tokenize(texts, PROMPT), tokenize(texts, ANSWER)
    from_texts = kolm_rsd.Drafter(texts, pack=pack, control_tokens=control, adaptive=False)
    from_gguf = kolm_rsd.Drafter.from_gguf(model, f"pack={pack},misslog=off,adaptive=0,live=mem")
    drafts = serve(from_texts, prompt, answer)
    assert drafts == serve(from_gguf, prompt, answer)
    a, b = from_texts.stats(), from_gguf.stats()
    assert repr(a) == repr(b)
    assert a.pack_hits > 0 and a.pack_entries == len(kolm_rsd.Pack(pack))
    assert 0 < a.tokens_accepted <= a.tokens_drafted
    assert "pack hits" in from_texts.summary() and str(pack) in from_texts.describe()


def test_a_batch_is_the_steps_of_its_sequences_in_one_call(vocab, pack):
    texts, control = vocab
    prompt, answer = tokenize(texts, PROMPT), tokenize(texts, ANSWER)
    one = kolm_rsd.Drafter(texts, pack=pack, control_tokens=control, adaptive=False, n_seq=2)
    many = kolm_rsd.Drafter(texts, pack=pack, control_tokens=control, adaptive=False, n_seq=2)
    for d in (one, many):
        d.begin(0, prompt)
        d.begin(1, prompt[5:])
    for step in range(1, 12):
        reqs = [(0, prompt + answer[: step - 1], answer[step - 1]), (1, prompt[5:] + answer[: step - 1], answer[step - 1])]
        expect = [one.propose(s, t, last) for s, t, last in reqs]
        assert many.propose_batch([(s, np.asarray(t, dtype=np.int32).tobytes(), last) for s, t, last in reqs]) == expect
        for d in (one, many):
            d.accept(0, 0)
            d.accept(1, 0)
    assert repr(one.stats()) == repr(many.stats())


def test_misses_go_to_the_miss_log(tmp_path, vocab, pack):
    texts, control = vocab
    log = tmp_path / "misses.jsonl"
    d = kolm_rsd.Drafter(texts, pack=pack, control_tokens=control, adaptive=False, miss_log=log)
    prompt, answer = tokenize(texts, PROMPT), tokenize(texts, ANSWER)
    serve(d, prompt, answer)
    d.observe_miss(prompt, answer[0])
    d.flush_misses()
    assert d.stats().misses_logged > 0
    assert len(log.read_text().splitlines()) == d.stats().misses_logged
