"""The backends' shared policy for masks and non-finite values (private; chapter 09's kernels).

Every attnbook backend treats masks and NaN / inf the same way: a key the mask hides never
reaches the output (its k and v may hold garbage), the visible non-finite entries of ``v`` reach
it as the maths says, and the custom backwards give first derivatives only. The definitions
(``visible_keys``, ``has_nonfinite``, ``propagate_nonfinite``) are in :mod:`attnbook.reference`;
this module holds what the tiled and the Triton kernels add to them, so that neither kernel
module imports the other.
"""
from __future__ import annotations

import torch

from .reference import propagate_nonfinite, visible_keys

__all__ = ["DOUBLE_BACKWARD_ERROR", "at_least_2d", "propagate_nonfinite_tiled"]

DOUBLE_BACKWARD_ERROR = (
    "{fn}: double backward (a gradient of a gradient, create_graph=True) is not supported by this "
    "kernel's custom backward; use backend='ref' or 'sdpa', whose backward is built from "
    "differentiable operations"
)


def at_least_2d(mask: torch.Tensor, ndim: int = 2) -> torch.Tensor:
    """``mask`` viewed with leading 1s up to ``ndim`` dims: a (Tk,) or 0-d mask becomes (1, Tk) / (1, 1)."""
    return mask.reshape((1,) * max(0, ndim - mask.ndim) + tuple(mask.shape))


def propagate_nonfinite_tiled(out, v, mask, causal, block_q):
    """:func:`~attnbook.reference.propagate_nonfinite` one query tile at a time (O(block_q * Tk) memory)."""
    tq, tk = out.shape[-2], v.shape[-2]
    return torch.cat([
        propagate_nonfinite(out[..., i0:i0 + block_q, :], v,
                            visible_keys(mask, causal, tq, tk, rows=slice(i0, i0 + block_q), device=out.device))
        for i0 in range(0, tq, block_q)
    ], dim=-2) if tq else out
