"""`transformer.torch_masks` (chapter 10): nn.Transformer called with one mask type (bool), so torch
emits no deprecation warning; the float causal mask beside bool padding masks does (control)."""
import math
import warnings

import pytest
import torch
from torch import nn

from attnbook.positional import sinusoidal_encoding
from attnbook.testing import F64_TOL
from attnbook.transformer import Transformer, torch_masks

f64 = torch.float64
NESTED = ".*nested"   # the nested-tensor fast path's notices, which chapter 10 explains


def _model(norm_first):
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NESTED)     # Pre-LN: no fast path, torch says so
        ref = nn.Transformer(16, 4, 2, 2, 32, dropout=0.1, batch_first=True,
                             norm_first=norm_first, dtype=f64).eval()
    src_embed, tgt_embed = nn.Embedding(11, 16, dtype=f64), nn.Embedding(9, 16, dtype=f64)
    output = nn.Linear(16, 9, bias=False, dtype=f64)
    return ref, src_embed, tgt_embed, output


def _inputs():
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(11, (3, 7), generator=g), torch.randint(9, (3, 5), generator=g)
    src_pad = torch.arange(7) < torch.tensor([7, 4, 2])[:, None]          # right padding
    tgt_pad = torch.arange(5) < torch.tensor([5, 3, 1])[:, None]
    return src, tgt, src_pad, tgt_pad


def _embed(table, tokens):
    return table(tokens) * 4 + sinusoidal_encoding(tokens.shape[1], 16, dtype=f64)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_chapter_call_emits_no_warning_and_equals_the_library(norm_first):
    ref, src_embed, tgt_embed, output = _model(norm_first)
    src, tgt, src_pad, tgt_pad = _inputs()
    mine = Transformer.from_torch(ref, src_embed, tgt_embed, output).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")                  # any warning fails the test ...
        warnings.filterwarnings("ignore", message=NESTED)  # ... but the fast path's notice
        expected = output(ref(_embed(src_embed, src), _embed(tgt_embed, tgt),
                              **torch_masks(src_pad, tgt_pad)))
        got = mine(src, tgt, src_pad=src_pad, tgt_pad=tgt_pad)
    torch.testing.assert_close(got, expected, **F64_TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_control_the_float_causal_mask_beside_bool_padding_warns(norm_first):
    ref, src_embed, tgt_embed, _ = _model(norm_first)
    src, tgt, src_pad, tgt_pad = _inputs()
    masks = torch_masks(src_pad, tgt_pad)
    masks["tgt_mask"] = nn.Transformer.generate_square_subsequent_mask(5, dtype=f64)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ref(_embed(src_embed, src), _embed(tgt_embed, tgt), **masks)
    assert any("mismatched key_padding_mask and attn_mask" in str(w.message) for w in seen)


def test_torch_masks_polarity_and_shapes():
    src_pad = torch.tensor([[True, True, False]])
    tgt_pad = torch.tensor([[True, True, True, False]])
    m = torch_masks(src_pad, tgt_pad)
    assert all(v.dtype == torch.bool for v in m.values())
    assert torch.equal(m["tgt_mask"], torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1],
                                                    [0, 0, 0, 0]], dtype=torch.bool))
    # the same positions as torch's float mask hides (-inf above the diagonal)
    assert torch.equal(m["tgt_mask"], nn.Transformer.generate_square_subsequent_mask(4) < 0)
    assert torch.equal(m["src_key_padding_mask"], torch.tensor([[False, False, True]]))
    assert torch.equal(m["memory_key_padding_mask"], m["src_key_padding_mask"])
    assert torch.equal(m["tgt_key_padding_mask"], torch.tensor([[False, False, False, True]]))


def test_torch_masks_bad_input_is_a_clear_error():
    ok = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"torch_masks: `src_pad` must be a bool tensor \(B, T\), got "
                                        r"shape \(2, 3\), dtype torch.float32"):
        torch_masks(torch.ones(2, 3), ok)
    with pytest.raises(TypeError, match="torch_masks: `tgt_pad` must be a bool tensor"):
        torch_masks(ok, [[True]])
    with pytest.raises(ValueError, match="torch_masks: `src_pad` and `tgt_pad` must have the same batch"):
        torch_masks(ok, torch.ones(3, 3, dtype=torch.bool))
