"""Fused FlashAttention-2 in Triton, host side (chapter 09): checks, launch, autograd, public API.

The kernels and their autotuning lists are in ``attnbook.triton_kernels`` (device code only);
this module checks what the kernels can serve (:func:`triton_support`), turns the mask into the
kernels' per-key table, launches them and wraps forward and backward in one autograd Function.
Importing ``attnbook`` does not import this module or triton; ``attnbook.attention`` imports it
the first time the ``"triton"`` backend is asked about.

Conventions are those of :func:`attnbook.reference.attention_ref`: causal is top-left aligned
(query i sees key j iff j <= i, also when Tq != Tk); a bool mask is True where a query may
attend a key. The kernels take key-padding masks: bool masks broadcastable to (B, H, Tq, Tk)
whose query dim is 1, e.g. ``attnbook.padding_mask(lengths, Tk)`` -> (B, 1, 1, Tk).
Supported: float16, bfloat16 (compute capability >= 8.0), float32, (B, H, T, D) inputs with
head dims D, Dv in 1..128. On CPU the kernels run under ``TRITON_INTERPRET=1``, which must be
set before ``triton`` itself is first imported in the process (not only before this module:
``torch.utils.flop_counter`` imports triton too; set too late, kernels fail with "Cannot call
@triton.jit'd outside of the scope of a kernel"), except bfloat16: the interpreter's tl.dot multiplies raw bf16
bit patterns, so it is reported unsupported there.

A key the mask hides never reaches the output, as in every attnbook backend: the kernels score
hidden keys with a select (NaN / inf in their k never matters), run on ``v`` with its
non-finite entries set to 0 (hidden keys: weight 0 times 0, not 0 * NaN) and the visible
non-finite entries of ``v`` are put back afterwards, one query tile at a time
(:func:`attnbook._policy.propagate_nonfinite_tiled`). Checking ``v`` (and, in the backward, ``k``)
for non-finite entries costs one pass over it and, on CUDA, one synchronisation per call.
"""
import contextlib
import os

import torch

from ._checks import attention_kernel
from ._policy import DOUBLE_BACKWARD_ERROR, at_least_2d, propagate_nonfinite_tiled
from .reference import AttentionResult, has_nonfinite

try:
    import triton
except ImportError:  # optional dependency: pip install attnbook[gpu]
    triton = None

if triton is not None:
    from . import triton_kernels as kernels

    _INTERPRETED = kernels.INTERPRETED
else:
    kernels = None
    _INTERPRETED = False

__all__ = ["attention_triton", "head_dim_bucket", "length_bucket", "tile_configs", "triton_support"]

_MAX_HEAD_DIM = 128
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INTERPRETER_BLOCKS = (16, 16)  # (BLOCK_Q, BLOCK_K) under TRITON_INTERPRET=1: small, quick to emulate
_NONFINITE_ROWS = 128  # query rows per tile when non-finite v entries are put back: O(128 * Tk) memory


# ---------------------------------------------------------------------------------------------
# What the kernels can serve
# ---------------------------------------------------------------------------------------------

def _problem(q, k, v, mask):
    """(exception type, reason) when the kernels cannot serve these arguments here, else None.

    The arguments have passed :func:`attnbook._checks.check_attention_args`; what is left are
    the kernels' own limits (TypeError / ValueError) and this machine's (RuntimeError).
    """
    if triton is None:
        return RuntimeError, "triton is not installed (pip install attnbook[gpu])"
    if q.ndim != 4:
        return ValueError, f"the Triton kernel needs 4-D (B, H, T, D) inputs, got q of shape {tuple(q.shape)}"
    if q.dtype not in _DTYPES:
        got = str(q.dtype).replace("torch.", "")
        return TypeError, f"fp16, bf16 or fp32 only, got {got}"   # short: a row of the self-check table
    for name, d in (("D", q.shape[3]), ("Dv", v.shape[3])):
        if not 1 <= d <= _MAX_HEAD_DIM:
            return ValueError, f"head dim {name}={d} is outside 1..{_MAX_HEAD_DIM}, the range of the Triton kernel"
    for name, t in (("q", q), ("k", k), ("v", v)):  # offsets inside one (b, h) slice are 32-bit in the kernel
        if (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3)) >= 2**31:
            return ValueError, f"`{name}` is too long for 32-bit offsets: shape {tuple(t.shape)}, strides {t.stride()}"
    if mask is not None and mask.dtype != torch.bool:
        return ValueError, (f"the Triton kernel takes bool key-padding masks only, got an additive {mask.dtype} "
                            "mask (use 'tiled', 'ref' or 'sdpa' for float masks)")
    if mask is not None and mask.ndim >= 2 and mask.shape[-2] != 1:
        return ValueError, ("the Triton kernel takes key-padding masks only: the query dim of the mask "
                            f"(dim -2) must be 1, got a mask of shape {tuple(mask.shape)} "
                            "(build one with attnbook.padding_mask(lengths, Tk) -> (B, 1, 1, Tk))")
    if q.device.type != "cuda" and not _INTERPRETED:
        return RuntimeError, (f"tensors are on {q.device}: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 "
                              "set before attnbook.triton_flash is first imported, to use the CPU interpreter)")
    if _INTERPRETED and os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "yes", "on"):
        return RuntimeError, ("attnbook.triton_flash was imported under TRITON_INTERPRET=1 (CPU interpreter), "
                              "which must stay set while the kernel runs")
    if q.dtype == torch.bfloat16:
        if _INTERPRETED:
            return RuntimeError, ("bfloat16 is not supported under TRITON_INTERPRET=1 "
                                  "(the interpreter's tl.dot multiplies raw bf16 bit patterns)")
        capability = torch.cuda.get_device_capability(q.device)
        if capability < (8, 0):
            return RuntimeError, f"bfloat16 needs compute capability >= 8.0, {q.device} has {capability}"
    return None


def triton_support(q, k, v, mask=None):
    """Whether :func:`attention_triton` can serve these arguments on this machine.

    The dispatcher's ``supports`` for ``"triton"``: it is asked after the arguments passed
    :func:`attnbook._checks.check_attention_args`, and reports only what is particular to the
    Triton kernels.

    Returns:
        ``(True, "")`` or ``(False, reason)``: triton missing, CPU tensors without
        ``TRITON_INTERPRET=1``, bfloat16 below compute capability 8.0 or under the interpreter,
        a dtype other than float16/bfloat16/float32, inputs that are not 4-D, a head dim outside
        1..128, a float mask, or a bool mask whose query dim is not 1.
    """
    problem = _problem(q, k, v, mask)
    return (True, "") if problem is None else (False, problem[1])


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------

def _key_mask(mask, B, H, Tk, device):
    """The key-padding mask as a (B, H, Tk) int8 view (broadcast dims have stride 0), and whether it exists."""
    if mask is None:
        return torch.ones((1, 1, 1), dtype=torch.int8, device=device).expand(B, H, Tk), False
    mask = at_least_2d(mask, 4)  # (B|1, H|1, 1, Tk|1)
    return mask[:, :, 0, :].to(torch.int8).expand(B, H, Tk), True


def length_bucket(t: int) -> int:
    """A length's power-of-two bucket, the kernels' autotuning key: the next power of two >= t (1 for t <= 1).

    Tiles are tuned once per bucket, not per length: KV-cache decoding (Tq = 1, Tk one longer at
    every step) re-tunes only when Tk crosses a power of two.
    """
    return 1 << max(0, int(t) - 1).bit_length()


def head_dim_bucket(d: int) -> int:
    """The padded head dim the kernels compile for (BLOCK_D, BLOCK_DV): the next power of two >= max(d, 16).

    tl.dot needs every dimension >= 16; the columns d..bucket-1 are zero padding.
    """
    return max(16, length_bucket(d))


def tile_configs(dtype) -> list[dict]:
    """Every tile configuration a ``dtype`` call can run on a GPU: one dict per launch of the three kernels.

    Each dict maps ``"fwd"``, ``"dkdv"``, ``"dq"`` to ``(BLOCK_Q, BLOCK_K, num_warps, num_stages)``.
    float32 runs one fixed tile; float16/bfloat16 are autotuned, and the i-th dict holds the i-th
    entry of every kernel's autotuning list, so the dicts together cover every entry the
    autotuner can pick. ``_attention_triton(..., blocks=config)`` runs one of them exactly as the
    autotuner would (same tiles, warps and stages: the same compiled kernels). Empty without triton.
    """
    if kernels is None:
        return []
    if dtype == torch.float32:
        return [{name: fp32_tile for name, (_, _, fp32_tile) in kernels.KERNELS.items()}]
    lists = {name: [(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) for c in tuned.configs]
             for name, (_, tuned, _) in kernels.KERNELS.items()}
    return [{name: entries[min(i, len(entries) - 1)] for name, entries in lists.items()}
            for i in range(max(map(len, lists.values())))]


def _launch(name, n, by, B, H, blocks, fp32, *args, **consts):
    """Run kernel `name` on a (tiles of n, B, H) grid; `by` names the tile size that splits n.

    ``blocks``: None autotunes 16-bit inputs on a GPU (float32 there: its fixed tile; under the
    interpreter: ``_INTERPRETER_BLOCKS``); ``(BLOCK_Q, BLOCK_K)`` fixes the tiles of every kernel
    (default warps and stages); a dict of :func:`tile_configs` fixes each kernel's tiles, warps
    and stages.
    """
    kernel, tuned, fp32_tile = kernels.KERNELS[name]
    if blocks is None and not _INTERPRETED and not fp32:
        tuned[lambda meta: (triton.cdiv(n, meta[by]), B, H)](*args, **consts)
        return
    if isinstance(blocks, dict) or (blocks is None and not _INTERPRETED):  # one config (float32 on a GPU: its tile)
        block_q, block_k, warps, stages = fp32_tile if blocks is None else blocks[name]
        if not _INTERPRETED:  # the interpreter has no warps or pipeline stages
            consts.update(num_warps=warps, num_stages=stages)
    else:
        block_q, block_k = blocks or _INTERPRETER_BLOCKS
    tiles = triton.cdiv(n, block_q if by == "BLOCK_Q" else block_k)
    kernel[(tiles, B, H)](*args, BLOCK_Q=block_q, BLOCK_K=block_k, **consts)


def _forward(q, k, v, km, has_mask, causal, scale, blocks):
    """out (B, H, Tq, Dv), and the float32 row statistics lse, m, log l, each (B, H, Tq)."""
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if B * H * Tq == 0 or Tk == 0:  # no key at all: every row is empty
        out = torch.zeros((B, H, Tq, Dv), dtype=q.dtype, device=q.device)  # (B, H, Tq, Dv)
        lse = torch.full((B, H, Tq), float("-inf"), device=q.device)  # (B, H, Tq)
        return out, lse, lse, torch.zeros_like(lse)
    out = torch.empty((B, H, Tq, Dv), dtype=q.dtype, device=q.device)  # (B, H, Tq, Dv)
    lse, m, log_l = (torch.empty((B, H, Tq), dtype=torch.float32, device=q.device) for _ in range(3))  # (B, H, Tq)
    _launch("fwd", Tq, "BLOCK_Q", B, H, blocks, q.dtype == torch.float32, q, k, v, km, out, lse, m, log_l,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *km.stride(), H, Tq, Tk, D, Dv, scale,
            length_bucket(Tq), length_bucket(Tk), HAS_MASK=has_mask, CAUSAL=causal,
            BLOCK_D=head_dim_bucket(D), BLOCK_DV=head_dim_bucket(Dv))
    return out, lse, m, log_l


def _backward(q, k, v, km, out, m, log_l, dout, dlse, has_mask, causal, scale, blocks):
    """dq, dk, dv (contiguous, input dtype) for upstream gradients dout (B, H, Tq, Dv), dlse (B, H, Tq)."""
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if B * H * Tq == 0 or Tk == 0:
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dout = dout.to(q.dtype)
    dlse = torch.zeros_like(m) if dlse is None else dlse.to(torch.float32).contiguous()  # (B, H, Tq)
    delta = torch.empty_like(m)  # (B, H, Tq)
    pre_block = _INTERPRETER_BLOCKS[0] if _INTERPRETED else 64
    kernels.attn_bwd_preprocess[(triton.cdiv(Tq, pre_block), B, H)](
        out, dout, dlse, delta, *out.stride(), *dout.stride(), H, Tq, Dv, BLOCK_Q=pre_block,
        BLOCK_DV=head_dim_bucket(Dv))
    args = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), *km.stride(), H, Tq, Tk, D, Dv, scale,
            length_bucket(Tq), length_bucket(Tk))
    consts = dict(HAS_MASK=has_mask, CAUSAL=causal, BLOCK_D=head_dim_bucket(D), BLOCK_DV=head_dim_bucket(Dv))
    fp32 = q.dtype == torch.float32
    _launch("dkdv", Tk, "BLOCK_K", B, H, blocks, fp32, q, k, v, km, dout, m, log_l, delta, dk, dv, *args, **consts)
    _launch("dq", Tq, "BLOCK_Q", B, H, blocks, fp32, q, k, v, km, dout, m, log_l, delta, dq, *args, **consts,
            K_NONFINITE=has_nonfinite(k))
    return dq, dk, dv


def _on_device(t):
    """Launch on t's GPU even when another one is current (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


class _FlashAttention(torch.autograd.Function):
    """Autograd wrapper: saves q, k, v, out and two (B, H, Tq) row statistics, never the weights."""

    @staticmethod
    def forward(ctx, q, k, v, km, has_mask, causal, scale, blocks):
        with _on_device(q):
            out, lse, m, log_l = _forward(q, k, v, km, has_mask, causal, scale, blocks)
        ctx.save_for_backward(q, k, v, km, out, m, log_l)
        ctx.options = (has_mask, causal, scale, blocks)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if torch.is_grad_enabled():  # create_graph=True: a second derivative is being asked for
            raise RuntimeError(DOUBLE_BACKWARD_ERROR.format(fn="attention_triton"))
        q, k, v, km, out, m, log_l = ctx.saved_tensors
        with _on_device(q):
            grads = _backward(q, k, v, km, out, m, log_l, dout, dlse, *ctx.options)
        return (*grads, None, None, None, None, None)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

@attention_kernel
def attention_triton(q, k, v, *, mask=None, causal=False, scale=None, blocks=None):
    """Fused FlashAttention-2 (chapter 09): softmax(scale * q k^T) v over the visible keys, and its lse.

    out_i = sum_j P_ij v_j,  P_ij = exp(scale * q_i . k_j - lse_i) over the keys j that query i
    may attend, lse_i = log sum_j exp(scale * q_i . k_j). Differentiable in q, k, v through
    ``out`` and also through ``lse`` (its gradient enters the backward as Delta_i -= dlse_i).

    Args:
        q: (B, H, Tq, D); k: (B, H, Tk, D); v: (B, H, Tk, Dv); float16, bfloat16 or float32, CUDA
            tensors (CPU tensors under TRITON_INTERPRET=1). D, Dv in 1..128.
        mask: None or a bool key-padding mask, True = may attend: broadcastable to
            (B, H, Tq, Tk) with query dim 1, i.e. (B|1, H|1, 1, Tk|1), (H|1, 1, Tk|1),
            (1, Tk|1), (Tk|1,) or 0-d; from lengths: ``attnbook.padding_mask(lengths, Tk)``.
        causal: query i sees key j only if j <= i (top-left aligned when Tq != Tk).
        scale: logit scale, default 1 / sqrt(D).
        blocks: None (autotuned tiles for 16-bit inputs on a GPU, a fixed tile for float32), or
            fixed tiles: ``(BLOCK_Q, BLOCK_K)`` (powers of two >= 16) for every kernel, or one
            dict of :func:`tile_configs` (what the first-use check of ``backend="auto"`` runs).
    Returns:
        :class:`~attnbook.reference.AttentionResult` ``(out, lse, weights=None)``: out
        (B, H, Tq, Dv) in the input dtype, lse (B, H, Tq) float32, natural log. A row with no
        visible key gives out = 0, lse = -inf and zero gradients; a key the mask hides never
        reaches the output, even if its k or v holds NaN / inf. First derivatives only: a double
        backward (``create_graph=True``) raises a RuntimeError.
    Raises:
        TypeError / ValueError for bad arguments (the same as every attnbook backend) and for what
        the kernels do not take (float64, a float mask, a mask with a query dim, D > 128);
        RuntimeError where this machine cannot run them (no triton, no CUDA, bfloat16 on an old
        GPU), with the reason :func:`triton_support` reports.
        Arguments are validated by ``@attention_kernel``, which also resolves ``scale``; the
        unchecked body (``attention_triton.__wrapped__``) still refuses what the kernels cannot serve.
    """
    problem = _problem(q, k, v, mask)
    if problem is not None:
        raise problem[0](f"attention_triton: {problem[1]}")
    return _attention_triton(q, k, v, mask, causal, scale, _check_blocks(blocks))


def _check_blocks(blocks):
    """``blocks`` as :func:`attention_triton` takes it, or a ValueError saying what is wrong."""
    def tile_ok(t):
        return isinstance(t, int) and not isinstance(t, bool) and t >= 16 and t & (t - 1) == 0
    if blocks is None or (isinstance(blocks, tuple) and len(blocks) == 2 and all(map(tile_ok, blocks))):
        return blocks
    if (isinstance(blocks, dict) and set(blocks) == {"fwd", "dkdv", "dq"} and all(
            isinstance(c, tuple) and len(c) == 4 and tile_ok(c[0]) and tile_ok(c[1]) and all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in c[2:]) for c in blocks.values())):
        return blocks
    raise ValueError("attention_triton: `blocks` must be None, (BLOCK_Q, BLOCK_K) with powers of two >= 16, "
                     f"or a dict of tile_configs(), got {blocks!r}")


def _attention_triton(q, k, v, mask, causal, scale, blocks=None):
    """``attention_triton`` on arguments already validated and supported by :func:`triton_support`.

    ``blocks`` fixes the tiles instead of autotuning them: ``(BLOCK_Q, BLOCK_K)`` for every kernel
    (tests), or one dict of :func:`tile_configs` (the first-use check of ``backend="auto"`` runs
    each of them).
    """
    km, has_mask = _key_mask(mask, q.shape[0], q.shape[1], k.shape[2], q.device)
    # hidden keys: weight 0 times 0, not 0 * NaN (the visible ones are put back below)
    clean_v = v.masked_fill(~torch.isfinite(v.detach()), 0.0) if has_nonfinite(v) else v
    out, lse = _FlashAttention.apply(q, k, clean_v, km, has_mask, causal, float(scale), blocks)
    if clean_v is not v:  # visible NaN / inf of v reach the output, as the maths says
        out = propagate_nonfinite_tiled(out, v, mask, causal, _NONFINITE_ROWS)
    return AttentionResult(out, lse, None)
