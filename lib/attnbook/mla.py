"""Multi-head latent attention (MLA) and its latent cache (chapter 12).

DeepSeek-AI 2024, "DeepSeek-V2", section 2.1. Keys and values are compressed jointly into a
latent ``c_KV = h W^DKV`` of dim d_latent and expanded per head by ``W^UK``, ``W^UV``:
``k^C = c_KV W^UK``, ``v^C = c_KV W^UV``. RoPE would sit between ``q`` and ``W^UK`` and block
the absorption below, so position travels in a separate, head-shared key
``k^R = RoPE(h W^KR)`` of dim d_rope, and each head's query has a rotated part
``q^R = RoPE(h W^QR)``:
``score_i(t, j) = (q^C_i . k^C_ij + q^R_i . k^R_j) / sqrt(d_head + d_rope)``.
The cache holds only ``c_KV`` and ``k^R``: d_latent + d_rope values per token and layer.

Absorbed computation: ``q^C_i . (c_j W^UK_i) = (q^C_i W^UK_i^T) . c_j``, so queries are
mapped into the latent space and attend over the cached latents directly; and
``sum_i (P_i C W^UV_i) W^O_i = sum_i (P_i C) (W^UV_i W^O_i)``, so ``W^UV`` is folded into the
output projection. ``absorb=True`` computes it that way; both give the same output.
Row-vector convention ``y = x W``; ``nn.Linear.weight`` stores ``W^T``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_bool, check_int, check_tensor, describe
from .dispatch import attention
from .positional import apply_rope

__all__ = ["LatentCache", "MultiHeadLatentAttention"]


class LatentCache:
    """What MLA caches per token: the latent ``c_kv`` ``(B, t, d_latent)`` and the shared RoPE key
    ``k_rope`` ``(B, t, d_rope)`` (already rotated), or None while empty (chapter 12)."""

    def __init__(self):
        self.c_kv: torch.Tensor | None = None
        self.k_rope: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.c_kv is None else self.c_kv.shape[1]

    def update(self, c_kv, k_rope):
        """Append the new positions; return all ``(c_kv, k_rope)``."""
        if self.c_kv is not None:
            if c_kv.shape[0] != self.c_kv.shape[0] or c_kv.shape[2] != self.c_kv.shape[2]:
                raise ValueError(f"LatentCache.update: new latents {tuple(c_kv.shape)} do not "
                                 f"continue "
                                 f"the cached {tuple(self.c_kv.shape)} (same B, d_latent)")
            c_kv, k_rope = torch.cat([self.c_kv, c_kv], 1), torch.cat([self.k_rope, k_rope], 1)
        self.c_kv, self.k_rope = c_kv, k_rope
        return c_kv, k_rope


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention with decoupled RoPE (DeepSeek-V2, section 2.1; chapter 12).

    Args:
        d_model, n_heads: model width and number of heads.
        d_latent: dim of the joint key/value latent c_KV (what is cached).
        d_rope: dim of the decoupled RoPE query/key parts (even; the key part is head-shared).
        d_head: per-head dim of the content queries, keys and values (default d_model // n_heads).
        d_q_latent: if given, queries are compressed too (``c_Q = h W^DQ``), as in DeepSeek-V2.
        absorb: default mode of :meth:`forward` (False: expand keys/values per head).
        rope_base: RoPE's base. backend: attention backend (``attnbook.attention``).
    """

    def __init__(self, d_model, n_heads, d_latent, d_rope, *, d_head=None, d_q_latent=None,
                 absorb=False, rope_base=10000.0, backend="auto", dtype=None, device=None):
        super().__init__()
        fn = "MultiHeadLatentAttention"
        d_model = check_int("d_model", d_model, fn=fn)
        n_heads = check_int("n_heads", n_heads, fn=fn)
        self.d_latent = check_int("d_latent", d_latent, fn=fn)
        self.d_rope = check_int("d_rope", d_rope, fn=fn, minimum=2)
        if self.d_rope % 2:
            raise ValueError(f"{fn}: `d_rope` must be even (RoPE rotates pairs), got {d_rope}")
        if d_head is None and d_model % n_heads:
            raise ValueError(f"{fn}: `d_model` = {d_model} is not divisible by `n_heads` = "
                             f"{n_heads}; "
                             f"pass d_head")
        self.d_head = d_model // n_heads if d_head is None else check_int("d_head", d_head, fn=fn)
        self.d_model, self.n_heads = d_model, n_heads
        self.absorb = check_bool("absorb", absorb, fn=fn)
        self.rope_base, self.backend = rope_base, backend
        kw = dict(bias=False, dtype=dtype, device=device)
        hd, hr = n_heads * self.d_head, n_heads * self.d_rope
        self.down_kv = nn.Linear(d_model, self.d_latent, **kw)      # W^DKV
        self.up_k = nn.Linear(self.d_latent, hd, **kw)              # W^UK
        self.up_v = nn.Linear(self.d_latent, hd, **kw)              # W^UV
        self.rope_k = nn.Linear(d_model, self.d_rope, **kw)         # W^KR (one key for all heads)
        if d_q_latent is None:
            self.down_q, d_q = None, d_model
        else:
            d_q = check_int("d_q_latent", d_q_latent, fn=fn)
            self.down_q = nn.Linear(d_model, d_q, **kw)             # W^DQ
        self.up_q = nn.Linear(d_q, hd, **kw)                        # W^UQ (or W^Q)
        self.rope_q = nn.Linear(d_q, hr, **kw)                      # W^QR
        self.out_proj = nn.Linear(hd, d_model, **kw)                # W^O

    def absorbed_weights(self):
        """``(W_q_lat (H, d_head, d_latent), W_o_lat (H, d_latent, d_model))``: ``W^UK_i^T`` that
        maps a head's content query into the latent space, and ``W^UV_i W^O_i``."""
        h, dh, dc = self.n_heads, self.d_head, self.d_latent
        w_uk = self.up_k.weight.view(h, dh, dc)                     # W^UK_i^T per head
        w_uv = self.up_v.weight.view(h, dh, dc).transpose(1, 2)     # W^UV_i (d_latent, d_head)
        w_o = self.out_proj.weight.t().reshape(h, dh, self.d_model)  # W^O_i (d_head, d_model)
        return w_uk, w_uv @ w_o

    def forward(self, x, *, causal=False, cache: LatentCache | None = None, absorb=None):
        """Attention of ``x`` ``(B, T, d_model)`` over itself and the cached positions.

        The T new tokens are the last T positions (after ``len(cache)`` cached ones);
        ``causal``: token i sees positions <= its own (bottom-right aligned with a cache).
        ``absorb``: None uses the module's mode. Returns ``(B, T, d_model)``.
        """
        absorb = _check_forward(self, x, causal, cache, absorb)
        b, t, _ = x.shape
        h, dh, dr = self.n_heads, self.d_head, self.d_rope
        past = 0 if cache is None else len(cache)
        pos = past + torch.arange(t, device=x.device)            # the new tokens' positions
        c_kv = self.down_kv(x)                                      # (B, T, d_latent)
        k_rope = apply_rope(self.rope_k(x), pos, base=self.rope_base)   # (B, T, d_rope)
        if cache is not None:
            c_kv, k_rope = cache.update(c_kv, k_rope)               # (B, Tk, .)
        hq = x if self.down_q is None else self.down_q(x)
        q_c = self.up_q(hq).view(b, t, h, dh).transpose(1, 2)      # (B, H, T, d_head)
        q_r = apply_rope(self.rope_q(hq).view(b, t, h, dr).transpose(1, 2), pos,
                         base=self.rope_base)                       # (B, H, T, d_rope)
        tk = c_kv.shape[1]
        mask = _bottom_right(t, tk, x.device) if causal and t != tk else None
        is_causal = causal and t == tk
        scale = 1.0 / math.sqrt(dh + dr)                         # the head's full key dim
        k_r = k_rope[:, None].expand(b, h, tk, dr)                  # shared by every head
        if absorb:
            w_q_lat, w_o_lat = self.absorbed_weights()
            q_lat = torch.einsum("bhtd,hdc->bhtc", q_c, w_q_lat)    # q^C_i W^UK_i^T
            c = c_kv[:, None].expand(b, h, tk, self.d_latent)       # (B, H, Tk, d_latent)
            o_lat = attention(torch.cat([q_lat, q_r], -1), torch.cat([c, k_r], -1), c,
                              mask=mask, causal=is_causal, scale=scale,
                              backend=self.backend)
            return torch.einsum("bhtc,hcm->btm", o_lat, w_o_lat)   # sum_i O_i W^UV_i W^O_i
        k_c = self.up_k(c_kv).view(b, tk, h, dh).transpose(1, 2)   # (B, H, Tk, d_head)
        v = self.up_v(c_kv).view(b, tk, h, dh).transpose(1, 2)     # (B, H, Tk, d_head)
        o = attention(torch.cat([q_c, q_r], -1), torch.cat([k_c, k_r], -1), v, mask=mask,
                      causal=is_causal, scale=scale, backend=self.backend)
        return self.out_proj(o.transpose(1, 2).reshape(b, t, h * dh))


def _bottom_right(tq, tk, device):
    """Query i (at position Tk - Tq + i) may see key j iff j <= Tk - Tq + i."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)


def _check_forward(m, x, causal, cache, absorb) -> bool:
    fn = "MultiHeadLatentAttention.forward"
    check_tensor("x", x, fn=fn, min_ndim=3)
    if x.ndim != 3 or x.shape[-1] != m.d_model:
        raise ValueError(f"{fn}: `x` must be (B, T, d_model = {m.d_model}), got {describe(x)}")
    if x.dtype != m.down_kv.weight.dtype:
        raise TypeError(f"{fn}: `x` must have the weights' dtype {m.down_kv.weight.dtype}, "
                        f"got {x.dtype}")
    check_bool("causal", causal, fn=fn)
    if cache is not None and not isinstance(cache, LatentCache):
        raise TypeError(f"{fn}: `cache` must be a LatentCache or None, got {type(cache).__name__}")
    return m.absorb if absorb is None else check_bool("absorb", absorb, fn=fn)
