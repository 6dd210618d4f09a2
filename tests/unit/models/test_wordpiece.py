"""The C WordPiece (stream/models/_textprep.c) against the tokenizers library it stands in for: the same ids for
every text it takes, the texts it leaves to the library listed, and `MiniLMHandler`'s batches equal either way."""

from __future__ import annotations

import json
import os
import random
import string
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.texts import generate_texts
from stream.models.minilm import CHARS_PER_TOKEN, MiniLMHandler, read_model_files
from stream.models.text_buffer import TextBuffer
from stream.models.wordpiece import native_wordpiece

try:
    from stream.models._textprep import WordPiece
except ImportError:  # not compiled (optional extension)
    WordPiece = None  # type: ignore[assignment,misc]


def test_the_extension_is_compiled_where_ci_requires_it() -> None:
    """CI sets STREAM_REQUIRE_NATIVE=1: a lost compiler must fail the run, not skip the C half of the tests."""
    if os.environ.get("STREAM_REQUIRE_NATIVE") == "1":
        assert WordPiece is not None, "stream.models._textprep was not compiled"


pytestmark = pytest.mark.skipif(WordPiece is None, reason="stream.models._textprep not compiled")


@pytest.fixture(scope="module")
def native() -> MiniLMHandler:
    h = MiniLMHandler()
    h.load(torch.device("cpu"))
    assert h._wordpiece is not None
    return h


@pytest.fixture(scope="module")
def library() -> MiniLMHandler:
    h = MiniLMHandler(native_tokenizer=False)
    h.load(torch.device("cpu"))
    assert h._wordpiece is None
    return h


def library_ids(h: MiniLMHandler, texts: list[str], max_tokens: int) -> list[list[int]]:
    """The tokenizers library's ids, cut as the handler cuts."""
    limit = max_tokens * CHARS_PER_TOKEN
    rows = [e.ids for e in h._tokenizer.encode_batch_fast([t[:limit] for t in texts])]
    return [[*r[: max_tokens - 1], h._sep] if len(r) > max_tokens else r for r in rows]


def encoder(h: MiniLMHandler) -> WordPiece:
    assert h._wordpiece is not None
    return h._wordpiece


def native_ids(h: MiniLMHandler, texts: list[str], max_tokens: int) -> tuple[dict[int, list[int]], list[int], int]:
    """The C encoder's ids of the texts it took, by index; the ones it left; its cut count."""
    raw, raw_lengths, others, cut = encoder(h).encode(texts, max_tokens, max_tokens * CHARS_PER_TOKEN)
    tokens, lengths = np.frombuffer(raw, np.int32), np.frombuffer(raw_lengths, np.int32)
    assert all(lengths[i] == 0 for i in others)
    starts = np.cumsum(lengths) - lengths
    return ({i: tokens[starts[i]: starts[i] + lengths[i]].tolist() for i in range(len(texts)) if i not in others},
            others, cut)


def assert_same_ids(native: MiniLMHandler, texts: list[str], max_tokens: int = 256) -> int:
    """Every text the C encoder takes gets the library's ids; returns how many it took."""
    got, others, _ = native_ids(native, texts, max_tokens)
    want = library_ids(native, texts, max_tokens)
    for i, ids in got.items():
        assert ids == want[i], f"text {i} {texts[i][:120]!r}: {ids[:24]} != {want[i][:24]}"
    assert set(got) | set(others) == set(range(len(texts)))
    return len(got)


# ASCII only: letters of both cases, digits, every punctuation character but '[', whitespace of every kind, the
# control characters the normalizer drops, and runs of vocabulary words
ASCII = "".join(c for c in string.printable if c != "[") + "\x00\x01\x08\x0b\x0c\x0e\x1b\x1f\x7f" + "aeiou  " * 4


def test_the_benchmark_texts_are_all_taken_and_tokenized_as_the_library_does(native: MiniLMHandler) -> None:
    texts = generate_texts(3000, seed=2027).texts
    assert assert_same_ids(native, texts) == len(texts)


def test_random_ascii_and_vocabulary_runs_get_the_librarys_ids_at_every_cut(native: MiniLMHandler) -> None:
    rng = random.Random(46)
    vocab = [w.removeprefix("##") for w in native._tokenizer.get_vocab() if w.isascii() and "[" not in w]
    texts = ["".join(rng.choice(ASCII) for _ in range(rng.randint(0, 400))) for _ in range(3000)]
    texts += [rng.choice(["", " ", "-"]).join(rng.choice(vocab) + rng.choice(["", "", "s", "ING", "ly", "!", "x"])
                                              for _ in range(rng.randint(1, 80))) for _ in range(3000)]
    # words at and past max_input_chars_per_word (100: [UNK] beyond), and past the C side's 512-byte word buffer
    texts += ["a" * n for n in (1, 99, 100, 101, 511, 512, 513, 2000)] + ["un" + "believable" * k for k in range(12)]
    texts += ["", " \t\n\r ", "\x00\x7f", "Hello,World!!", "ünïcode is left", "a [SEP] b", "[CLS]"]
    for max_tokens in (256, 17, 3):
        assert assert_same_ids(native, texts, max_tokens) > 5000


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from([*ASCII, "\u00e9", "["]), max_size=300), st.integers(2, 40))
def test_any_text_is_taken_with_the_librarys_ids_or_left_to_it(native: MiniLMHandler, text: str,
                                                               max_tokens: int) -> None:
    h = native
    got, others, cut = native_ids(h, [text, text.upper()], max_tokens)
    for i in got:
        assert got[i] == library_ids(h, [text, text.upper()], max_tokens)[i]
    taken = text.isascii() and "[" not in text[: max_tokens * CHARS_PER_TOKEN]
    assert (others == []) == taken
    if taken:
        full = len(h._tokenizer.encode(text).ids)
        assert cut == 2 * (full > max_tokens or len(text) > max_tokens * CHARS_PER_TOKEN)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from([*ASCII, "\u00e9", "\u4e2d", "["]), max_size=120), max_size=6),
       st.integers(2, 40))
def test_a_batchs_bytes_get_the_ids_its_strs_get(native: MiniLMHandler, texts: list[str], max_tokens: int) -> None:
    """encode_spans (a TextBuffer's bytes, no str per text) takes, leaves and cuts what encode does, in any order
    of the spans in the buffer."""
    enc, limit = encoder(native), max_tokens * CHARS_PER_TOKEN
    buf = TextBuffer.of(texts)
    assert enc.encode_spans(buf.data, buf.starts, buf.ends, max_tokens, limit) == enc.encode(texts, max_tokens, limit)
    back = buf.take(np.arange(len(texts))[::-1])
    assert (enc.encode_spans(back.data, back.starts, back.ends, max_tokens, limit)
            == enc.encode(texts[::-1], max_tokens, limit))


def test_the_handler_batches_equal_the_librarys_with_texts_left_to_it_spliced_in(native: MiniLMHandler,
                                                                                 library: MiniLMHandler) -> None:
    rng = random.Random(7)
    texts = generate_texts(600, seed=5).texts
    for i in rng.sample(range(len(texts)), 150):  # a quarter the library's: accents, brackets, a long tail
        texts[i] = rng.choice(["Café ", "[MASK] ", "naïve [SEP] ", "x" * 9000 + " ", "über "]) + texts[i]
    for start in range(0, len(texts), 128):
        batch = texts[start:start + 128]
        a, b = native.prepare({"text": batch}), library.prepare({"text": batch})
        c, d = (h.prepare({"text": TextBuffer.of(batch)}) for h in (native, library))  # as the worker binds them
        for key in ("ids", "lengths", "inverse"):
            assert np.array_equal(a[key], b[key]) and np.array_equal(a[key], c[key]), key
            assert np.array_equal(a[key], d[key]), key
        assert a["passes"] == b["passes"] == c["passes"] and a["truncated"] == b["truncated"] == c["truncated"]
        assert native.tokenize(batch) == library.tokenize(batch)
    assert np.array_equal(native.embed(texts[:48]), library.embed(texts[:48]))
    for batch in (["café", "[SEP] x", "naïve"], ["ü"], ["plain"], []):  # all, one or none left to the library
        a_tokens, a_lengths, a_cut = native.tokenize_flat(batch)
        b_tokens, b_lengths, b_cut = library.tokenize_flat(batch)
        assert np.array_equal(a_tokens, b_tokens) and np.array_equal(a_lengths, b_lengths) and a_cut == b_cut
        assert native.tokenize(batch) == library.tokenize(batch)


def test_threads_share_one_encoder(native: MiniLMHandler) -> None:
    """The encoder runs without the GIL: several prepare threads at once get what one thread gets."""
    texts = generate_texts(2000, seed=11).texts
    want = native.tokenize_flat(texts)[0]
    results: list[np.ndarray] = []

    def run() -> None:
        for _ in range(5):
            results.append(native.tokenize_flat(texts)[0])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20 and all(np.array_equal(r, want) for r in results)


def test_bad_arguments_are_clear_errors(native: MiniLMHandler) -> None:
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        encoder(native).encode(["ok", 3], 16, 100)  # type: ignore[list-item]
    for bad in (1, 65537):
        with pytest.raises(ValueError, match="max_tokens"):
            encoder(native).encode(["ok"], bad, 100)
    with pytest.raises(ValueError, match="not within"):
        encoder(native).encode_spans(b"ok", np.array([0], dtype=np.int64), np.array([3], dtype=np.int64), 16, 100)
    with pytest.raises(ValueError, match="max_tokens"):
        encoder(native).encode_spans(b"ok", np.array([0], dtype=np.int64), np.array([2], dtype=np.int64), 1, 100)
    with pytest.raises(ValueError, match="max_word_chars"):
        WordPiece({"a": 1}, 0, 1, 2, 513)


def test_tokenizers_it_does_not_reproduce_are_left_to_the_library() -> None:
    spec = json.loads(read_model_files(None)["tokenizer.json"])
    assert native_wordpiece(json.dumps(spec).encode()) is not None
    for change in ({"normalizer": {**spec["normalizer"], "lowercase": False}},
                   {"normalizer": {**spec["normalizer"], "clean_text": False}},
                   {"pre_tokenizer": {"type": "Whitespace"}},
                   {"model": {**spec["model"], "continuing_subword_prefix": "@@"}},
                   {"added_tokens": [*spec["added_tokens"], {"id": 5, "content": "<x>", "special": True}]}):
        assert native_wordpiece(json.dumps({**spec, **change}).encode()) is None, change


def test_a_wordpiece_is_initialised_once_and_never_used_uninitialised() -> None:
    """Calling __init__ again freed the tables before checking the new vocabulary (encode then crashed, and an
    encode meanwhile on another thread, without the GIL, read freed memory); an object made without __init__ was
    read as if it had tables."""
    assert WordPiece is not None
    wp = WordPiece({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3}, 0, 1, 2, 100)
    before = wp.encode(["a a"], 8, 100)
    with pytest.raises(TypeError, match="initialised once"):
        wp.__init__({"b": 4}, 0, 1, 2, 100)  # type: ignore[misc]
    with pytest.raises(TypeError, match="initialised once"):
        wp.__init__({1: "not a vocabulary"}, 0, 1, 2, 100)  # type: ignore[misc, dict-item]
    assert wp.encode(["a a"], 8, 100) == before
    bare = WordPiece.__new__(WordPiece)
    with pytest.raises(TypeError, match="not initialised"):
        bare.encode(["a"], 8, 100)
