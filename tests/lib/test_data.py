"""Tests for attnbook.data: seeded toy tasks, Vocab, batching with padding, held-out splits."""
from __future__ import annotations

import datetime as dt

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.data import (
    ADDING_BASELINE_MSE,
    BOS_ID,
    DATE_FORMATS,
    DIGIT_WORDS,
    EOS_ID,
    NUMERIC_DATE_ORDER,
    PAD_ID,
    SPLITS,
    UNK_ID,
    Batch,
    Vocab,
    adding_problem,
    copy_task,
    date_task,
    digit_word_task,
    first_token_recall,
    format_date,
    make_batch,
    parse_date,
    reversal_task,
    sorting_task,
    split_of,
)

dates = st.dates(min_value=dt.date(1950, 1, 1), max_value=dt.date(2049, 12, 31))


# ---------------------------------------------------------------------------------------------- Vocab
def test_vocab_specials_and_roundtrip_char():
    v = Vocab("abc")
    assert (v.pad_id, v.bos_id, v.eos_id, v.unk_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert len(v) == 7 and "a" in v and "z" not in v
    assert v.encode("cab") == [6, 4, 5]
    assert v.encode("az") == [4, UNK_ID]
    assert v.decode([BOS_ID, 6, PAD_ID, 4, EOS_ID, 5, 5]) == "ca"  # skip PAD/BOS, stop at EOS
    assert v.decode(torch.tensor([4, 5])) == "ab"


def test_vocab_word_level_and_duplicates():
    v = Vocab(["one", "two", "one"], level="word")
    assert len(v) == 6
    assert v.encode("two one") == v.encode(["two", "one"]) == [5, 4]
    assert v.decode([5, 4, EOS_ID]) == "two one"


@given(st.text(alphabet="0123456789abc", max_size=30))
@settings(max_examples=50, deadline=None)
def test_vocab_encode_decode_roundtrip(s):
    v = Vocab("0123456789abc")
    assert v.decode(v.encode(s)) == s


def test_vocab_bad_arguments():
    with pytest.raises(ValueError, match="`level`"):
        Vocab("ab", level="byte")
    with pytest.raises(TypeError, match="`tokens`"):
        Vocab([1, 2])
    v = Vocab("ab")
    with pytest.raises(ValueError, match="out of range"):
        v.decode([99])
    with pytest.raises(TypeError, match="`text`"):
        v.encode(5)


# ---------------------------------------------------------------------------------------------- batching
def test_make_batch_padding_lengths_masks():
    v = Vocab("0123456789")
    b = make_batch([("12", "345"), ("6789", "0")], v, v)
    assert isinstance(b, Batch) and len(b) == 2
    assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.long
    assert b.src.shape == (2, 4) and b.tgt_in.shape == b.tgt_out.shape == (2, 4)
    assert b.src_len.tolist() == [2, 4] and b.tgt_len.tolist() == [4, 2]
    d = {c: v.encode(c)[0] for c in "0123456789"}
    assert b.src.tolist() == [[d["1"], d["2"], PAD_ID, PAD_ID], [d["6"], d["7"], d["8"], d["9"]]]
    assert b.tgt_in.tolist() == [[BOS_ID, d["3"], d["4"], d["5"]], [BOS_ID, d["0"], PAD_ID, PAD_ID]]
    assert b.tgt_out.tolist() == [[d["3"], d["4"], d["5"], EOS_ID], [d["0"], EOS_ID, PAD_ID, PAD_ID]]
    assert b.src_mask.dtype == torch.bool and b.src_mask.shape == (2, 4)
    assert b.src_mask.tolist() == [[True, True, False, False], [True] * 4]
    assert b.tgt_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert torch.equal(b.tgt_mask, b.tgt_out != PAD_ID) and torch.equal(b.src_mask, b.src != PAD_ID)
    # the teacher-forcing shift: tgt_in[:, 1:] == tgt_out[:, :-1] on real positions
    assert torch.equal(b.tgt_in[0, 1:], b.tgt_out[0, :-1])
    assert b.to("cpu").src.data_ptr() is not None


@given(st.lists(st.tuples(st.text("abc", min_size=1, max_size=6), st.text("abc", max_size=6)),
                min_size=1, max_size=5))
@settings(max_examples=50, deadline=None)
def test_make_batch_property(pairs):
    v = Vocab("abc")
    b = make_batch(pairs, v, v)
    assert b.src.shape == (len(pairs), max(len(s) for s, _ in pairs))
    assert b.tgt_in.shape == b.tgt_out.shape == (len(pairs), 1 + max(len(t) for _, t in pairs))
    assert b.src_len.tolist() == [len(s) for s, _ in pairs]
    assert b.tgt_len.tolist() == [len(t) + 1 for _, t in pairs]
    assert torch.equal(b.src_mask, b.src != PAD_ID) and torch.equal(b.tgt_mask, b.tgt_out != PAD_ID)
    assert (b.tgt_in[:, 0] == BOS_ID).all()
    rows = torch.arange(len(pairs))
    assert (b.tgt_out[rows, b.tgt_len - 1] == EOS_ID).all()
    assert [v.decode(r) for r in b.src] == [s for s, _ in pairs]
    assert [v.decode(r) for r in b.tgt_out] == [t for _, t in pairs]
    assert [v.decode(r) for r in b.tgt_in] == [t for _, t in pairs]  # BOS skipped, PAD skipped


def test_make_batch_ids_without_vocab_and_bad_input():
    b = make_batch([([5, 6], [7])])
    assert b.src.tolist() == [[5, 6]] and b.tgt_out.tolist() == [[7, EOS_ID]]
    with pytest.raises(ValueError, match="`pairs`"):
        make_batch([])
    with pytest.raises(TypeError, match="`pairs`"):
        make_batch([("1", "2", "3")], Vocab("123"), Vocab("123"))
    with pytest.raises(TypeError, match="`src_vocab`"):
        make_batch([("1", "2")], "123", None)
    with pytest.raises(TypeError, match="`pairs`"):
        make_batch([(["a"], [1])])


# ---------------------------------------------------------------------------------------------- string tasks
@pytest.mark.parametrize("make, check", [
    (copy_task, lambda s, t: t == s),
    (reversal_task, lambda s, t: t == s[::-1]),
    (sorting_task, lambda s, t: t == "".join(sorted(s))),
    (digit_word_task, lambda s, t: t.split() == [DIGIT_WORDS[int(c)] for c in s]),
])
def test_string_tasks_targets_and_lengths(make, check):
    task = make(min_len=2, max_len=6)
    pairs = task.pairs(200, seed=0)
    assert all(check(s, t) for s, t in pairs)
    lengths = {len(s) for s, _ in pairs}
    assert lengths == set(range(2, 7))  # both ends of the range are drawn
    b = task.batch(16, seed=1)
    assert b.src.shape[0] == 16 and int(b.src_len.max()) <= 6
    assert task.src_vocab.decode(b.src[0]) == b.pairs[0][0]
    assert task.tgt_vocab.decode(b.tgt_out[0]) == b.pairs[0][1]


def test_tasks_deterministic_from_seed_and_generator():
    task = reversal_task()
    assert task.pairs(20, seed=3) == task.pairs(20, seed=3)
    assert task.pairs(20, seed=3) != task.pairs(20, seed=4)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = [task.pairs(4, seed=g1) for _ in range(3)]
    assert a == [task.pairs(4, seed=g2) for _ in range(3)]
    assert a[0] != a[1]  # a generator advances: fresh draws
    s1 = [b.pairs for b in task.batches(8, seed=7, n_batches=3)]
    s2 = [b.pairs for b in task.batches(8, seed=7, n_batches=3)]
    assert s1 == s2 and len(s1) == 3 and s1[0] != s1[1]
    endless = task.batches(2, seed=0)
    assert [len(next(endless)) for _ in range(5)] == [2] * 5


def test_splits_are_disjoint_and_deterministic():
    task = reversal_task(min_len=2, max_len=3)  # a small space: 1,100 strings
    parts = {s: {src for src, _ in task.pairs(150, seed=0, split=s)} for s in SPLITS}
    assert not (parts["train"] & parts["valid"]) and not (parts["train"] & parts["test"])
    assert not (parts["valid"] & parts["test"])
    assert all(split_of(src) == s for s in SPLITS for src in parts[s])
    counts = [split_of(str(i)) for i in range(10_000)]
    assert 0.77 < counts.count("train") / 1e4 < 0.83 and 0.08 < counts.count("test") / 1e4 < 0.12
    assert len(task.pairs(10, seed=0, split=None)) == 10
    with pytest.raises(ValueError, match="`split`"):
        task.pairs(3, split="dev")
    tiny = copy_task(min_len=1, max_len=1, alphabet="ab")
    missing = [s for s in SPLITS if all(split_of(c) != s for c in "ab")]
    if missing:  # an example space too small for a split is reported, not looped on forever
        with pytest.raises(ValueError, match="too small"):
            tiny.pairs(1, split=missing[0])


def test_string_task_bad_arguments():
    with pytest.raises(ValueError, match="`max_len`"):
        reversal_task(min_len=5, max_len=3)
    with pytest.raises(ValueError, match="`min_len`"):
        copy_task(min_len=0)
    with pytest.raises(TypeError, match="`max_len`"):
        digit_word_task(max_len=2.5)
    with pytest.raises(ValueError, match="`alphabet`"):
        reversal_task(alphabet="aab")
    with pytest.raises(TypeError, match="`alphabet`"):
        reversal_task(alphabet=["a"])
    with pytest.raises(ValueError, match="`seed`"):
        reversal_task().pairs(2, seed=-1)
    with pytest.raises(TypeError, match="`n`"):
        reversal_task().pairs(2.0)
    with pytest.raises(TypeError, match="`batch_size`"):
        next(reversal_task().batches(None))


# ---------------------------------------------------------------------------------------------- dates
@given(dates, st.sampled_from(DATE_FORMATS))
@settings(max_examples=200, deadline=None)
def test_each_date_format_parses_back(d, fmt):
    s = format_date(d, fmt)
    assert parse_date(s, fmt) == d
    assert parse_date(s) == d  # whichever format matches first, the date is the same


def test_date_examples_and_day_month_convention():
    d = dt.date(2021, 3, 3)
    assert [format_date(d, f) for f in DATE_FORMATS[:5]] == [
        "3 March 2021", "03/03/21", "March 3, 2021", "2021/3/3", "Mar 3 2021"]
    # numeric day/month: the day comes first (dd/mm/yy); year-first formats are y/m/d
    assert NUMERIC_DATE_ORDER == "DMY"
    assert format_date(dt.date(2021, 4, 3), "DD/MM/YY") == "03/04/21"
    assert parse_date("03/04/21") == dt.date(2021, 4, 3)
    assert parse_date("2021/4/3") == dt.date(2021, 4, 3)
    assert parse_date("03.04.2021") == dt.date(2021, 4, 3)
    assert parse_date("01/02/50") == dt.date(1950, 2, 1) and parse_date("01/02/49") == dt.date(2049, 2, 1)
    with pytest.raises(ValueError, match="matches none"):
        parse_date("2021-03-03")
    with pytest.raises(ValueError):
        parse_date("31/02/21")  # not a calendar date


def test_date_task_targets_are_iso_and_match_source():
    task = date_task()
    pairs = task.pairs(300, seed=0)
    for src, tgt in pairs:
        assert len(tgt) == 10 and tgt[4] == tgt[7] == "-"
        assert dt.date.fromisoformat(tgt).isoformat() == tgt
        assert parse_date(src) == dt.date.fromisoformat(tgt)
    fmts = {next(f for f in DATE_FORMATS if _matches(src, f)) for src, _ in pairs}
    assert fmts == set(DATE_FORMATS)  # every format is drawn
    assert task.pairs(50, seed=1) == task.pairs(50, seed=1)
    b = task.batch(8, seed=2)
    assert all(task.src_vocab.decode(b.src[i]) == b.pairs[i][0] for i in range(8))
    assert all(task.tgt_vocab.decode(b.tgt_out[i]) == b.pairs[i][1] for i in range(8))
    assert UNK_ID not in b.src.tolist() and UNK_ID not in b.tgt_out.tolist()


def _matches(src, fmt):
    try:
        parse_date(src, fmt)
        return True
    except ValueError:
        return False


def test_date_task_range_uniform_and_held_out_dates():
    lo, hi = dt.date(2020, 1, 30), dt.date(2020, 3, 2)  # 33 days, across a leap day
    task = date_task(formats=["YYYY/M/D"], start=lo, end=hi)
    drawn = [dt.date.fromisoformat(t) for _, t in task.pairs(2000, seed=0, split=None)]
    assert min(drawn) == lo and max(drawn) == hi and dt.date(2020, 2, 29) in drawn
    counts = torch.bincount(torch.tensor([d.toordinal() - lo.toordinal() for d in drawn]))
    assert counts.numel() == 33 and counts.min() > 30  # ~60.6 each when uniform
    # the split key is the date: a test date is absent from training in every format
    full = date_task()
    train = {t for _, t in full.pairs(2000, seed=0, split="train")}
    test = {t for _, t in full.pairs(300, seed=0, split="test")}
    assert not train & test and all(split_of(t) == "test" for t in test)


def test_date_task_bad_arguments():
    with pytest.raises(ValueError, match="`formats"):
        date_task(formats=["YYYY-MM-DD"])
    with pytest.raises(TypeError, match="`formats`"):
        date_task(formats="DD/MM/YY")
    with pytest.raises(ValueError, match="`end`"):
        date_task(start=dt.date(2000, 1, 2), end=dt.date(2000, 1, 1))
    with pytest.raises(ValueError, match="two-digit"):
        date_task(start=dt.date(1900, 1, 1))
    date_task(formats=["YYYY/M/D"], start=dt.date(1800, 1, 1))  # fine without a yy format
    with pytest.raises(TypeError, match="`start`"):
        date_task(start="2000-01-01")
    with pytest.raises(ValueError, match="`fmt`"):
        format_date(dt.date(2000, 1, 1), "ISO")


# ---------------------------------------------------------------------------------------------- tensor tasks
def test_first_token_recall():
    x, y = first_token_recall(500, 20, vocab_size=5, seed=0)
    assert x.shape == (500, 20) and x.dtype == torch.long and torch.equal(y, x[:, 0])
    assert set(x.unique().tolist()) == set(range(5))
    x2, _ = first_token_recall(500, 20, vocab_size=5, seed=0)
    assert torch.equal(x, x2)
    with pytest.raises(ValueError, match="`vocab_size`"):
        first_token_recall(4, 5, vocab_size=1)


def test_adding_problem_target_is_marked_sum():
    x, y = adding_problem(1000, 30, seed=0)
    assert x.shape == (1000, 30, 2) and y.shape == (1000,) and x.dtype == torch.float32
    values, markers = x[..., 0], x[..., 1]
    assert torch.equal(markers.sum(1), torch.full((1000,), 2.0))
    assert torch.equal(markers[:, :15].sum(1), torch.ones(1000))  # one marker in each half
    assert torch.allclose((values * markers).sum(1), y)
    assert ((values >= 0) & (values < 1)).all()
    assert abs(((y - 1) ** 2).mean().item() - ADDING_BASELINE_MSE) < 0.02
    x2, y2 = adding_problem(1000, 30, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert adding_problem(3, 7, dtype=torch.float64)[0].dtype == torch.float64
    with pytest.raises(ValueError, match="`length`"):
        adding_problem(3, 1)
    with pytest.raises(TypeError, match="`dtype`"):
        adding_problem(3, 4, dtype=torch.long)


# ---------------------------------------------------------------------------------------------- poems
def test_poems_ship_in_the_package_and_split_by_poem():
    from attnbook.data import load_poems, read_poems
    poems = read_poems()
    assert len(poems) == 8000 and len(set(poems)) == 8000
    assert {len(p) for p in poems} == {24, 32}                     # 五言 and 七言 quatrains
    c = load_poems()
    assert len(c.train) + len(c.valid) + len(c.test) == 8000
    assert not set(c.train) & set(c.valid) and not set(c.train) & set(c.test)
    assert (len(c.train), len(c.valid), len(c.test)) == (6369, 797, 834)   # after grouping
    assert 0.75 < len(c.train) / 8000 < 0.85                       # CRC-32 buckets 0-7 of 10
    order = {p: i for i, p in enumerate(poems)}
    for part in (c.train, c.valid, c.test):                        # file order kept
        assert [order[p] for p in part] == sorted(order[p] for p in part)
    seen = set("".join(c.train))
    assert len(c.vocab) == len(seen) + 4 and all(ch in c.vocab for ch in seen)


def test_poems_sharing_two_lines_never_straddle_splits():
    from attnbook.data import load_poems, read_poems, shared_line_pairs
    poems = read_poems()
    by_hash = {s: [p for p in poems if split_of(p) == s] for s in ("train", "valid", "test")}
    # the plain hash split (the old one) puts variant texts on both sides: 31 valid, 29 test
    leaked = {s: {i for i, _ in shared_line_pairs(by_hash[s], by_hash["train"])}
              for s in ("valid", "test")}
    assert (len(leaked["valid"]), len(leaked["test"])) == (31, 29)
    c = load_poems()
    for a, b in ((c.valid, c.train), (c.test, c.train), (c.valid, c.test)):
        assert shared_line_pairs(a, b) == []
    # every poem not in a group keeps its hash split; a group follows its first poem
    split = {p: s for s in ("train", "valid", "test") for p in getattr(c, s)}
    grouped = {p for i, j in shared_line_pairs(poems) for p in (poems[i], poems[j])}
    assert len(grouped) == 410
    from attnbook.data.poem_corpus import _group_first
    first = _group_first(poems)
    assert len({first[i] for i, p in enumerate(poems) if p in grouped}) == 203    # groups
    assert all(split[p] == split_of(p) for p in poems if p not in grouped)
    moved = [p for p in poems if split[p] != split_of(p)]
    assert len(moved) == 68
    for i, j in shared_line_pairs(poems):
        assert split[poems[i]] == split[poems[j]]
    again = load_poems()                                           # deterministic
    assert (again.train, again.valid, again.test) == (c.train, c.valid, c.test)
    assert again.vocab.itos == c.vocab.itos


def test_shared_line_pairs_is_transitive_in_load_poems_and_checks_input():
    from attnbook.data import shared_line_pairs
    from attnbook.data.poem_corpus import _group_first
    a, b, c, d = "甲乙，丙丁。戊己，庚辛。", "甲乙，丙丁。子丑，寅卯。", "子丑，寅卯。辰巳，午未。", "天地，玄黄。宇宙，洪荒。"
    assert shared_line_pairs([a, b, c, d]) == [(0, 1), (1, 2)]    # a-c share no line
    assert shared_line_pairs([a, b, c, d], min_shared=1) == [(0, 1), (1, 2)]
    assert shared_line_pairs([a, b], min_shared=3) == []
    assert shared_line_pairs([a], [b, c]) == [(0, 0)]
    assert shared_line_pairs(["甲乙，甲乙。甲乙，丙丁。"], [a]) == [(0, 0)]   # distinct lines
    assert shared_line_pairs(["甲乙，甲乙。甲乙，子丑。"], [a]) == []          # one distinct
    assert _group_first([d, c, b, a]) == [0, 1, 1, 1]               # c-b-a chained, first c
    from attnbook.data import read_poems
    from attnbook.data.poem_corpus import _lines
    from attnbook.poems import split_lines
    for p in read_poems() + ["甲乙，，丙丁。戊", "。甲"]:                # the same lines
        assert _lines(p) == {line for line in split_lines(p) if line}
    with pytest.raises(TypeError, match="shared_line_pairs: `poems`"):
        shared_line_pairs("甲乙，丙丁。")
    with pytest.raises(TypeError, match="shared_line_pairs: `others`"):
        shared_line_pairs([a], [1])
    with pytest.raises(ValueError, match="shared_line_pairs: `min_shared`"):
        shared_line_pairs([a], min_shared=0)


def test_load_poems_limit_groups_within_the_kept_poems():
    from attnbook.data import load_poems, read_poems, shared_line_pairs
    poems = read_poems()
    # the first pair of variant texts whose hash splits differ: (0, 2591), valid and train
    i, j = next((i, j) for i, j in shared_line_pairs(poems) if split_of(poems[i]) != split_of(poems[j]))
    for limit in (j, j + 1):
        c = load_poems(limit=limit)
        assert len(c.train) + len(c.valid) + len(c.test) == limit
        split = {p: s for s in ("train", "valid", "test") for p in getattr(c, s)}
        assert split[poems[i]] == split_of(poems[i])             # the group's first poem
        assert (poems[j] in split) == (limit > j)
        if limit > j:                                            # j joins i's split
            assert split[poems[j]] == split[poems[i]] != split_of(poems[j])
        assert shared_line_pairs(c.valid, c.train) == shared_line_pairs(c.test, c.train) == []
    with pytest.raises(ValueError, match="load_poems: `limit`"):
        load_poems(limit=0)


def test_load_poems_groups_after_cutting_at_limit(monkeypatch):
    """a and b share no line; c shares two with each. Cut before c, b keeps its own split;
    with c, b follows a. Grouping the whole file first would put b with a in both cases."""
    from attnbook.data import load_poems, poem_corpus
    a, b, c = "戊辛，己子。庚卯，辛午。", "壬酉，癸甲。子丁，丑庚。", "戊辛，己子。壬酉，癸甲。"
    assert (split_of(a), split_of(b)) == ("test", "train")
    monkeypatch.setattr(poem_corpus, "read_poems", lambda: [a, b, c])
    cut = load_poems(limit=2)
    assert (cut.train, cut.test) == ([b], [a])
    whole = load_poems()
    assert whole.test == [a, b, c] and whole.train == []


def test_poem_vocabulary_min_count_and_encoding():
    from attnbook.data import load_poems
    c3, c1 = load_poems(min_count=3), load_poems(min_count=1)
    assert len(c3.vocab) < len(c1.vocab)
    counts = {}
    for p in c3.train:
        for ch in p:
            counts[ch] = counts.get(ch, 0) + 1
    rare = next(ch for ch, n in counts.items() if n < 3)
    assert rare not in c3.vocab and rare in c1.vocab
    ids = c3.encode(c3.train[:2] + [c3.train[0][:24]])
    assert ids.shape[1] == 2 + max(len(p) for p in c3.train[:2] + [c3.train[0][:24]])
    assert (ids[:, 0] == BOS_ID).all() and c3.vocab.decode(ids[0]) == c3.train[0]
    with pytest.raises(ValueError, match="load_poems: `min_count`"):
        load_poems(min_count=0)
    with pytest.raises(TypeError, match="PoemCorpus.encode: `poems`"):
        c3.encode("白日依山尽")
