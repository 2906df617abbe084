"""What healing (``dualdrop.train.heal``) makes the student match: the distillation losses.

The teacher's output on a batch is the target; which part of it, and how it is compared, depends
on the kind of model:

- ``"kl"`` (language models and classifiers: logits): Hinton et al.'s distillation loss
  ``T^2 * KL(softmax(z_t / T) || softmax(z_s / T))`` per position, averaged over the real tokens
  (the ``attention_mask`` of a dict batch). The temperature ``T`` softens both distributions so
  that the ranks of the wrong classes carry signal; ``T^2`` keeps the gradient's scale
  independent of ``T``.
- ``"mse"`` (encoders: the output hidden states): the mean squared difference over the
  features, averaged over the real tokens (sentence-transformers' model distillation uses MSE on
  embeddings).
- ``"cosine"`` (encoders: the pooled embedding): ``1 - cos(e_s, e_t)`` of the mean over the real
  tokens (an output that is already an embedding is taken as it is): what retrieval with the
  embeddings reads.
- per-block hidden states (``block_weight > 0``): each student block's output matched to a
  teacher block's (TinyBERT's hidden-state loss), ``||P h_s - h_t||^2 / ||h_t||^2`` averaged over
  the real tokens: normalized per block, because the residual stream grows with depth. ``P`` is
  a learned projection where the widths differ, the identity otherwise.

- the batch's own labels (``label_weight = a > 0``): the distillation loss weighted ``1 - a``
  plus ``a`` times the student's cross-entropy on the labels the data carries (Hinton et al.
  mix the two the same way): a Hugging Face model's own ``loss`` when a dict batch has
  ``"labels"`` (the next-token shift of a causal language model), else the cross-entropy of the
  logits to a ``(inputs, labels)`` pair's second element or a dict's ``"labels"`` (``-100``
  ignored). Where the teacher generalizes better than the labels (a model trained longer), the
  labels add little; where the student's capacity, not the teacher, is the limit, they keep it
  on the task.

``"auto"`` picks by the output: ``logits`` (or a plain tensor: a classifier) -> ``"kl"``,
``last_hidden_state`` -> ``("cosine", "mse")``, ``sentence_embedding`` -> ``"cosine"``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

LOSSES = ("kl", "mse", "cosine")
AUTO = {"logits": ("kl",), "hidden": ("cosine", "mse"), "embedding": ("cosine",)}


def main_output(out) -> tuple[str, torch.Tensor]:
    """``(kind, tensor)`` of a model's output: ``"logits"`` (a tensor, a tuple's first tensor,
    ``.logits``), ``"embedding"`` (``sentence_embedding``) or ``"hidden"``
    (``last_hidden_state``)."""
    if isinstance(out, torch.Tensor):
        return "logits", out

    def get(key):
        return out.get(key) if isinstance(out, Mapping) else getattr(out, key, None)

    for key, kind in (("logits", "logits"), ("sentence_embedding", "embedding"),
                      ("last_hidden_state", "hidden")):
        if isinstance(get(key), torch.Tensor):
            return kind, get(key)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return "logits", out[0]
    raise TypeError(f"the model's output ({type(out).__name__}) has no tensor to distil: "
                    "expected a tensor, logits, last_hidden_state or sentence_embedding; pass "
                    "loss=callable(student_out, teacher_out, batch) and forward_fn")


def check_loss(loss):
    """``loss`` as ``"auto"``, a tuple of names of ``LOSSES`` or a callable."""
    if callable(loss) or loss == "auto":
        return loss
    names = (loss,) if isinstance(loss, str) else loss
    if (not isinstance(names, (tuple, list)) or not names
            or not all(isinstance(n, str) and n in LOSSES for n in names)):
        raise ValueError(f"loss must be 'auto', one of {LOSSES}, a tuple of them (summed) or a "
                         f"callable(student_out, teacher_out, batch) -> scalar, got {loss!r}")
    return tuple(names)


def pooled(x: torch.Tensor, mask) -> torch.Tensor:
    """The mean over the real tokens of ``(batch, tokens, width)`` (a 2-D ``x`` as it is)."""
    if x.dim() != 3:
        return x
    if mask is None:
        return x.mean(1)
    m = mask.to(x.device, x.dtype).unsqueeze(-1)
    return (x * m).sum(1) / m.sum(1).clamp_min(1)


def _token_mean(v: torch.Tensor, mask) -> torch.Tensor:
    """The mean of per-position values ``v`` over the real tokens."""
    if mask is not None and v.dim() == 2 and tuple(mask.shape) == tuple(v.shape):
        m = mask.to(v.device, v.dtype)
        return (v * m).sum() / m.sum().clamp_min(1)
    return v.mean()


def targets_of(names, x: torch.Tensor, mask) -> dict:
    """What each loss of ``names`` compares, from an output tensor ``x`` (float32): the
    teacher's are cached, so only what the losses read is kept (a pooled embedding, not every
    token's)."""
    x = x.float()
    return {n: pooled(x, mask) if n == "cosine" else x for n in names}


def distill_loss(names, s: dict, t: dict, mask, temperature: float) -> torch.Tensor:
    """The sum of the losses ``names`` between the student's targets ``s`` and the teacher's
    ``t`` (:func:`targets_of`)."""
    total = 0.0
    for n in names:
        a, b = s[n], t[n]
        if n == "kl":
            T = temperature
            per = (F.softmax(b / T, -1) * (F.log_softmax(b / T, -1)
                                            - F.log_softmax(a / T, -1))).sum(-1)
            total = total + T * T * _token_mean(per, mask)
        elif n == "mse":
            total = total + _token_mean(((a - b) ** 2).mean(-1), mask)
        else:
            total = total + (1.0 - F.cosine_similarity(a, b, dim=-1)).mean()
    return total


def block_loss(hs: list, ht: list, projections, mask) -> torch.Tensor:
    """The mean over the matched blocks of ``||P h_s - h_t||^2 / ||h_t||^2`` over the real
    tokens (module docstring)."""
    total = 0.0
    for a, b, proj in zip(hs, ht, projections):
        a = proj(a.float()) if proj is not None else a.float()
        num = _token_mean(((a - b) ** 2).sum(-1), mask)
        den = _token_mean((b ** 2).sum(-1), mask).clamp_min(1e-12)
        total = total + num / den
    return total / max(len(hs), 1)


def label_loss(out, x: torch.Tensor, batch) -> torch.Tensor:
    """The student's loss on the labels of ``batch`` (module docstring): ``out.loss`` of a model
    that computed one, else the cross-entropy of the logits ``x`` (``(..., classes)``) to the
    labels of a ``(inputs, labels)`` pair or a dict batch's ``"labels"`` (``-100`` ignored)."""
    own = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(own, torch.Tensor) and own.dim() == 0:
        return own
    y = None
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        y = batch[1]
    elif isinstance(batch, Mapping):
        y = batch.get("labels")
    if not isinstance(y, torch.Tensor):
        raise ValueError("label_weight > 0 needs labels in every batch: (inputs, labels) pairs "
                         "or dict batches with 'labels'; pass such batches, or label_weight=0 "
                         "to distil alone")
    if y.is_floating_point() or tuple(y.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"the batch's labels ({tuple(y.shape)}, {y.dtype}) must be class "
                         f"indices of the logits' leading shape {tuple(x.shape[:-1])}")
    return F.cross_entropy(x.float().reshape(-1, x.shape[-1]), y.to(x.device).reshape(-1),
                           ignore_index=-100)


def default_block_map(n_student: int, n_teacher: int) -> list[int]:
    """Student block ``j`` of ``S`` matched to teacher block ``round((j + 1) T / S) - 1``: spread
    evenly, the last onto the last."""
    return [max(0, round((j + 1) * n_teacher / n_student) - 1) for j in range(n_student)]


def hidden_of(out) -> torch.Tensor:
    """The hidden state in a block's output: the output, or its first element."""
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"a block's output ({type(out).__name__}) holds no hidden-state tensor; "
                        "leave block_weight=0")
    return out
