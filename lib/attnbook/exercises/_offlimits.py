"""What each exercise rules out: the library's own implementation and torch's one-call
equivalent of the step the exercise teaches (the exercise's ``solution`` is always ruled out);
for chapter 09's streamed exercises, also the ways out of torch into Python numbers.

``check`` records these calls while the reader's function runs (``_core._call``): a Python
function is seen by its code (however it was imported), a torch function or Tensor method
through a ``TorchFunctionMode``; an entry may carry a predicate on the call's arguments
(``F.cross_entropy`` only with ``label_smoothing``). Calls made by this package's own code (the
solutions, the gallery) never count. The chapters' prompts name the same calls.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import (cache, dispatch, flash, layers, multihead, positional, reference, rnn, sampling,
               train)

__all__ = ["OFF_LIMITS", "labels"]


def _smoothing(args, kwargs) -> bool:
    return float(kwargs.get("label_smoothing", args[5] if len(args) > 5 else 0.0) or 0.0) != 0.0


def _causal(args, kwargs) -> bool:
    """attention_ref / attention / attention_tiled / SDPA asked to build the causal mask itself
    (``causal=``, ``is_causal=True`` or a CausalBias such as causal_lower_right)."""
    if kwargs.get("causal") or kwargs.get("is_causal") or (len(args) > 5 and args[5]):
        return True
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    return type(mask).__name__ == "CausalBias"


_SDPA = (F.scaled_dot_product_attention, "F.scaled_dot_product_attention")
# the causal exercises: attention itself is allowed with an explicit mask, not the alignment
_ATTN_CAUSAL = ((reference.attention_ref, "attnbook.attention_ref(causal=…)", _causal),
                (dispatch.attention, "attnbook.attention(causal=…)", _causal),
                (flash.attention_tiled, "attnbook.flash.attention_tiled(causal=…)", _causal),
                (F.scaled_dot_product_attention,
                 "F.scaled_dot_product_attention(is_causal=True / causal_lower_right)", _causal),
                (reference.causal_mask, "attnbook.causal_mask"),
                (reference.fold_causal, "attnbook.reference.fold_causal"))
_ATTN = ((reference.attention_ref, "attnbook.attention_ref"),
         (dispatch.attention, "attnbook.attention"),
         (flash.attention_tiled, "attnbook.flash.attention_tiled"), _SDPA,
         (F.multi_head_attention_forward, "F.multi_head_attention_forward"))
_SOFTMAX = ((torch.softmax, "torch.softmax"), (torch.Tensor.softmax, "Tensor.softmax"),
            (F.softmax, "F.softmax"), (torch.special.softmax, "torch.special.softmax"),
            (torch.log_softmax, "torch.log_softmax"), (torch.Tensor.log_softmax,
                                                       "Tensor.log_softmax"),
            (F.log_softmax, "F.log_softmax"), (torch.logsumexp, "torch.logsumexp"),
            (torch.Tensor.logsumexp, "Tensor.logsumexp"), (torch._softmax, "torch._softmax"))
# Chapter 09's streamed exercises track the tensors the answer keeps (tiled._Watch, _OneShot):
# turning a block into Python numbers would keep it out of sight, so these ways out are ruled out
_PY_NUMBERS = ((torch.Tensor.tolist, "Tensor.tolist"), (torch.Tensor.item, "Tensor.item"),
               (torch.Tensor.numpy, "Tensor.numpy"), (torch.Tensor.__array__, "numpy.asarray(张量)"),
               (torch.Tensor.__float__, "float(张量)"), (torch.Tensor.__int__, "int(张量)"),
               (torch.Tensor.__index__, "operator.index(张量)"),
               (torch.Tensor.__complex__, "complex(张量)"),
               # the ways to the raw memory: storages outlive the tensors the tracking follows,
               # and numpy arrays, bytes or pickles hold copies outside torch
               (torch.Tensor.untyped_storage, "Tensor.untyped_storage（pickle、torch.save 也用它）"),
               (torch.Tensor.storage, "Tensor.storage"), (torch.Tensor._typed_storage,
                                                          "Tensor._typed_storage"),
               (torch.Tensor.__dlpack__, "Tensor.__dlpack__（numpy.from_dlpack 等）"),
               (torch.Tensor.__deepcopy__, "copy.deepcopy(张量)"),
               (torch.Tensor.data_ptr, "Tensor.data_ptr"))
_LAYER_NORM = ((F.layer_norm, "F.layer_norm"), (torch.layer_norm, "torch.layer_norm"),
               (torch.native_layer_norm, "torch.native_layer_norm"))

OFF_LIMITS = {
    "ch01.clip_grad_norm": ((rnn.clip_grad_norm, "attnbook.rnn.clip_grad_norm"),
                            (torch.nn.utils.clip_grad_norm_, "torch.nn.utils.clip_grad_norm_"),
                            (torch.nn.utils.get_total_norm, "torch.nn.utils.get_total_norm"),
                            (torch.nn.utils.clip_grads_with_norm_,
                             "torch.nn.utils.clip_grads_with_norm_")),
    "ch01.jacobian_product": ((rnn.jacobian_product, "attnbook.rnn.jacobian_product"),
                              (torch.linalg.multi_dot, "torch.linalg.multi_dot"),
                              (torch.chain_matmul, "torch.chain_matmul")),
    "ch02.sequence_logprob": (),
    "ch02.token_cross_entropy": ((train.token_cross_entropy,
                                  "attnbook.train.token_cross_entropy"),),
    "ch03.additive_score": ((reference.additive_scores, "attnbook.additive_scores"),),
    "ch03.context": ((reference.masked_softmax, "attnbook.masked_softmax"), *_ATTN),
    "ch04.masked_softmax": ((reference.masked_softmax, "attnbook.masked_softmax"),),
    "ch04.attention": _ATTN,
    "ch04.causal_attention": _ATTN_CAUSAL,
    "ch05.split_heads": ((multihead.split_heads, "attnbook.multihead.split_heads"),),
    "ch05.merge_heads": ((multihead.merge_heads, "attnbook.multihead.merge_heads"),),
    "ch05.repeat_kv": ((multihead.repeat_kv, "attnbook.multihead.repeat_kv"),),
    "ch06.sinusoidal": ((positional.sinusoidal_encoding, "attnbook.positional.sinusoidal_encoding"),
                        (positional.frequencies, "attnbook.positional.frequencies")),
    "ch06.rope": ((positional.apply_rope, "attnbook.positional.apply_rope"),
                  (positional.rotation_matrix, "attnbook.positional.rotation_matrix"),
                  (positional.frequencies, "attnbook.positional.frequencies")),
    "ch07.feed_forward": ((layers.FeedForward.forward, "attnbook.layers.FeedForward"),),
    "ch07.swiglu": ((layers.FeedForward.forward, "attnbook.layers.FeedForward"),),
    "ch08.layer_norm": ((layers.layer_norm, "attnbook.layers.layer_norm"),
                        (layers.LayerNorm.forward, "attnbook.layers.LayerNorm"), *_LAYER_NORM,
                        (F.group_norm, "F.group_norm"), (F.instance_norm, "F.instance_norm")),
    "ch08.rms_norm": ((layers.rms_norm, "attnbook.layers.rms_norm"),
                      (layers.RMSNorm.forward, "attnbook.layers.RMSNorm"),
                      (F.rms_norm, "F.rms_norm"), (torch.rms_norm, "torch.rms_norm")),
    "ch08.residual_block": ((layers.ResidualBlock.forward, "attnbook.layers.ResidualBlock"),),
    "ch09.online_softmax": ((flash.online_softmax, "attnbook.flash.online_softmax"),
                            (reference.masked_softmax, "attnbook.masked_softmax"), *_SOFTMAX,
                            *_PY_NUMBERS),
    "ch09.merge_partial": ((reference.attention_ref, "attnbook.attention_ref"),),
    # with the library's and torch's attention in tiled.py / tiled_bwd.py (Exercise.forbidden)
    "ch09.tiled_attention": _PY_NUMBERS,
    "ch09.tiled_backward": _PY_NUMBERS,
    "ch09.attention_backward": ((flash.attention_tiled, "attnbook.flash.attention_tiled"),),
    "ch10.smoothed_cross_entropy": (
        (train.label_smoothed_cross_entropy, "attnbook.train.label_smoothed_cross_entropy"),
        (F.cross_entropy, "F.cross_entropy(label_smoothing=…)", _smoothing)),
    "ch10.noam_lr": ((train.vaswani_lr, "attnbook.train.vaswani_lr"),),
    "ch10.decoder_mask": ((reference.causal_mask, "attnbook.causal_mask"),
                          (reference.padding_mask, "attnbook.padding_mask")),
    "ch11.kv_step": ((cache.KVCache.update, "attnbook.cache.KVCache"),
                     (cache.CachedAttention.forward, "attnbook.cache.CachedAttention"),
                     *_ATTN_CAUSAL),
    "ch11.sampling_probs": ((sampling.filter_logits, "attnbook.sampling.filter_logits"),
                            (sampling.sample_next, "attnbook.sampling.sample_next")),
}


def labels(name: str) -> list:
    """The names of what exercise ``name`` rules out (for the prompt and the tests)."""
    return [entry[1] for entry in OFF_LIMITS.get(name, ())]
