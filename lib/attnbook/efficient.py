"""Efficient attention: linear attention and sparse attention patterns (chapter 09).

Linear attention swaps ``exp(q . k)`` for a kernel ``phi(q) . phi(k)`` so the sum over keys is
computed once (Katharopoulos et al. 2020). Sparse attention keeps the softmax but lets each query
see only a few keys (Child et al. 2019; Beltagy et al. 2020); information then needs several
layers to travel far, which ``receptive_field`` measures.

Denominator policy: ``eps`` defaults to 0, so the three linear-attention forms compute the
paper's formula exactly (the authors' fast-transformers code adds eps = 1e-6, which shrinks every
output slightly toward 0; pass ``eps=1e-6`` to reproduce it). A query that has at least one allowed key but a denominator
``phi(q_i)^T sum_j phi(k_j) + eps`` that is not finite and > 0 raises ``ValueError`` (it happens
with a feature map that can go negative, e.g. the identity); a query with no allowed key gets 0.
"""
from __future__ import annotations

import torch

from ._checks import (check_attention_args, check_bool, check_bool_mask, check_device, check_float, check_int,
                      check_tensor)

__all__ = [
    "elu_feature_map", "fixed_mask", "random_feature_map", "global_token_mask", "linear_attention",
    "linear_attention_denominator", "linear_attention_quadratic", "linear_attention_recurrent",
    "mask_nnz", "receptive_distance", "receptive_field", "sliding_window_mask",
    "sliding_window_nnz", "strided_mask", "strided_nnz",
]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """Non-negative feature map phi(x) = elu(x) + 1 (chapter 09; the map Katharopoulos et al. 2020 use).

    Evaluated as ``x + 1`` for x > 0 and ``exp(x)`` otherwise (the same function): ``elu(x) + 1``
    written literally rounds to exactly 0 for x below about -37 in float64 (-17 in float32).

    Args: x: floating tensor of any shape.  Returns: tensor of the same shape, > 0 where exp(x) > 0.
    """
    check_tensor("x", x, fn="elu_feature_map")
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))  # clamp: no inf in the unused branch


def random_feature_map(dim, features, *, seed=0, dtype=torch.float64):
    """Positive random features for the softmax kernel (Performer, Choromanski et al. 2021).

    ``phi(x) = exp(x' W^T - |x'|^2 / 2) / sqrt(m)`` with ``x' = x / dim**0.25`` and the rows of
    ``W (m, dim)`` drawn i.i.d. N(0, I): then ``E[phi(q) . phi(k)] = exp(q . k / sqrt(dim))``,
    the kernel of softmax attention (eq. eq-ch09-attn), so ``linear_attention(q, k, v,
    feature_map=random_feature_map(d, m))`` is an unbiased-kernel *approximation* of softmax
    attention whose error shrinks like ``1/sqrt(m)``. (``elu_feature_map`` approximates nothing:
    it defines a different model.) No stabiliser is subtracted: keep ``|x| / dim**0.25`` small
    enough that ``exp`` does not overflow.

    Args:
        dim: the head dim d of q and k.  features: m, the number of random features.
        seed: seed of the generator that draws W.  dtype: dtype of W.
    Returns: a function mapping ``(..., dim)`` to ``(..., features)``, every entry > 0.
    """
    dim = check_int("dim", dim, fn="random_feature_map")
    features = check_int("features", features, fn="random_feature_map")
    w = torch.randn(features, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)

    def phi(x):
        check_tensor("x", x, fn="random_feature_map")
        if x.shape[-1] != dim:
            raise ValueError(f"random_feature_map: `x` must have last dim {dim}, "
                             f"got shape {tuple(x.shape)}")
        x = x / dim ** 0.25
        proj = x @ w.to(x.device, x.dtype).T
        return torch.exp(proj - (x * x).sum(-1, keepdim=True) / 2) / features ** 0.5

    return phi


def _validate(fn, q, k, v, mask, causal, feature_map, eps) -> None:
    """Every argument check of the linear-attention functions (``v`` may be None)."""
    if v is None and fn != "linear_attention_denominator":
        raise TypeError(f"{fn}: `v` must be a torch.Tensor (..., Tk, Dv), got None")
    if v is None:  # the denominator needs no values: validate q, k with a stand-in
        check_tensor("k", k, fn=fn, min_ndim=2)
        v = k[..., :1]
    if mask is not None:
        check_bool_mask("mask", mask, fn=fn)
    check_attention_args(q, k, v, mask, fn=fn)
    check_bool("causal", causal, fn=fn)
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"{fn}: Tq and Tk must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    check_float("eps", eps, fn=fn, minimum=0.0)
    if not callable(feature_map):
        raise TypeError(f"{fn}: `feature_map` must be callable, got {type(feature_map).__name__}")


def _features(fn, q, k, feature_map):
    """phi(q), phi(k), checked to be ``(..., T, F)`` tensors of the inputs' dtype with one F."""
    phi_q, phi_k = feature_map(q), feature_map(k)
    for name, phi, x in (("phi(q)", phi_q, q), ("phi(k)", phi_k, k)):
        if not isinstance(phi, torch.Tensor) or phi.dtype != x.dtype:
            raise TypeError(f"{fn}: `feature_map` must return a tensor of dtype {x.dtype}, got {name} = {phi!r:.80}")
        if phi.shape[:-1] != x.shape[:-1] or phi.shape[-1] < 1:
            raise ValueError(f"{fn}: `feature_map` must map (..., T, D) to (..., T, F), got {name} "
                             f"{tuple(phi.shape)} from {tuple(x.shape)}")
    if phi_q.shape[-1] != phi_k.shape[-1]:
        raise ValueError(f"{fn}: phi(q) and phi(k) must share F, got {tuple(phi_q.shape)}, {tuple(phi_k.shape)}")
    return phi_q, phi_k


def _expand_mask(fn, mask, q, k, padding_only):
    """``mask`` as a key mask ``(..., Tk)`` (``padding_only``) or a full mask ``(..., Tq, Tk)``."""
    if mask is None:
        return None
    batch, tq, tk = q.shape[:-2], q.shape[-2], k.shape[-2]
    if padding_only:
        if mask.ndim >= 2 and mask.shape[-2] != 1:
            raise ValueError(f"{fn}: `mask` must be a key-padding mask broadcastable to (..., 1, Tk), got shape "
                             f"{tuple(mask.shape)}; use linear_attention_quadratic for a general (..., Tq, Tk) mask")
        return mask.expand(*batch, 1, tk)[..., 0, :]  # (..., Tk)
    return mask.expand(*batch, tq, tk)  # (..., Tq, Tk)


def _prepare(fn, q, k, v, mask, causal, feature_map, eps, padding_only):
    """Validate, apply phi, and shape the mask: what every linear-attention form starts with."""
    _validate(fn, q, k, v, mask, causal, feature_map, eps)
    phi_q, phi_k = _features(fn, q, k, feature_map)
    return phi_q, phi_k, _expand_mask(fn, mask, q, k, padding_only)


def _normalize(fn, num, den, has_key, eps):
    """out_i = num_i / (den_i + eps); raise on a bad denominator, 0 for rows without keys."""
    den = den + eps
    if has_key is None:
        has_key = torch.ones_like(den, dtype=torch.bool)
    bad = has_key & ~(torch.isfinite(den) & (den > 0))
    if bad.any():
        raise ValueError(
            f"{fn}: {int(bad.sum())} of {bad.numel()} denominators phi(q_i)^T sum_j phi(k_j) + eps are not "
            f"finite and > 0 (smallest {den[bad].min().item():.3g}); linear attention needs a feature map "
            f"with phi >= 0 and positive mass, such as elu_feature_map (see linear_attention_denominator)")
    return num / torch.where(has_key, den, torch.ones_like(den)).unsqueeze(-1)  # rows without keys: 0 / 1


def linear_attention_quadratic(q, k, v, *, mask=None, causal=False, feature_map=elu_feature_map, eps=0.0):
    """Linear attention in its quadratic kernel form, for checking (chapter 09).

    A = (phi(Q) phi(K)^T) * M,  out = A V / rowsum(A)   (M: 0/1 from ``mask`` and ``causal``).
    O(Tq Tk (F + Dv)) time and an explicit (Tq, Tk) matrix, like softmax attention without exp.

    Args:
        q: (..., Tq, D); k: (..., Tk, D); v: (..., Tk, Dv).
        mask: bool, True = may attend, broadcastable to (..., Tq, Tk).
        causal: forbid key j > query i (top-left aligned when Tq != Tk).
        feature_map: callable (..., T, D) -> (..., T, F), applied to q and k row by row.
        eps: added to every denominator (0: the exact formula; see the module docstring).
    Returns:
        (out, weights): (..., Tq, Dv) and (..., Tq, Tk); rows with no allowed key are 0.
    """
    fn = "linear_attention_quadratic"
    phi_q, phi_k, mask = _prepare(fn, q, k, v, mask, causal, feature_map, eps, padding_only=False)
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()  # j <= i
    if mask is not None:
        allowed = allowed & mask  # (..., Tq, Tk)
    scores = (phi_q @ phi_k.transpose(-2, -1)).masked_fill(~allowed, 0.0)  # A_ij = phi(q_i)^T phi(k_j)
    weights = _normalize(fn, scores, scores.sum(-1), allowed.any(-1), eps)  # (..., Tq, Tk)  A_ij / sum_j A_ij
    v = v.masked_fill(~allowed.any(-2).unsqueeze(-1), 0.0)  # a key no query sees: its NaN/inf stay out
    return weights @ v, weights  # (..., Tq, Dv)


def linear_attention(q, k, v, *, mask=None, causal=False, feature_map=elu_feature_map, eps=0.0):
    """Linear attention with a non-negative feature map (chapter 09, eq-ch09-linear; Katharopoulos et al. 2020).

    out_i = phi(q_i)^T S / (phi(q_i)^T z),  S = sum_j phi(k_j) v_j^T  (F, Dv),  z = sum_j phi(k_j)  (F,)
    Right-associated: O((Tq + Tk) F Dv) time instead of O(Tq Tk (F + Dv)). With ``causal`` the
    sums run over j <= i: S_i and z_i are prefix sums (cumsum), i.e. the state of an RNN; this
    vectorised version keeps all Tk prefix states (..., Tk, F, Dv), the loop in
    ``linear_attention_recurrent`` keeps one.
    There is no 1/sqrt(D) scale: the kernel phi(q)^T phi(k) replaces exp(q^T k / sqrt(D)).

    Args:
        q: (..., Tq, D); k: (..., Tk, D); v: (..., Tk, Dv).
        mask: bool key-padding mask (True = real key) broadcastable to (..., 1, Tk).
        causal: key j is used by query i only if j <= i (top-left aligned when Tq != Tk).
        feature_map: callable (..., T, D) -> (..., T, F), applied to q and k row by row.
        eps: added to every denominator (0: the exact formula; see the module docstring).
    Returns:
        out: (..., Tq, Dv); a query with no allowed key gets 0.
    """
    fn = "linear_attention"
    phi_q, phi_k, keep = _prepare(fn, q, k, v, mask, causal, feature_map, eps, padding_only=True)
    if keep is not None:  # a padded key contributes nothing to S or z (masked_fill: NaN/inf there too)
        phi_k, v = phi_k.masked_fill(~keep.unsqueeze(-1), 0.0), v.masked_fill(~keep.unsqueeze(-1), 0.0)
    has_key = None
    if not causal:
        s = phi_k.transpose(-2, -1) @ v  # (..., F, Dv)  S = phi(K)^T V
        z = phi_k.sum(-2, keepdim=True).transpose(-2, -1)  # (..., F, 1)  z = phi(K)^T 1
        num, den = phi_q @ s, (phi_q @ z).squeeze(-1)  # (..., Tq, Dv), (..., Tq)
        if keep is not None:
            has_key = keep.any(-1, keepdim=True).expand(den.shape)
    else:
        # query i reads the prefix state after key min(i, Tk - 1) (top-left aligned)
        idx = torch.arange(q.shape[-2], device=q.device).clamp(max=k.shape[-2] - 1)
        outer = phi_k.unsqueeze(-1) * v.unsqueeze(-2)  # (..., Tk, F, Dv)  phi(k_j) v_j^T
        s = torch.cumsum(outer, dim=-3)  # (..., Tk, F, Dv)  S_j = S_{j-1} + phi(k_j) v_j^T
        z = torch.cumsum(phi_k, dim=-2)  # (..., Tk, F)  z_j = z_{j-1} + phi(k_j)
        num = (phi_q.unsqueeze(-1) * s[..., idx, :, :]).sum(-2)  # (..., Tq, Dv)  phi(q_i)^T S_i
        den = (phi_q * z[..., idx, :]).sum(-1)  # (..., Tq)  phi(q_i)^T z_i
        if keep is not None:
            has_key = torch.cumsum(keep.long(), dim=-1)[..., idx] > 0
    return _normalize(fn, num, den, has_key, eps)


def linear_attention_recurrent(q, k, v, *, mask=None, causal=False,
                               feature_map=elu_feature_map, eps=0.0):
    """Linear attention as a loop over positions with an O(F Dv) state (chapter 09).

    The recurrence (eq-ch09-linear-rnn):
    S <- S + phi(k_j) v_j^T,  z <- z + phi(k_j),  out_i = phi(q_i)^T S / (phi(q_i)^T z).
    With ``causal`` the keys j <= i are added before query i reads the state (an RNN);
    without, all keys are added first. A Python loop: for teaching and checking, not
    speed.
    Same arguments and result as ``linear_attention``.
    """
    fn = "linear_attention_recurrent"
    phi_q, phi_k, keep = _prepare(fn, q, k, v, mask, causal, feature_map, eps,
                                  padding_only=True)
    tq, tk = q.shape[-2], k.shape[-2]
    # (..., F, Dv)  state S
    s = phi_q.new_zeros(*phi_q.shape[:-2], phi_q.shape[-1], v.shape[-1])
    z = phi_q.new_zeros(*phi_q.shape[:-2], phi_q.shape[-1])  # (..., F)  normaliser z
    # any real key added yet
    seen = torch.zeros(phi_q.shape[:-2], dtype=torch.bool, device=q.device)
    # a padded key contributes nothing to S or z (masked_fill: NaN/inf there too)
    if keep is not None:
        hidden = ~keep.unsqueeze(-1)
        phi_k, v = phi_k.masked_fill(hidden, 0.0), v.masked_fill(hidden, 0.0)
    nums, dens, has_key, j = [], [], [], 0
    for i in range(tq):
        while j < (min(i + 1, tk) if causal else tk):
            # S <- S + phi(k_j) v_j^T
            s = s + phi_k[..., j, :, None] * v[..., j, None, :]
            z = z + phi_k[..., j, :]  # z <- z + phi(k_j)
            seen = seen | (True if keep is None else keep[..., j])
            j += 1
        nums.append((phi_q[..., i, :, None] * s).sum(-2))  # phi(q_i)^T S
        dens.append((phi_q[..., i, :] * z).sum(-1))  # phi(q_i)^T z
        has_key.append(seen)
    # (..., Tq, Dv), (..., Tq)
    num, den = torch.stack(nums, dim=-2), torch.stack(dens, dim=-1)
    return _normalize(fn, num, den, torch.stack(has_key, dim=-1), eps)


def linear_attention_denominator(q, k, *, mask=None, causal=False, feature_map=elu_feature_map):
    """Denominators phi(q_i)^T sum_{j allowed} phi(k_j) of linear attention (chapter 09).

    Never raises on their sign: use it to see why a feature map fails (the identity map gives
    negative denominators). Args as in ``linear_attention_quadratic`` (mask: bool, broadcastable
    to (..., Tq, Tk)). Returns: (..., Tq); a query with no allowed key gets 0.
    """
    fn = "linear_attention_denominator"
    phi_q, phi_k, mask = _prepare(fn, q, k, None, mask, causal, feature_map, 0.0, padding_only=False)
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., Tq, Tk)
    if causal:
        scores = scores.tril()  # j <= i
    return (scores if mask is None else scores.masked_fill(~mask, 0.0)).sum(-1)  # (..., Tq)


# ---------------------------------------------------------------------------------------------
# Sparse attention patterns: bool (T, T) masks, True = may attend, usable as attention's `mask=`
# ---------------------------------------------------------------------------------------------

def _offsets(fn: str, t, device, causal) -> torch.Tensor:
    check_bool("causal", causal, fn=fn)
    check_device("device", device, fn=fn)
    t = check_int("t", t, fn=fn, minimum=1)
    pos = torch.arange(t, device=device)
    return pos[:, None] - pos[None, :]  # (t, t)  d_ij = i - j


def sliding_window_mask(t, window, *, causal=False, device=None) -> torch.Tensor:
    """Sliding-window (local) attention mask (chapter 09; Longformer, Beltagy et al. 2020).

    allowed(i, j) = |i - j| <= w, or 0 <= i - j <= w with ``causal``.

    Args: t: sequence length >= 1; window: w >= 0 (w = 0: each query sees only itself).
    Returns: bool (t, t).
    """
    w = check_int("window", window, fn="sliding_window_mask", minimum=0)
    d = _offsets("sliding_window_mask", t, device, causal)
    return (d >= 0) & (d <= w) if causal else d.abs() <= w


def strided_mask(t, stride, *, causal=True, device=None) -> torch.Tensor:
    """Strided sparse-attention mask of Child et al. 2019, both heads merged (chapter 09).

    allowed(i, j) = 0 <= i - j <= l  or  (j <= i and (i - j) mod l = 0), with l = stride: the
    union of the paper's two "strided" heads A(1) = {max(0, i - l), ..., i} and
    A(2) = {j : (i - j) mod l = 0}. Two stacked layers connect every j <= i. With
    ``causal=False`` the same rule is applied to |i - j| (a symmetric extension).

    Args: t: sequence length >= 1; stride: l >= 1 (l ~ sqrt(t) gives O(t sqrt(t)) entries).
    Returns: bool (t, t).
    """
    l = check_int("stride", stride, fn="strided_mask", minimum=1)
    d = _offsets("strided_mask", t, device, causal)
    a = d.abs()
    allowed = (a <= l) | (a % l == 0)
    return allowed & (d >= 0) if causal else allowed


def fixed_mask(t, block, *, summary=1, causal=True, device=None) -> torch.Tensor:
    """The "fixed" sparse-attention mask of Child et al. 2019, both heads merged (chapter 09).

    allowed(i, j) = floor(j / l) = floor(i / l)  or  j mod l >= l - c   (and j <= i with
    ``causal``), with l = block, c = summary: each query sees its own block and the last c
    "summary" positions of every block.

    Args: t: length >= 1; block: l >= 1; summary: c with 1 <= c <= l.  Returns: bool (t, t).
    """
    l = check_int("block", block, fn="fixed_mask", minimum=1)
    c = check_int("summary", summary, fn="fixed_mask", minimum=1)
    if c > l:
        raise ValueError(f"fixed_mask: `summary` must be <= block = {l}, got {c}")
    d = _offsets("fixed_mask", t, device, causal)
    pos = torch.arange(d.shape[0], device=device)
    allowed = ((pos[:, None] // l) == (pos[None, :] // l)) | (pos[None, :] % l >= l - c)
    return allowed & (d >= 0) if causal else allowed


def global_token_mask(t, global_tokens, *, base=None, device=None) -> torch.Tensor:
    """Global tokens (Longformer-style) OR-ed onto a base mask (chapter 09).

    allowed(i, j) = base(i, j) or i in G or j in G: a global token attends to every position and
    every position attends to it. Global columns ignore causality: meant for encoders.

    Args: t: length >= 1; global_tokens: positions in [0, t) (ints or a 1-D integer tensor);
        base: optional bool (t, t) mask, e.g. ``sliding_window_mask(t, w)`` (sets the device).
    Returns: bool (t, t).
    """
    fn = "global_token_mask"
    t = check_int("t", t, fn=fn, minimum=1)
    check_device("device", device, fn=fn)
    if base is not None:
        check_bool_mask("base", base, fn=fn, square=True)
        if base.shape[0] != t:
            raise ValueError(f"{fn}: `base` must have shape ({t}, {t}), got {tuple(base.shape)}")
        device = base.device
    if isinstance(global_tokens, torch.Tensor):
        if global_tokens.ndim != 1 or global_tokens.dtype.is_floating_point or global_tokens.dtype == torch.bool:
            raise TypeError(f"{fn}: `global_tokens` must be a 1-D integer tensor, got {global_tokens.dtype} "
                            f"{tuple(global_tokens.shape)}")
        global_tokens = global_tokens.tolist()
    try:
        tokens = [check_int("global_tokens[*]", g, fn=fn, minimum=0) for g in global_tokens]
    except TypeError as err:
        raise TypeError(f"{fn}: `global_tokens` must be a sequence of ints ({err})") from None
    if any(g >= t for g in tokens):
        raise ValueError(f"{fn}: `global_tokens` must lie in [0, {t}), got {tokens}")
    is_global = torch.zeros(t, dtype=torch.bool, device=device)
    is_global[tokens] = True
    mask = is_global[:, None] | is_global[None, :]  # (t, t)
    return mask if base is None else mask | base


def mask_nnz(mask) -> int:
    """Number of allowed (query, key) pairs: the cost of a sparse pattern (chapter 09)."""
    check_bool_mask("mask", mask, fn="mask_nnz")
    return int(mask.sum().item())


def sliding_window_nnz(t, window, *, causal=False) -> int:
    """Closed-form nnz of ``sliding_window_mask(t, w)`` (chapter 09).

    With w' = min(w, t - 1): t(2w' + 1) - w'(w' + 1), or t(w' + 1) - w'(w' + 1)/2 with ``causal``
    (a band of width 2w'+1 minus the two triangles cut off at the corners; w' = t - 1 gives t^2).
    """
    check_bool("causal", causal, fn="sliding_window_nnz")
    t = check_int("t", t, fn="sliding_window_nnz", minimum=1)
    w = min(check_int("window", window, fn="sliding_window_nnz", minimum=0), t - 1)
    return t * (w + 1) - w * (w + 1) // 2 if causal else t * (2 * w + 1) - w * (w + 1)


def strided_nnz(t, stride, *, causal=True) -> int:
    """Closed-form nnz of ``strided_mask(t, l)`` (chapter 09).

    Offset d = i - j occurs t - d times. Causal: the offsets 0..w' (w' = min(l, t - 1)) give
    t(w' + 1) - w'(w' + 1)/2, the multiples d = m l (2 <= m <= M, M = floor((t - 1)/l)) add
    (M - 1) t - l (M(M + 1)/2 - 1). Non-causal: each d > 0 counts twice, 2 nnz_causal - t.
    """
    check_bool("causal", causal, fn="strided_nnz")
    t = check_int("t", t, fn="strided_nnz", minimum=1)
    l = check_int("stride", stride, fn="strided_nnz", minimum=1)
    w, m = min(l, t - 1), (t - 1) // l
    nnz = t * (w + 1) - w * (w + 1) // 2
    if m >= 2:
        nnz += (m - 1) * t - l * (m * (m + 1) // 2 - 1)
    return nnz if causal else 2 * nnz - t


def receptive_field(mask, layers) -> torch.Tensor:
    """Which inputs each position can depend on after L stacked masked layers (chapter 09).

    R_L = (M or I)^L as a Boolean matrix power: R_L[i, j] is True iff information at position j
    can reach query i in L layers; I (the residual path) keeps each position's own information.

    Args: mask: bool (T, T), True = may attend; layers: L >= 0 (L = 0 gives I).
    Returns: bool (T, T).
    """
    check_bool_mask("mask", mask, fn="receptive_field", square=True)
    layers = check_int("layers", layers, fn="receptive_field", minimum=0)
    eye = torch.eye(mask.shape[0], dtype=torch.bool, device=mask.device)
    step = (mask | eye).float()
    reach = eye
    for _ in range(layers):
        grown = (reach.float() @ step) > 0  # R_l = R_{l-1} (M or I), counts <= T are exact in float32
        if torch.equal(grown, reach):  # a fixed point: more layers reach nothing new
            break
        reach = grown
    return reach


def receptive_distance(mask, layers) -> torch.Tensor:
    """Largest |i - j| that query i can reach after L layers (chapter 09).

    max_j {|i - j| : R_L[i, j]}; a sliding window w gives min(L w, max(i, T - 1 - i)), or
    min(L w, i) when causal.
    Args: as ``receptive_field``.  Returns: int64 (T,); ``.max()`` is the whole pattern's reach.
    """
    reach = receptive_field(mask, layers)
    pos = torch.arange(mask.shape[0], device=mask.device)
    dist = (pos[:, None] - pos[None, :]).abs()  # (T, T)  |i - j|
    return torch.where(reach, dist, torch.zeros_like(dist)).amax(dim=-1)
