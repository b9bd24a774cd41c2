"""Positional encodings: sinusoidal, its rotation matrices, RoPE and ALiBi (chapter 06).

Self-attention without positions is permutation *equivariant*; these are the three ways the book
gives it a sense of order:

- ``sinusoidal_encoding``: Vaswani et al.'s table ``PE`` added to the token embeddings, laid
  out interleaved (even dims sin, odd dims cos); ``rotation_matrix(k)`` is the block-diagonal
  ``M_k`` with ``PE[p + k] = PE[p] @ M_k`` (row-vector convention);
- ``apply_rope``: RoFormer's rotary embedding, applied to queries and keys (never values), in
  RoFormer's adjacent-pair layout or the half-split ``rotate_half`` layout (GPT-NeoX,
  Hugging Face's LLaMA; Meta's original LLaMA code pairs adjacent features);
- ``alibi_slopes`` / ``alibi_bias``: Press et al.'s linear biases, an additive float mask for
  :func:`attnbook.attention` (top-left or bottom-right aligned: ``align``);
- ``t5_bucket``: T5's relative-position buckets (one learned bias per bucket and head).

The sinusoidal table, its rotations and RoPE share the frequency ladder
``omega_i = base ** (-2 i / d)``, ``i = 0 .. d/2 - 1`` (``frequencies``). ALiBi has no ladder: its
per-head slopes are, for H heads with H a power of two, the geometric sequence ``2 ** (-8 h / H)``,
h = 1 .. H (``alibi_slopes``), and it biases scores by distance instead of rotating or adding
vectors. Angles ``p * omega_i`` are computed in float64 and only the final sin / cos are cast to the
requested dtype: in float32 the product ``p * omega_i`` itself is rounded by up to ``p * 2**-24``
(about 1e-4 rad at p = 2048), which is the error a float32 implementation sees otherwise.
"""
from __future__ import annotations

import math

import torch

from ._checks import (check_bool, check_choice, check_device, check_dtype, check_even_dim, check_float,
                      check_int, check_tensor)

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "frequencies",
    "half_split_permutation",
    "rotation_matrix",
    "sinusoidal_encoding",
    "t5_bucket",
]

PAIRINGS = ("interleaved", "half")


def _check_ladder(fn: str, d_model, base, dtype=None, device=None) -> tuple[int, float, torch.dtype]:
    """The arguments every function of the frequency ladder takes: even d_model, base > 0, dtype, device."""
    check_device("device", device, fn=fn)
    return (check_even_dim("d_model", d_model, fn=fn),
            check_float("base", base, fn=fn, minimum=0.0, inclusive=False),
            check_dtype("dtype", dtype, fn=fn))


def frequencies(d_model: int, *, base: float = 10000.0, device=None) -> torch.Tensor:
    """The frequency ladder ``omega_i = base ** (-2 i / d_model)`` (chapter 06).

    From eq-ch06-sinusoid.

    Args: d_model (even), base (> 0; 10000 in Vaswani et al. and RoFormer).
    Returns a float64 tensor ``(d_model / 2,)``, from ``omega_0 = 1`` down to
    ``base ** (-(d-2)/d)``.
    """
    d_model, base, _ = _check_ladder("frequencies", d_model, base, device=device)
    i = torch.arange(d_model // 2, dtype=torch.float64, device=device)
    return base ** (-2.0 * i / d_model)  # (d/2,)


def sinusoidal_encoding(n_positions: int, d_model: int, *, base: float = 10000.0,
                        dtype=None, device=None) -> torch.Tensor:
    """Sinusoidal positional encoding (chapter 06, eq-ch06-sinusoid).

    From Vaswani et al. 2017, section 3.5.

    ``PE[p, 2i] = sin(p * omega_i)``, ``PE[p, 2i + 1] = cos(p * omega_i)``, interleaved
    as in the paper (some codebases concatenate ``[sin | cos]`` halves instead: a fixed
    permutation).

    Args:
        n_positions: number of positions ``p = 0 .. n_positions - 1`` (>= 1).
        d_model: width of the encoding (even).
        base: the ladder's base (> 0).
        dtype: output dtype (default ``torch.get_default_dtype()``); angles are computed
            in float64.
    Returns:
        ``(n_positions, d_model)``; row p is the (row) vector ``PE(p)``, added to token
        embeddings.
    """
    n_positions = check_int("n_positions", n_positions, fn="sinusoidal_encoding")
    d_model, base, dtype = _check_ladder("sinusoidal_encoding", d_model, base, dtype,
                                         device)
    omega = frequencies(d_model, base=base, device=device)  # (d/2,)
    positions = torch.arange(n_positions, dtype=torch.float64, device=device)
    angle = positions[:, None] * omega  # (P, d/2)
    # (P, d/2, 2): (sin, cos) pairs
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1)
    # (P, d): even dims sin, odd dims cos
    return pe.reshape(n_positions, d_model).to(dtype)


def rotation_matrix(k: float, d_model: int, *, base: float = 10000.0, dtype=None,
                    device=None) -> torch.Tensor:
    """The block-diagonal ``M_k`` with ``PE(p + k) = PE(p) M_k`` for all p (chapter 06).

    This is eq-ch06-rotation.

    Each 2x2 block acts on the pair ``(sin, cos)`` of frequency ``omega_i``; in the
    row-vector convention it is ``[[cos k w, -sin k w], [sin k w, cos k w]]``, the
    transpose of the seed's column form ``[[cos, sin], [-sin, cos]]``. It depends on the
    offset k only, never on p.

    Args: k: the offset (any finite real, negative allowed); d_model (even); base;
    dtype. Returns: ``(d_model, d_model)``, orthogonal, ``M_j @ M_k = M_{j + k}``.
    """
    k = check_float("k", k, fn="rotation_matrix")
    d_model, base, dtype = _check_ladder("rotation_matrix", d_model, base, dtype,
                                         device)
    angle = k * frequencies(d_model, base=base, device=device)  # (d/2,)
    c, s = angle.cos(), angle.sin()
    # (d/2, 2, 2)
    blocks = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)
    return torch.block_diag(*blocks).to(dtype)  # (d, d)


def half_split_permutation(d_model: int) -> torch.Tensor:
    """Indices ``perm`` that take the interleaved layout to the half-split one (chapter 06).

    ``x[..., perm]`` lists the first member of every pair, then the second member:
    ``[0, 2, 4, ..., 1, 3, 5, ...]``. With it,
    ``apply_rope(x[..., perm], pairing="half") == apply_rope(x, pairing="interleaved")[..., perm]``.
    """
    d_model = check_even_dim("d_model", d_model, fn="half_split_permutation")
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def apply_rope(x: torch.Tensor, positions=None, *, base: float = 10000.0,
               pairing: str = "interleaved") -> torch.Tensor:
    """Rotary position embedding (chapter 06, eq-ch06-rope).

    From Su et al. 2021, RoFormer, section 3.

    Rotates each pair of features of the vector at position m by the angle
    ``m * omega_i``: ``(a, b) -> (a cos - b sin, a sin + b cos)``. Applied to queries
    and keys after their projection (per head), never to values; then ``<R_m q, R_n k>``
    depends on m and n only through ``m - n``.

    Args:
        x: ``(..., T, D)`` floating, D even (e.g. ``(B, H, T, D)`` queries or keys).
        positions: the position of each of the T rows, a tensor broadcastable to
            ``(..., T)`` (finite integers or floats, on x's device); default
            ``0 .. T - 1``.
        base: the ladder's base (10000 in RoFormer; larger in some long-context models).
        pairing: ``"interleaved"`` rotates ``(x_0, x_1), (x_2, x_3), ...`` (RoFormer);
            ``"half"`` rotates ``(x_i, x_{i + D/2})`` (``rotate_half`` in GPT-NeoX and
            in Hugging Face's LLaMA).
    Returns:
        A tensor like ``x``; norms are preserved. Angles are computed in float64, then
        cast.
    """
    positions = _resolve_rope_args(x, positions, base, pairing)  # None -> 0 .. T - 1
    d = x.shape[-1]
    omega = frequencies(d, base=base, device=x.device)  # (D/2,)
    angle = positions.to(torch.float64)[..., None] * omega  # (..., T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if pairing == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each: pairs (2i, 2i + 1)
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2:]  # pairs (i, i + D/2)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _resolve_rope_args(x, positions, base, pairing) -> torch.Tensor:
    """Check ``apply_rope``'s arguments and resolve ``positions`` (``0 .. T - 1`` for None)."""
    fn = "apply_rope"
    check_tensor("x", x, fn=fn, min_ndim=2)
    check_float("base", base, fn=fn, minimum=0.0, inclusive=False)
    check_choice("pairing", pairing, PAIRINGS, fn=fn)
    if x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"{fn}: the feature dim D of `x` must be even and >= 2 (features are rotated in "
                         f"pairs), got D = {x.shape[-1]} in shape {tuple(x.shape)}")
    if positions is None:
        return torch.arange(x.shape[-2], device=x.device)
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"{fn}: `positions` must be a tensor or None, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"{fn}: `positions` must hold real numbers, got dtype {positions.dtype}")
    if positions.device != x.device:
        raise ValueError(f"{fn}: `positions` is on {positions.device} but x is on {x.device}")
    if positions.dtype.is_floating_point and not bool(torch.isfinite(positions).all()):
        raise ValueError(f"{fn}: `positions` must be finite, got a NaN or inf entry")
    try:
        shape = torch.broadcast_shapes(positions.shape, x.shape[:-1])
    except RuntimeError:
        shape = None
    if shape != x.shape[:-1]:
        raise ValueError(f"{fn}: `positions` of shape {tuple(positions.shape)} does not broadcast to "
                         f"x's (..., T) = {tuple(x.shape[:-1])}")
    return positions


def alibi_slopes(n_heads: int, *, dtype=None, device=None) -> torch.Tensor:
    """ALiBi's fixed, head-specific slopes (chapter 06, eq-ch06-alibi).

    From Press et al. 2022, section 3.

    For ``h`` a power of two: the geometric sequence with start and ratio
    ``2 ** (-8 / h)``, e.g. h = 8 gives 1/2, 1/4, ..., 1/256. Otherwise (the authors'
    reference code): the slopes of the largest power of two ``c <= h``, then every other
    slope of ``2c`` (``2c``'s slopes at 0-based indices 0, 2, 4, ...), the first
    ``h - c`` of them.

    Returns ``(n_heads,)``, all in (0, 1), computed in float64 and cast to ``dtype``.
    """
    n_heads, dtype = _check_alibi("alibi_slopes", n_heads, dtype, device)

    def power_of_two(h: int) -> list[float]:
        # = 2 ** (-8 / h), as in the reference code
        start = 2.0 ** (-(2.0 ** -(math.log2(h) - 3)))
        # start, start * ratio, ... with ratio = start
        return [start * start**i for i in range(h)]

    c = 1 << (n_heads.bit_length() - 1)  # largest power of two <= n_heads
    slopes = power_of_two(c)
    if c != n_heads:
        slopes += power_of_two(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(dtype)


def alibi_bias(n_heads: int, tq: int, tk: int | None = None, *, symmetric: bool = False,
               align: str = "top_left", dtype=None, device=None) -> torch.Tensor:
    """ALiBi as an additive float mask for :func:`attnbook.attention` (chapter 06).

    This is eq-ch06-alibi.

    ``bias[h, i, j] = -m_h * (p_i - j)`` for keys at or before the query (``j <= p_i``),
    the *penalty* of Press et al. (distant keys lose score); ``p_i`` is query i's
    position. ALiBi was defined for causal language models, so keys after the query get
    ``-inf``: the bias already contains the causal mask, and passing ``causal=True`` as
    well changes nothing when the alignments agree (``reference.CAUSAL_ALIGNMENTS``):

    - ``align="top_left"`` (default): ``p_i = i``, the queries are the first ``tq``
      positions (like ``causal_mask`` and ``causal=True`` in ``attention``);
    - ``align="bottom_right"``: ``p_i = i + tk - tq``, the queries are the last ``tq``
      positions, which is what a decoding step with a key/value cache needs (its rows
      are the last ``tq`` rows of ``alibi_bias(H, tk)``).

    ``symmetric=True`` is an *extension* for bidirectional attention, not in the paper:
    ``-m_h * |p_i - j|`` for every key, no mask.

    The bias is added after the ``1/sqrt(D)`` scaling (that is where ``attention`` adds
    masks).

    Args: n_heads, tq, tk (default tq); symmetric; align; dtype (default: the default
    dtype).
    Returns: ``(n_heads, tq, tk)``; broadcasts against ``(B, H, Tq, Tk)`` scores (for
    2-D single-head inputs ``(T, D)`` pass ``alibi_bias(1, T)[0]``).
    """
    n_heads, dtype = _check_alibi("alibi_bias", n_heads, dtype, device)
    # offset: 0 (top-left) or tk - tq (bottom-right)
    tq, tk, symmetric, offset = _check_alibi_bias(tq, tk, symmetric, align)
    i = offset + torch.arange(tq, dtype=torch.float64, device=device)[:, None]   # p_i
    j = torch.arange(tk, dtype=torch.float64, device=device)[None, :]
    # (H, 1, 1)
    m = alibi_slopes(n_heads, dtype=torch.float64, device=device)[:, None, None]
    if symmetric:
        # (H, Tq, Tk); + 0.0 turns -0.0 into 0.0
        return (m * -(i - j).abs() + 0.0).to(dtype)
    # -m (p_i - j); (H, Tq, Tk), future blocked
    bias = (m * (j - i)).masked_fill(j > i, -math.inf)
    return bias.to(dtype)


def _check_alibi(fn: str, n_heads, dtype, device) -> tuple[int, torch.dtype]:
    check_device("device", device, fn=fn)
    return check_int("n_heads", n_heads, fn=fn), check_dtype("dtype", dtype, fn=fn)


def _check_alibi_bias(tq, tk, symmetric, align) -> tuple[int, int, bool, int]:
    fn = "alibi_bias"
    tq = check_int("tq", tq, fn=fn)
    tk = tq if tk is None else check_int("tk", tk, fn=fn)
    symmetric = check_bool("symmetric", symmetric, fn=fn)
    align = check_choice("align", align, ("top_left", "bottom_right"), fn=fn)
    return tq, tk, symmetric, (tk - tq if align == "bottom_right" else 0)


def t5_bucket(relative_position: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32,
              max_distance: int = 128) -> torch.Tensor:
    """T5's relative-position bucket of ``n = j - i`` (key position minus query position).

    From Raffel et al. 2020 (JMLR), section 2.1: every head learns one scalar bias per bucket.
    Bidirectional: half the buckets for keys after the query (``n > 0``), half for the others;
    causal: only ``i - j >= 0`` counts (keys after the query share bucket 0). Within a half of
    ``B`` buckets, distances below ``B // 2`` get their own bucket; longer ones share buckets
    whose width grows logarithmically up to ``max_distance``; every distance beyond shares the
    last bucket.

    Args:
        relative_position: integer tensor of ``j - i`` values, any shape.
        bidirectional: True for an encoder, False for a causal decoder.
        num_buckets: total buckets (32 in T5), even and >= 4 when bidirectional, >= 2 otherwise.
        max_distance: the distance where the last bucket starts (128 in T5), > ``num_buckets``
            of one half's exact range.
    Returns:
        An int64 tensor like ``relative_position`` with values in ``0 .. num_buckets - 1``.
    """
    fn = "t5_bucket"
    if not isinstance(relative_position, torch.Tensor):
        raise TypeError(f"{fn}: `relative_position` must be an integer tensor, got "
                        f"{type(relative_position).__name__}")
    if relative_position.is_floating_point() or relative_position.is_complex() \
            or relative_position.dtype == torch.bool:
        raise TypeError(f"{fn}: `relative_position` must be an integer tensor, got dtype "
                        f"{relative_position.dtype}")
    check_bool("bidirectional", bidirectional, fn=fn)
    num_buckets = check_int("num_buckets", num_buckets, fn=fn, minimum=4 if bidirectional else 2)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"{fn}: `num_buckets` must be even when bidirectional, got {num_buckets}")
    n = relative_position.long()
    if bidirectional:
        num_buckets //= 2
        offset = (n > 0).long() * num_buckets       # keys after the query: the upper half
        n = n.abs()
    else:
        offset = torch.zeros_like(n)
        n = (-n).clamp(min=0)                      # i - j; keys after the query -> 0
    exact = num_buckets // 2
    max_distance = check_int("max_distance", max_distance, fn=fn, minimum=exact + 1)
    log_ratio = torch.log(n.clamp(min=exact).double() / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).long()     # floor: the argument is >= 0
    far = far.clamp(max=num_buckets - 1)
    return offset + torch.where(n < exact, n, far)
