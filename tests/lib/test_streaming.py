"""attnbook.streaming: the rolling key/value cache with attention sinks (chapter 12)."""
import pytest
import torch

from attnbook.gpt import GPT, GPTConfig
from attnbook.positional import apply_rope
from attnbook.reference import attention_ref, causal_mask
from attnbook.streaming import SinkCache, streaming_attention_ref, streaming_logits, window_mask

CASES = [(1, 0), (1, 1), (3, 0), (3, 2), (5, 4), (16, 0), (None, 0), (None, 3)]


def _qkv(seed, shape=(2, 3, 19), d=8, dv=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*shape, d, generator=g, dtype=dtype) for _ in range(2))
    return q, k, torch.randn(*shape, dv, generator=g, dtype=dtype)


def _stream(q, k, v, window, sinks, rope=False, rebase=True):
    """Decode token by token through a SinkCache: the cache's own outputs."""
    cache, outs = SinkCache(window, sinks=sinks), []
    for i in range(q.shape[-2]):
        kk, vv = cache.update(k[..., i:i + 1, :], v[..., i:i + 1, :])
        qi = q[..., i:i + 1, :]
        if rope:
            pos = cache.rope_positions(rebase)
            kk, qi = apply_rope(kk, pos), apply_rope(qi, pos[-1:])
        outs.append(attention_ref(qi, kk, vv).out)
        assert len(cache) <= sinks + (window or i + 1)
    return torch.cat(outs, -2)


def _masked(q, k, v, window, sinks, rope=False):
    """Masked full attention over the whole sequence (keys at their positions in the text)."""
    if rope:
        q, k = apply_rope(q), apply_rope(k)
    return attention_ref(q, k, v, mask=window_mask(q.shape[-2], window=window, sinks=sinks)).out


# --------------------------------------------------------------------------------------------
# the cache itself


@pytest.mark.parametrize("window, sinks", CASES)
def test_cache_keeps_the_first_sinks_and_the_last_window(window, sinks):
    cache = SinkCache(window, sinks=sinks)
    k = torch.arange(30.0).reshape(1, 1, 30, 1)
    for i in range(30):
        kk, vv = cache.update(k[..., i:i + 1, :], -k[..., i:i + 1, :])
        want = [j for j in range(i + 1) if window is None or j < sinks or j > i - window]
        assert cache.positions.tolist() == want
        assert kk.flatten().tolist() == [float(j) for j in want]
        assert torch.equal(vv, -kk)
        assert cache.seen == i + 1 and len(cache) == len(want)
        assert cache.rope_positions().tolist() == list(range(len(want)))
        assert cache.rope_positions(rebase=False).tolist() == want
    if window is not None:
        assert len(cache) == min(30, sinks + window)      # a stream of any length: a fixed size


def test_chunk_updates_keep_what_one_token_updates_keep():
    _, k, v = _qkv(0, shape=(2, 2, 23))
    one, chunks = SinkCache(5, sinks=2), SinkCache(5, sinks=2)
    for i in range(23):
        one.update(k[..., i:i + 1, :], v[..., i:i + 1, :])
    for a, b in ((0, 3), (3, 4), (4, 9), (9, 14), (14, 23)):
        chunks.update(k[..., a:b, :], v[..., a:b, :])
    assert torch.equal(one.k, chunks.k) and torch.equal(one.v, chunks.v)
    assert torch.equal(one.positions, chunks.positions) and chunks.seen == 23
    assert "window=5, sinks=2, held=7, seen=23" in repr(chunks)


def test_a_first_chunk_longer_than_the_window_is_cut_at_once():
    _, k, v = _qkv(1, shape=(1, 1, 12))
    cache = SinkCache(4, sinks=1)
    kk, _ = cache.update(k, v)
    assert cache.positions.tolist() == [0, 8, 9, 10, 11]
    assert torch.equal(kk, k[..., [0, 8, 9, 10, 11], :])


def test_the_cache_keeps_dtype_device_and_does_not_edit_its_inputs():
    q, k, v = _qkv(2, dtype=torch.float32)
    k0, v0 = k.clone(), v.clone()
    cache = SinkCache(4, sinks=2)
    for i in range(k.shape[-2]):
        kk, vv = cache.update(k[..., i:i + 1, :], v[..., i:i + 1, :])
    assert kk.dtype == torch.float32 and vv.dtype == torch.float32
    assert torch.equal(k, k0) and torch.equal(v, v0)


# --------------------------------------------------------------------------------------------
# the rolling cache equals masked full attention


@pytest.mark.parametrize("window, sinks", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_rolling_cache_equals_masked_full_attention(window, sinks, seed):
    q, k, v = _qkv(seed)
    want = _masked(q, k, v, window, sinks)
    torch.testing.assert_close(_stream(q, k, v, window, sinks), want, rtol=0, atol=1e-13)
    torch.testing.assert_close(streaming_attention_ref(q, k, v, window=window, sinks=sinks),
                               want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("window, sinks", CASES)
def test_with_rope_at_text_positions_the_cache_equals_masked_rope_attention(window, sinks):
    q, k, v = _qkv(3)
    want = _masked(q, k, v, window, sinks, rope=True)
    got = _stream(q, k, v, window, sinks, rope=True, rebase=False)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("window", [1, 4, 7, None])
def test_rebasing_changes_nothing_without_sinks(window):
    """RoPE scores depend on m - n only, and a window is contiguous: re-based == text positions."""
    q, k, v = _qkv(4)
    want = _masked(q, k, v, window, 0, rope=True)
    torch.testing.assert_close(_stream(q, k, v, window, 0, rope=True), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("window, sinks", [(3, 1), (4, 2), (6, 4)])
def test_rebasing_moves_only_the_sinks(window, sinks):
    q, k, v = _qkv(5)
    rebased = _stream(q, k, v, window, sinks, rope=True)
    torch.testing.assert_close(
        rebased, streaming_attention_ref(q, k, v, window=window, sinks=sinks, rope=True),
        rtol=0, atol=1e-12)
    text = _masked(q, k, v, window, sinks, rope=True)
    full = sinks + window                        # until the first eviction, nothing is re-based
    torch.testing.assert_close(rebased[..., :full, :], text[..., :full, :], rtol=0, atol=1e-12)
    assert (rebased[..., full:, :] - text[..., full:, :]).abs().max() > 1e-3


def test_window_mask_rule_and_alignment():
    m = window_mask(7, 10, window=3, sinks=2)
    for i in range(7):
        for j in range(10):
            p = 3 + i                                # bottom-right: query i at position tk - tq + i
            assert bool(m[i, j]) == (j <= p and (j > p - 3 or j < 2))
    assert torch.equal(window_mask(6, window=None), causal_mask(6))
    assert torch.equal(window_mask(6, window=6, sinks=3), causal_mask(6))
    assert torch.equal(window_mask(5, 9, window=None), causal_mask(5, 9, align="bottom_right"))
    assert window_mask(0, 4, window=2).shape == (0, 4)


# --------------------------------------------------------------------------------------------
# a RoPE GPT read through one SinkCache per block


def _gpt(seed=0, **changes):
    torch.manual_seed(seed)
    cfg = dict(n_positions=32, d_model=32, n_heads=4, n_layers=2, d_ff=64, positions="rope")
    return GPT(GPTConfig(41, **{**cfg, **changes})).double().eval()


def _masked_gpt(model, ids, window, sinks):
    """The GPT's forward with the window mask in every block (keys at their text positions)."""
    h = model.tok_emb(ids)
    mask = window_mask(ids.shape[1], window=window, sinks=sinks)
    for block in model.blocks:
        h = h + block.self_attn(block.norm1(h), mask=mask).out
        h = h + block.ffn(block.norm2(h))
    return model.lm_head(model.norm_f(h))


def test_streaming_logits_with_everything_kept_equal_the_forward():
    model = _gpt()
    ids = torch.randint(41, (3, 21), generator=torch.Generator().manual_seed(0))
    want = model(ids).logits
    torch.testing.assert_close(streaming_logits(model, ids, window=None), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(streaming_logits(model, ids, window=21, sinks=3), want, rtol=0,
                               atol=1e-12)


@pytest.mark.parametrize("window, sinks", [(1, 0), (4, 0), (5, 2), (8, 4)])
def test_streaming_logits_equal_the_masked_forward_at_text_positions(window, sinks):
    """Every layer: each token's state was computed over its own window when it arrived, which
    is what the window mask gives a full forward; so the rolling cache is exact."""
    model = _gpt(1, n_layers=3)
    ids = torch.randint(41, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = _masked_gpt(model, ids, window, sinks)
    got = streaming_logits(model, ids, window=window, sinks=sinks, rebase=sinks == 0)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-11)
    if sinks:
        rebased = streaming_logits(model, ids, window=window, sinks=sinks)
        torch.testing.assert_close(rebased[:, :sinks + window], want[:, :sinks + window],
                                   rtol=0, atol=1e-11)
        assert (rebased - want).abs().max() > 1e-6


def test_streaming_logits_rows_are_independent_and_float32_follows_the_forward():
    model = _gpt(2)
    ids = torch.randint(41, (3, 15), generator=torch.Generator().manual_seed(3))
    both = streaming_logits(model, ids, window=4, sinks=2)
    torch.testing.assert_close(both[1:2], streaming_logits(model, ids[1:2], window=4, sinks=2),
                               rtol=0, atol=1e-12)
    m32 = _gpt(2).float()
    out = streaming_logits(m32, ids, window=None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, m32(ids).logits, rtol=1e-4, atol=1e-5)


def test_streaming_logits_restore_train_mode_and_leave_no_graph():
    model = _gpt().train()
    ids = torch.randint(41, (1, 6), generator=torch.Generator().manual_seed(2))
    out = streaming_logits(model, ids, window=2, sinks=1)
    assert model.training and not out.requires_grad and out.shape == (1, 6, 41)


# --------------------------------------------------------------------------------------------
# bad input: clear errors


@pytest.mark.parametrize("kwargs, err, words", [
    (dict(window=0), ValueError, "window"), (dict(window=-2), ValueError, "window"),
    (dict(window=2.0), TypeError, "window"), (dict(window=True), TypeError, "window"),
    (dict(window=3, sinks=-1), ValueError, "sinks"),
    (dict(window=3, sinks=None), TypeError, "sinks"),
])
def test_bad_window_or_sinks(kwargs, err, words):
    window = kwargs.pop("window")
    with pytest.raises(err, match=words):
        SinkCache(window, **kwargs)
    with pytest.raises(err, match=words):
        window_mask(4, window=window, **kwargs)
    q, k, v = _qkv(0, shape=(1, 4))
    with pytest.raises(err, match=words):
        streaming_attention_ref(q, k, v, window=window, **kwargs)


def test_bad_updates():
    cache = SinkCache(3)
    with pytest.raises(TypeError, match="torch.Tensor"):
        cache.update([1.0], torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match="at least 4 dims"):
        cache.update(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match="B, H_kv, t_new"):
        cache.update(torch.zeros(1, 1, 1, 1, 2), torch.zeros(1, 1, 1, 1, 2))
    with pytest.raises(ValueError, match="t_new >= 1"):
        cache.update(torch.zeros(1, 1, 0, 2), torch.zeros(1, 1, 0, 2))
    with pytest.raises(ValueError, match="share"):
        cache.update(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 3, 2))
    with pytest.raises(ValueError, match="dtype"):
        cache.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating"):
        cache.update(torch.zeros(1, 1, 1, 2, dtype=torch.long), torch.zeros(1, 1, 1, 2))
    cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 5))
    for k, v in ((torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 5)),
                 (torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 5)),
                 (torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 6)),
                 (torch.zeros(1, 2, 1, 4).double(), torch.zeros(1, 2, 1, 5).double())):
        with pytest.raises(ValueError, match="match the held ones"):
            cache.update(k, v)
    assert len(cache) == 1 and cache.seen == 1               # a rejected update changes nothing
    with pytest.raises(TypeError, match="rebase"):
        cache.rope_positions(rebase=1)


def test_bad_masks_and_references():
    with pytest.raises(ValueError, match="tk >= tq"):
        window_mask(5, 3, window=2)
    q, k, v = _qkv(0, shape=(1, 4))
    with pytest.raises(ValueError, match="share"):
        streaming_attention_ref(q, k[..., :3, :], v, window=2)
    with pytest.raises(TypeError, match="rope"):
        streaming_attention_ref(q, k, v, window=2, rope="yes")


def test_bad_models_and_ids():
    model = _gpt()
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(TypeError, match="attnbook.gpt.GPT"):
        streaming_logits(torch.nn.Linear(2, 2), ids, window=2)
    with pytest.raises(ValueError, match="RoPE"):
        streaming_logits(_gpt(positions="learned"), ids, window=2)
    with pytest.raises(TypeError, match=r"\(B, T\) LongTensor"):
        streaming_logits(model, ids.float(), window=2)
    with pytest.raises(TypeError, match=r"\(B, T\) LongTensor"):
        streaming_logits(model, ids[0], window=2)
    with pytest.raises(ValueError, match="at least one token"):
        streaming_logits(model, ids[:, :0], window=2)
    with pytest.raises(ValueError, match=r"\[0, 41\)"):
        streaming_logits(model, ids + 41, window=2)
    with pytest.raises(TypeError, match="rebase"):
        streaming_logits(model, ids, window=2, rebase=None)
