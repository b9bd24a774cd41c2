"""Issue 30's battery cases for attnbook.gpt, attnbook.cache and attnbook.poems: silent wrong
answers turned into errors, and clear errors naming the function and the argument."""
from __future__ import annotations

import pytest
import torch

from attnbook import gpt
from attnbook.cache import CachedAttention, KVCache
from attnbook.data import BOS_ID, EOS_ID, PAD_ID
from attnbook.gpt import GPT, GPTConfig, generate, head_mask, lm_loss, mean_loss, perplexity
from attnbook.poems import NgramLM, attention_to, copied_ngrams, ngram_set, poem_form
from attnbook.testing import F64_TOL, rand

pytestmark = pytest.mark.usefixtures("one_thread")
V = 17


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(V, n_positions=24, d_model=16, n_heads=4, n_layers=2, d_ff=32)).double().eval()


# ---- silent wrong answers -------------------------------------------------------------------

def test_one_cache_object_shared_by_two_blocks_raises(monkeypatch):
    m, ids = _model(), torch.randint(V, (2, 5))
    with pytest.raises(ValueError, match="GPT.forward: `cache`.*distinct"):
        m(ids, cache=[KVCache()] * 2)
    right = m(ids, cache=m.new_cache()).logits                           # the valid call works
    torch.testing.assert_close(right, m(ids).logits, **F64_TOL)
    # control: without the check a shared cache silently changes the logits
    monkeypatch.setattr(gpt, "_check_block_caches", lambda cache, fn: None)
    assert (m(ids, cache=[KVCache()] * 2).logits - right).abs().max() > 1e-4


def test_block_caches_of_different_lengths_raise(monkeypatch):
    m, ids = _model(), torch.randint(V, (1, 4))
    cache = m.new_cache()
    m(ids[:, :3], cache=cache)
    bad = [cache[0], KVCache()]                                           # 3 and 0 positions
    with pytest.raises(ValueError, match=r"GPT.forward: every block's cache.*\[3, 0\]"):
        m(ids[:, 3:], cache=bad)
    step = m(ids[:, 3:], cache=cache).logits                              # equal lengths: fine
    torch.testing.assert_close(step, m(ids).logits[:, 3:], **F64_TOL)
    monkeypatch.setattr(gpt, "_check_block_caches", lambda cache, fn: None)   # control
    fresh = m.new_cache()
    m(ids[:, :3], cache=fresh)
    assert (m(ids[:, 3:], cache=[fresh[0], KVCache()]).logits - step).abs().max() > 1e-4


def test_a_static_cache_in_the_gpt_list_raises():
    m = _model()
    with pytest.raises(ValueError, match="GPT.forward: `cache` must hold self-attention"):
        m(torch.randint(V, (1, 3)), cache=[KVCache(), KVCache(static=True)])


def _quatrain_row():
    return [BOS_ID] + [5] * 24 + [EOS_ID]                                    # 5-character lines


def test_attention_to_without_a_quatrain_raises_and_with_one_averages():
    ids = torch.tensor([[BOS_ID, 5, 6, 7, EOS_ID, PAD_ID]])
    w = torch.softmax(torch.randn(1, 2, 6, 6), -1)
    with pytest.raises(ValueError, match="attention_to: no row of `ids`"):
        attention_to(w, ids, "bos")
    ids = torch.tensor([_quatrain_row()])
    t = ids.shape[1]
    w = torch.zeros(1, 2, t, t)
    w[:, :, :, 0] = 1.0                                                   # all on BOS
    assert torch.equal(attention_to(w, ids, "bos"), torch.ones(2, dtype=torch.float64))
    # 20 queries (the non-punctuation characters); only the first one's previous key is BOS
    torch.testing.assert_close(attention_to(w, ids, "previous"), torch.full((2,), 1 / 20, dtype=torch.float64))


def test_ngram_perplexity_with_every_target_pad_raises_like_gpt():
    train = torch.tensor([[BOS_ID, 3, 4, 5, EOS_ID]])
    lm = NgramLM(train, V)
    pads = torch.tensor([[BOS_ID, PAD_ID, PAD_ID]])
    with pytest.raises(ValueError, match="NgramLM.perplexity: `ids`.*non-PAD"):
        lm.perplexity(pads)
    with pytest.raises(ValueError, match="perplexity: `ids`.*non-PAD"):
        perplexity(_model(), pads)
    assert 1.0 < lm.perplexity(train) < V                                  # control: a real value


# ---- clear errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, fn, arg", [
    (lambda m: head_mask(m, prune=None), TypeError, "head_mask", "prune"),
    (lambda m: head_mask(m, prune="01"), TypeError, "head_mask", "prune"),
    (lambda m: head_mask("gpt"), TypeError, "head_mask", "model"),
    (lambda m: lm_loss(torch.zeros(1, 3, V), torch.zeros(1, 3)), TypeError, "lm_loss", "ids"),
    (lambda m: lm_loss(torch.zeros(1, 3, V), torch.tensor([[1, 2, V]])), ValueError, "lm_loss", "ids"),
    (lambda m: lm_loss(torch.zeros(1, 3, V), torch.tensor([[1, -3, 2]])), ValueError, "lm_loss", "ids"),
    (lambda m: perplexity(m, torch.randint(1, V, (4, 5)), batch_size=0), ValueError, "perplexity",
     "batch_size"),
    (lambda m: perplexity(m, torch.randint(1, V, (5,))), ValueError, "perplexity", "ids"),
    (lambda m: perplexity(m, torch.randint(1, V, (4, 1))), ValueError, "perplexity", "ids"),
    (lambda m: mean_loss(torch.nn.Linear(2, 2), torch.randint(1, V, (4, 5))), TypeError, "mean_loss",
     "model"),
    (lambda m: mean_loss(m, torch.randint(1, V, (4, 5)).float()), TypeError, "mean_loss", "ids"),
    (lambda m: mean_loss(m, torch.full((2, 5), V)), ValueError, "mean_loss", "ids"),
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, eos_id=True),
     TypeError, "generate", "eos_id"),
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, eos_id=V),
     ValueError, "generate", "eos_id"),
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, eos_id=-1),
     ValueError, "generate", "eos_id"),
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, use_cache=1),
     TypeError, "generate", "use_cache"),
    (lambda m: generate("gpt", torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2), TypeError,
     "generate", "model"),
])
def test_gpt_misuse_names_function_and_argument(call, exc, fn, arg):
    with pytest.raises(exc, match=rf"{fn}: `{arg}`"):
        call(_model())


def test_the_valid_neighbours_of_the_misuse_cases_work():
    m = _model()
    assert torch.equal(head_mask(m), torch.ones(2, 4, dtype=torch.float64))
    assert head_mask(m, [(1, 2)])[1, 2] == 0 and head_mask(m, iter([(0, 0)]))[0, 0] == 0
    ids = torch.randint(1, V, (4, 5))
    assert perplexity(m, ids, batch_size=1) == pytest.approx(perplexity(m, ids), rel=1e-9)
    logits = torch.randn(1, 3, V)
    assert torch.isfinite(lm_loss(logits, torch.tensor([[1, 2, 0]])))      # PAD target is ignored
    assert torch.isfinite(lm_loss(logits, torch.tensor([[1, 2, -100]]), pad_id=-100))
    out = generate(m, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=3, eos_id=V - 1,
                   use_cache=False, generator=torch.Generator().manual_seed(0))
    assert out.shape[1] <= 5


@pytest.mark.parametrize("field, value", [("n_layers", -1), ("n_layers", 0), ("d_model", 0),
                                          ("n_heads", -2), ("d_ff", 0), ("vocab_size", 0),
                                          ("n_positions", -5)])
def test_gpt_config_rejects_non_positive_sizes(field, value):
    with pytest.raises(ValueError, match=f"GPTConfig: `{field}`"):
        GPTConfig(**{"vocab_size": V, field: value})
    GPTConfig(**{"vocab_size": V, field: 2 if field != "d_model" else 8})      # control: fine


def test_gpt_config_rejects_bad_combinations():
    with pytest.raises(ValueError, match="GPTConfig: `n_heads` must divide"):
        GPTConfig(V, d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="GPTConfig: positions='rope'"):
        GPTConfig(V, d_model=12, n_heads=4, positions="rope")
    with pytest.raises(TypeError, match="GPTConfig: `n_layers`"):
        GPTConfig(V, n_layers=2.0)
    with pytest.raises(ValueError, match="GPTConfig: `dropout`"):
        GPTConfig(V, dropout=1.5)
    with pytest.raises(TypeError, match="GPTConfig: `tie_weights`"):
        GPTConfig(V, tie_weights=1)


# ---- cache ------------------------------------------------------------------------------------

def test_kv_cache_select_rejects_out_of_range_and_negative_rows():
    c = KVCache()
    c.update(rand(2, 1, 3, 4), rand(2, 1, 3, 4, seed=1))
    for rows in (torch.tensor([0, 2]), torch.tensor([-1, 0])):
        with pytest.raises(ValueError, match=r"KVCache.select: every entry of `rows` must lie in \[0, 2\)"):
            c.select(rows)
    torch.testing.assert_close(c.select(torch.tensor([1, 1, 0])).k, c.k[[1, 1, 0]], **F64_TOL)
    static = KVCache(static=True)
    static.update(rand(1, 1, 3, 4), rand(1, 1, 3, 4))
    assert static.select(torch.tensor([0, 5])).k is static.k              # shared memory: kept
    assert len(KVCache().select(torch.tensor([7]))) == 0                  # empty: nothing indexed


def test_kv_cache_update_rejects_k_and_v_of_different_dtypes():
    with pytest.raises(TypeError, match="KVCache.update: `k` and `v` must share one dtype"):
        KVCache().update(rand(1, 1, 2, 4), rand(1, 1, 2, 4).float())
    with pytest.raises(TypeError, match="KVCache.update: `k`"):
        KVCache().update(torch.zeros(1, 1, 2, 4, dtype=torch.long), torch.zeros(1, 1, 2, 4, dtype=torch.long))
    k, v = KVCache().update(rand(1, 1, 2, 4), rand(1, 1, 2, 4, seed=1))   # control
    assert k.dtype == v.dtype == torch.float64


def test_cached_attention_rejects_a_cache_of_another_batch_size():
    torch.manual_seed(0)
    m = CachedAttention(8, 2, dtype=torch.float64)
    mem = KVCache(static=True)
    m(rand(3, 2, 8), rand(3, 5, 8, seed=1), cache=mem)                    # filled at batch 3
    with pytest.raises(ValueError, match="CachedAttention.forward: `cache` was filled at batch size 3"):
        m(rand(2, 1, 8), rand(2, 5, 8, seed=1), cache=mem)
    selfc = KVCache()
    m(rand(3, 2, 8), cache=selfc)
    with pytest.raises(ValueError, match="CachedAttention.forward: `cache` was filled at batch size 3"):
        m(rand(2, 1, 8), cache=selfc)
    shared = KVCache(static=True)
    m(rand(1, 1, 8), rand(1, 5, 8, seed=1), cache=shared)                 # batch 1: shared by any
    assert m(rand(4, 1, 8), rand(1, 5, 8, seed=1), cache=shared).out.shape == (4, 1, 8)
    other = CachedAttention(8, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="CachedAttention.forward: `cache` holds keys"):
        other(rand(3, 1, 8), cache=selfc)


# ---- poems ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, fn, arg", [
    (lambda: NgramLM(torch.tensor([[1, V]]), V), ValueError, "NgramLM", "ids"),
    (lambda: NgramLM(torch.tensor([[1, -1]]), V), ValueError, "NgramLM", "ids"),
    (lambda: NgramLM(torch.tensor([[1.0, 2.0]]), V), TypeError, "NgramLM", "ids"),
    (lambda: NgramLM(torch.tensor([[1, 2]]), 0), ValueError, "NgramLM", "vocab_size"),
    (lambda: NgramLM(torch.tensor([[1, 2]]), V).perplexity(torch.tensor([[1, V]])), ValueError,
     "NgramLM.perplexity", "ids"),
    (lambda: NgramLM(torch.tensor([[1, 2]]), V).sample(-1, max_len=3, generator=torch.Generator()),
     ValueError, "NgramLM.sample", "n"),
    (lambda: NgramLM(torch.tensor([[1, 2]]), V).sample(2, max_len=-1, generator=torch.Generator()),
     ValueError, "NgramLM.sample", "max_len"),
    (lambda: NgramLM(torch.tensor([[1, 2]]), V).sample(2, max_len=3, generator=0), TypeError,
     "NgramLM.sample", "generator"),
    (lambda: poem_form(None), TypeError, "poem_form", "poem"),
    (lambda: poem_form("床前明月光，", groups=[]), TypeError, "poem_form", "groups"),
    (lambda: copied_ngrams("床前明月光，", set(), n=0), ValueError, "copied_ngrams", "n"),
    (lambda: copied_ngrams("床前明月光，", ["床前"]), TypeError, "copied_ngrams", "train_ngrams"),
    (lambda: ngram_set(["床前明月光"], 0), ValueError, "ngram_set", "n"),
    (lambda: attention_to(torch.rand(1, 2, 5, 5), torch.tensor([_quatrain_row()]), "bos"),
     ValueError, "attention_to", "weights"),
    (lambda: attention_to(torch.rand(1, 2, 26, 26), torch.tensor([_quatrain_row()]), "nope"),
     ValueError, "attention_to", "kind"),
    (lambda: attention_to(torch.rand(1, 2, 26, 26), torch.tensor([_quatrain_row()]).float(), "bos"),
     TypeError, "attention_to", "ids"),
])
def test_poems_misuse_names_function_and_argument(call, exc, fn, arg):
    with pytest.raises(exc, match=rf"{fn}: `{arg}`"):
        call()


def test_poems_valid_neighbours_work():
    lm = NgramLM(torch.tensor([[BOS_ID, 3, 4, EOS_ID]]), V)
    assert lm.sample(0, max_len=3, generator=torch.Generator()).shape == (0, 4)
    assert copied_ngrams("床前明月光，", {"床前明月"}, n=4) == 0.5
    assert poem_form("床前明月光，").lengths_ok is False
