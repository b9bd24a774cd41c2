"""Multi-head attention, and exact weight loading from ``torch.nn.MultiheadAttention`` (chapter 05).

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with
``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``. The h per-head matrices ``W_i^Q`` are the
column blocks of one ``d_model x d_model`` matrix ``W^Q`` (row-vector convention, ``Q = X W^Q``;
``nn.Linear.weight`` stores ``W^Q.T``), so one ``nn.Linear`` per role projects every head at once
and ``split_heads`` cuts the result into ``(B, H, T, d_k)``. Every head then runs through
``attnbook.attention``, so any backend can be switched in.

Conventions (appendix "记号与约定"): inputs are batch-first ``(B, T, d_model)``; boolean masks
use True = may attend and broadcast to ``(B, H, Tq, Tk)``. ``nn.MultiheadAttention`` uses the
opposite polarity (True = may NOT attend) and packs per-head masks as ``(B*H, Tq, Tk)``;
:func:`mask_from_torch` is the one place where its masks are converted.

Grouped-query attention (``n_kv_heads < n_heads``; Ainslie et al. 2023) and multi-query
attention (``n_kv_heads = 1``; Shazeer 2019) share each key/value head among
``n_heads // n_kv_heads`` query heads.

``MultiHeadAttention.forward`` is two public steps, the one path every attention module of the
library takes: ``project`` (``Q = query W^Q``, ``K``, ``V``, cut into heads) and ``attend``
(each head through ``attnbook.attention``, then ``Concat(...) W^O``). The cached, rotary variant
of chapter 10 (``cache.CachedAttention``) overrides ``project`` only.

``causal`` names its alignment when ``Tq != Tk`` (``reference.CAUSAL_ALIGNMENTS``): ``True`` is
``"top_left"`` here (query i sees keys j <= i, as SDPA's ``is_causal``), and
``"bottom_right"`` (j <= i + Tk - Tq, the queries are the last Tq positions) is accepted too;
``CachedAttention``'s ``True`` is ``"bottom_right"``.

Empty inputs give empty outputs, as in ``nn.MultiheadAttention``: batch 0 or Tq = 0 give an
empty ``out``; Tk = 0 leaves every query without a key, so its heads are zero (``out`` is
``out_proj``'s bias). The argument checks sit at the end of the module, out of the code the
book shows.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ._checks import check_bool, check_choice, check_device, check_dtype, check_int, check_tensor, describe
from .dispatch import BACKENDS, attention
from .reference import attention_ref, causal_alignment, fold_causal, mask_to_additive

__all__ = ["MultiHeadAttention", "MultiHeadOutput", "mask_from_torch", "merge_heads", "repeat_kv",
           "split_heads"]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Cut the last dim into ``n_heads`` blocks of ``d_k`` (chapter 05, step 1).

    Block i of the features is head i: ``x[..., i*d_k:(i+1)*d_k]`` becomes
    ``out[:, i]``. Args: x ``(B, T, n_heads * d_k)``.  Returns ``(B, n_heads, T, d_k)``
    (a view when possible).
    """
    _check_split_heads(x, n_heads)
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, H, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Concat(head_1, ..., head_h) along the features (chapter 05, step 2).

    Args: x ``(B, H, T, d_v)``.  Returns ``(B, T, H * d_v)`` whose block i is head i.
    """
    _check_4d("x", x, "merge_heads", "(B, H, T, d_v)")
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)  # (B, T, H * d_v)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Share each key/value head among ``n_rep`` consecutive query heads (chapter 05).

    This is grouped-query (GQA) and multi-query (MQA) attention.

    Query head i reads key/value head ``i // n_rep``.
    Args: x ``(B, H_kv, T, D)``.  Returns ``(B, H_kv * n_rep, T, D)``.
    """
    _check_4d("x", x, "repeat_kv", "(B, H_kv, T, D)")
    n_rep = check_int("n_rep", n_rep, fn="repeat_kv")
    if n_rep == 1:
        return x
    b, h_kv, t, d = x.shape
    return x[:, :, None].expand(b, h_kv, n_rep, t, d).reshape(b, h_kv * n_rep, t, d)


def mask_from_torch(attn_mask=None, key_padding_mask=None, *,
                    n_heads: int | None = None):
    """Convert ``nn.MultiheadAttention``'s masks to this library's mask (chapter 05).

    The one place where the opposite polarity is handled: in ``nn.MultiheadAttention`` a
    bool True means "may NOT attend" (in ``attn_mask``) and "is padding" (in
    ``key_padding_mask``); here True means "may attend". Float masks are additive in
    both and pass through unchanged.

    Args:
        attn_mask: ``(Tq, Tk)``, or ``(B * n_heads, Tq, Tk)`` with one mask per batch
            element and head (torch's layout, index ``b * n_heads + h``); bool or float.
        key_padding_mask: ``(B, Tk)`` (or ``(Tk,)``), bool (True = padding) or float.
        n_heads: needed only for a 3-D ``attn_mask``.
    Returns:
        None when both are None; a bool mask (True = may attend) when every given mask
        is bool; otherwise an additive float mask (0 / -inf from the bool ones, summed
        as torch does).
        It broadcasts to ``(B, H, Tq, Tk)``.
    """
    _check_mask_from_torch(attn_mask, key_padding_mask, n_heads)
    masks = []
    if attn_mask is not None:
        if attn_mask.ndim == 3:  # (B * H, Tq, Tk): row b * H + h
            bh, tq, tk = attn_mask.shape
            # (B, H, Tq, Tk)
            attn_mask = attn_mask.reshape(bh // n_heads, n_heads, tq, tk)
        masks.append(~attn_mask if attn_mask.dtype == torch.bool else attn_mask)
    if key_padding_mask is not None:
        kpm = key_padding_mask
        kpm = kpm[:, None, None, :] if kpm.ndim == 2 else kpm      # (B, 1, 1, Tk)
        masks.append(~kpm if kpm.dtype == torch.bool else kpm)
    if not masks:
        return None
    if all(m.dtype == torch.bool for m in masks):
        return masks[0] if len(masks) == 1 else masks[0] & masks[1]
    dtype = next(m.dtype for m in masks if m.dtype != torch.bool)
    additive = [mask_to_additive(m, dtype) for m in masks]
    return additive[0] if len(additive) == 1 else additive[0] + additive[1]


class MultiHeadOutput(NamedTuple):
    """What :class:`MultiHeadAttention` returns; read it by name (``res.out``, ``res.weights``).

    Fields:
        out: ``(B, Tq, d_model)``.
        weights: per-head attention weights ``(B, H, Tq, Tk)`` (never averaged over heads) when
            called with ``need_weights=True``; otherwise None.
    """

    out: torch.Tensor
    weights: torch.Tensor | None


class MultiHeadAttention(nn.Module):
    """Multi-head attention (chapter 05, eq-ch05-multihead): ``Concat(head_1..head_h) W^O``.

    ``head_i = Attention(query W_i^Q, key W_i^K, value W_i^V)`` with ``d_k = d_v = d_model / h``;
    ``W^Q = q_proj.weight.T`` and ``W_i^Q`` is its i-th block of ``d_k`` columns (the same for
    K, V); ``W^O = out_proj.weight.T`` and ``W_i^O`` is its i-th block of ``d_k`` rows.
    Parameters: ``4 d_model^2`` weights (+ ``4 d_model`` biases) for every h when
    ``kdim = vdim = d_model`` and ``n_kv_heads = n_heads``.

    ``causal=True`` is top-left aligned (``causal_default``); see :meth:`forward`.

    Initialisation: ``xavier_uniform_`` for each of q/k/v_proj and zero biases (what
    ``nn.MultiheadAttention`` does when kdim/vdim differ from d_model), ``out_proj`` as
    ``nn.Linear`` with a zero bias. No dropout: equal to ``nn.MultiheadAttention`` in eval mode.

    Args:
        d_model: model width; n_heads must divide it.
        n_heads: number of query heads h.
        bias: biases on the four projections.
        kdim, vdim: feature sizes of ``key`` and ``value`` (default d_model).
        backend: the :func:`attnbook.attention` backend used when ``need_weights`` is False.
        n_kv_heads: number of key/value heads (default n_heads; must divide n_heads): grouped-query
            attention, or multi-query attention with 1.
        device, dtype: of the parameters, as for ``nn.Linear`` (a floating dtype); inputs must
            match them.
    """

    causal_default = "top_left"   # what causal=True means in forward (reference.CAUSAL_ALIGNMENTS)

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True, kdim: int | None = None,
                 vdim: int | None = None, backend: str = "auto", n_kv_heads: int | None = None,
                 device=None, dtype=None):
        fn = type(self).__name__
        d_model = check_int("d_model", d_model, fn=fn)
        n_heads = check_int("n_heads", n_heads, fn=fn)
        if d_model % n_heads:
            raise ValueError(f"{fn}: `n_heads` must divide `d_model`, got d_model={d_model}, n_heads={n_heads}")
        n_kv_heads = n_heads if n_kv_heads is None else check_int("n_kv_heads", n_kv_heads, fn=fn)
        if n_heads % n_kv_heads:
            raise ValueError(f"{fn}: `n_kv_heads` must divide `n_heads`, got n_heads={n_heads}, "
                             f"n_kv_heads={n_kv_heads}")
        bias = check_bool("bias", bias, fn=fn)
        check_dtype("dtype", dtype, fn=fn)
        check_device("device", device, fn=fn)
        super().__init__()
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_k = d_model // n_heads  # per-head width; d_v = d_k
        self.kdim = d_model if kdim is None else check_int("kdim", kdim, fn=fn)
        self.vdim = d_model if vdim is None else check_int("vdim", vdim, fn=fn)
        self.backend = backend
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(d_model, d_model, **kw)                 # W^Q = q_proj.weight.T
        self.k_proj = nn.Linear(self.kdim, n_kv_heads * self.d_k, **kw)  # W^K
        self.v_proj = nn.Linear(self.vdim, n_kv_heads * self.d_k, **kw)  # W^V
        self.out_proj = nn.Linear(d_model, d_model, **kw)                # W^O
        with torch.no_grad():
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                nn.init.xavier_uniform_(proj.weight)
            for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
                if proj.bias is not None:
                    proj.bias.zero_()

    @property
    def backend(self) -> str:
        """The attention backend: ``"auto"`` or a name in ``attnbook.BACKENDS``; may be reassigned."""
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = check_choice("backend", value, ("auto", *BACKENDS), fn=type(self).__name__)

    def extra_repr(self) -> str:
        kv = "" if self.n_kv_heads == self.n_heads else f", n_kv_heads={self.n_kv_heads}"
        return f"d_model={self.d_model}, n_heads={self.n_heads}{kv}, d_k={self.d_k}, backend={self.backend!r}"

    def forward(self, query, key=None, value=None, *, mask=None, causal=False,
                need_weights=False, head_mask=None) -> MultiHeadOutput:
        """Multi-head attention of ``query`` over ``key``/``value`` (chapter 05).

        Args:
            query: ``(B, Tq, d_model)``.
            key: ``(B, Tk, kdim)``, default ``query`` (self-attention).
            value: ``(B, Tk, vdim)``, default ``key``.
            mask: bool (True = may attend) or additive float, broadcastable to
                ``(B, H, Tq, Tk)``; a key-padding mask is
                ``attnbook.padding_mask(lengths, Tk)``, shape ``(B, 1, 1, Tk)``. Masks
                written for ``nn.MultiheadAttention`` go through
                :func:`mask_from_torch`.
            causal: ``False``; ``True`` or ``"top_left"``: query i may attend key j only
                if j <= i; ``"bottom_right"``: only if j <= i + (Tk - Tq) (the queries are
                the last Tq positions). The two agree when Tq = Tk.
            need_weights: also return the per-head weights; computed with ``attention_ref``
                (the backend is then not used).
            head_mask: ``(H,)`` factors multiplying each head's output before ``W^O`` (0
                removes a head: head ablation, Michel et al. 2019).
        Returns:
            ``MultiHeadOutput(out, weights)``: ``out`` ``(B, Tq, d_model)``; ``weights``
            ``(B, H, Tq, Tk)`` or None. A query row with no allowed key gets zero head
            outputs (so ``out`` is ``out_proj``'s bias there) and zero weights.
        """
        key = query if key is None else key
        value = key if value is None else value
        align = _check_forward(self, query, key, value, mask, causal, need_weights,
                               head_mask)
        q, k, v = self.project(query, key, value)
        mask, causal = fold_causal(mask, align, q.shape[2], k.shape[2], device=q.device)
        return self.attend(q, k, v, mask, causal, need_weights, head_mask)

    def project(self, query, key, value):
        """Step 1: ``Q = query W^Q``, ``K = key W^K``, ``V = value W^V``, cut into heads."""
        q = split_heads(self.q_proj(query), self.n_heads)       # (B, H, Tq, d_k)
        k = split_heads(self.k_proj(key), self.n_kv_heads)      # (B, H_kv, Tk, d_k)
        v = split_heads(self.v_proj(value), self.n_kv_heads)    # (B, H_kv, Tk, d_k)
        return q, k, v

    def attend(self, q, k, v, mask, causal, need_weights, head_mask) -> MultiHeadOutput:
        """Step 2: every ``head_i = Attention(Q_i, K_i, V_i)``, then ``Concat(...) W^O``."""
        group = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, group), repeat_kv(v, group)  # (B, H, Tk, d_k): GQA shares
        if need_weights:
            res = attention_ref(q, k, v, mask=mask, causal=causal)
            heads, weights = res.out, res.weights  # (B, H, Tq, d_k), (B, H, Tq, Tk)
        else:
            heads = attention(q, k, v, mask=mask, causal=causal, backend=self.backend)
            weights = None
        if head_mask is not None:
            heads = heads * head_mask.to(heads.dtype)[:, None, None]   # zero = ablated head
        # (B, Tq, d_model)
        return MultiHeadOutput(self.out_proj(merge_heads(heads)), weights)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *, backend: str = "auto") -> MultiHeadAttention:
        """A ``MultiHeadAttention`` with the weights of ``mha`` (same dtype and device).

        Loads the packed ``in_proj_weight`` (rows ``[W^Q; W^K; W^V]^T``) or, when kdim/vdim differ
        from embed_dim, ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``; ``in_proj_bias``
        and ``out_proj``. The result equals ``mha`` in eval mode (``mha.dropout`` is not applied),
        batch first, with masks converted by :func:`mask_from_torch`.
        Raises ValueError for ``add_bias_kv`` / ``add_zero_attn``, which have no counterpart here.
        """
        fn = f"{cls.__name__}.from_torch"
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"{fn}: `mha` must be a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(f"{fn}: add_bias_kv and add_zero_attn are not supported, got "
                             f"add_bias_kv={mha.bias_k is not None}, add_zero_attn={mha.add_zero_attn}")
        w_out = mha.out_proj.weight
        new = cls(mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None, kdim=mha.kdim,
                  vdim=mha.vdim, backend=backend, device=w_out.device, dtype=w_out.dtype)
        if mha.in_proj_weight is not None:
            weights = mha.in_proj_weight.chunk(3)                               # 3 x (E, E)
        else:
            weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        with torch.no_grad():
            for proj, w in zip((new.q_proj, new.k_proj, new.v_proj), weights):
                proj.weight.copy_(w)
            new.out_proj.weight.copy_(w_out)
            if mha.in_proj_bias is not None:
                for proj, b in zip((new.q_proj, new.k_proj, new.v_proj), mha.in_proj_bias.chunk(3)):
                    proj.bias.copy_(b)
                new.out_proj.bias.copy_(mha.out_proj.bias)
        return new


# ---------------------------------------------------------------------------------------------
# Argument checks (kept out of the functions the book shows)
# ---------------------------------------------------------------------------------------------

def _check_split_heads(x, n_heads) -> None:
    check_tensor("x", x, fn="split_heads", min_ndim=3)
    n_heads = check_int("n_heads", n_heads, fn="split_heads")
    if x.ndim != 3 or x.shape[-1] % n_heads:
        raise ValueError(f"split_heads: `x` must be (B, T, n_heads * d_k) with n_heads = {n_heads}, "
                         f"got {describe(x)}")


def _check_4d(name, x, fn, layout) -> None:
    check_tensor(name, x, fn=fn, min_ndim=4)
    if x.ndim != 4:
        raise ValueError(f"{fn}: `{name}` must be {layout}, got {describe(x)}")


def _check_mask_tensor(name, m, fn, min_ndim=1) -> None:
    """``m``: a bool (True/False) or floating (additive) tensor."""
    check_tensor(name, m, fn=fn, min_ndim=min_ndim, floating=False)
    if m.dtype != torch.bool and not m.dtype.is_floating_point:
        raise TypeError(f"{fn}: `{name}` must be bool or floating, got {describe(m)}")


def _check_mask_from_torch(attn_mask, key_padding_mask, n_heads) -> None:
    fn = "mask_from_torch"
    if attn_mask is not None:
        _check_mask_tensor("attn_mask", attn_mask, fn, min_ndim=2)
        if attn_mask.ndim == 3:
            if n_heads is None:
                raise ValueError(f"{fn}: a 3-D `attn_mask` is (B * n_heads, Tq, Tk); pass `n_heads`, "
                                 f"got {describe(attn_mask)}")
            n_heads = check_int("n_heads", n_heads, fn=fn)
            if attn_mask.shape[0] % n_heads:
                raise ValueError(f"{fn}: `attn_mask` dim 0 must be B * n_heads (n_heads = {n_heads}), "
                                 f"got {describe(attn_mask)}")
        elif attn_mask.ndim != 2:
            raise ValueError(f"{fn}: `attn_mask` must be (Tq, Tk) or (B * n_heads, Tq, Tk), "
                             f"got {describe(attn_mask)}")
    if key_padding_mask is not None:
        _check_mask_tensor("key_padding_mask", key_padding_mask, fn)
        if key_padding_mask.ndim > 2:
            raise ValueError(f"{fn}: `key_padding_mask` must be (B, Tk) or (Tk,), "
                             f"got {describe(key_padding_mask)}")
    if attn_mask is not None and key_padding_mask is not None:
        kpm = key_padding_mask
        a = attn_mask.shape if attn_mask.ndim == 2 else (attn_mask.shape[0] // n_heads, 1, *attn_mask.shape[1:])
        k = (kpm.shape[0], 1, 1, kpm.shape[1]) if kpm.ndim == 2 else tuple(kpm.shape)
        try:
            torch.broadcast_shapes(a, k)
        except RuntimeError:
            raise ValueError(f"{fn}: `attn_mask` {tuple(attn_mask.shape)} and `key_padding_mask` "
                             f"{tuple(kpm.shape)} disagree on B or Tk") from None


def _check_mask(mask, target, fn, hint="a key-padding mask is (B, 1, 1, Tk), see attnbook.padding_mask"):
    """``mask``: None, or bool / additive float broadcastable to ``target`` = (B, H, Tq, Tk)."""
    if mask is None:
        return
    _check_mask_tensor("mask", mask, fn, min_ndim=0)
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{fn}: `mask` of shape {tuple(mask.shape)} does not broadcast to "
                         f"(B, H, Tq, Tk) = {target}; {hint}")


def _check_inputs(m: MultiHeadAttention, query, key, value, head_mask, fn) -> None:
    """query ``(B, Tq, d_model)``, key ``(B, Tk, kdim)``, value ``(B, Tk, vdim)`` in the module's
    dtype and device; ``head_mask`` None or ``(H,)``."""
    weight = m.q_proj.weight
    for name, t, width in (("query", query, m.d_model), ("key", key, m.kdim), ("value", value, m.vdim)):
        check_tensor(name, t, fn=fn)
        if t.ndim != 3 or t.shape[-1] != width:
            raise ValueError(f"{fn}: `{name}` must be (B, T, {width}) (batch first), got {describe(t)}")
        if t.dtype != weight.dtype or t.device != weight.device:
            raise TypeError(f"{fn}: `{name}` must have the module's dtype and device "
                            f"({weight.dtype}, {weight.device}), got {describe(t)}")
    if not (query.shape[0] == key.shape[0] == value.shape[0]) or key.shape[1] != value.shape[1]:
        raise ValueError(f"{fn}: `query`, `key`, `value` must share B, and `key`, `value` must share Tk; got "
                         f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    if head_mask is not None:
        _check_mask_tensor("head_mask", head_mask, fn)
        if head_mask.shape != (m.n_heads,):
            raise ValueError(f"{fn}: `head_mask` must have shape (n_heads,) = ({m.n_heads},), "
                             f"got {describe(head_mask)}")
        if head_mask.device != weight.device:
            raise ValueError(f"{fn}: `head_mask` is on {head_mask.device} but the module is on {weight.device}")


def _check_forward(m, query, key, value, mask, causal, need_weights, head_mask) -> str | None:
    """Validate :meth:`MultiHeadAttention.forward`'s arguments; return the causal alignment."""
    fn = f"{type(m).__name__}.forward"
    _check_inputs(m, query, key, value, head_mask, fn)
    _check_mask(mask, (query.shape[0], m.n_heads, query.shape[1], key.shape[1]), fn)
    check_bool("need_weights", need_weights, fn=fn)
    return causal_alignment(causal, default=m.causal_default, fn=fn)
