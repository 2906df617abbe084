"""A model and the inputs it is given, checked before any work: what one-shot pruning and the
latency report share.

A forward that fails on the user's data fails deep inside torch (``mat1 and mat2 shapes cannot
be multiplied``, ``expected scalar type Float``, ``unexpected keyword argument``); these checks
say instead which argument is wrong, how (its shape, dtype, device, against what the model
holds) and what to give."""

from __future__ import annotations

import inspect

import torch
from torch import nn


def check_model(model, what: str = "model", hint: str = "") -> None:
    """``TypeError`` unless ``model`` is an ``nn.Module``; ``ValueError`` when tensors of it are
    on the meta device (shapes without values: nothing to compute with); ``hint`` ends the
    message."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{what} must be a torch.nn.Module, got {type(model).__name__}")
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers())
            if t.device.type == "meta"]
    if meta:
        raise ValueError(f"{what} has {len(meta)} tensor(s) on the meta device (shapes without "
                         f"values), e.g. {meta[:3]}: load its weights first "
                         f"(model.to_empty(device='cpu'), then load_state_dict){hint}")


def check_rows(inputs, what: str) -> None:
    """``ValueError`` when a tensor of ``inputs`` (a tensor, or a tuple/list/dict of them) has
    no rows along dim 0."""
    items = (inputs.items() if isinstance(inputs, dict) else
             enumerate(inputs) if isinstance(inputs, (tuple, list)) else [(None, inputs)])
    for key, t in items:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == 0:
            where = what + (f"[{key!r}]" if key is not None else "")
            raise ValueError(f"{where} is an empty batch (shape {tuple(t.shape)}); give at "
                             "least one sample along dim 0")


def describe(batch) -> str:
    """A batch in a few words: its tensors' shapes, dtypes and devices."""
    def one(t):
        if isinstance(t, torch.Tensor):
            return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"
        return type(t).__name__
    if isinstance(batch, dict):
        return "a dict: " + ", ".join(f"{k}: {one(v)}" for k, v in list(batch.items())[:6])
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__}: " + ", ".join(one(t) for t in batch[:6])
    return "a tensor " + one(batch) if isinstance(batch, torch.Tensor) else one(batch)


def _first_weighted(model: nn.Module):
    """The first module (in registration order) that holds a parameter of its own."""
    for m in model.modules():
        if any(True for _ in m.parameters(recurse=False)):
            return m
    return None


def _hint(model: nn.Module, batch, exc: Exception) -> str:
    """What is most likely wrong with ``batch`` for ``model``, in one sentence (or '')."""
    tensors = (list(batch.values()) if isinstance(batch, dict) else
               list(batch) if isinstance(batch, (tuple, list)) else [batch])
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    first = _first_weighted(model)
    p = next(first.parameters(recurse=False), None) if first is not None else None
    if isinstance(batch, dict) and isinstance(exc, TypeError) and "keyword" in str(exc):
        try:
            params = list(inspect.signature(model.forward).parameters)
        except (TypeError, ValueError):
            params = []
        return (f"the batch is a dict (fed as keywords {sorted(batch)[:6]}) but "
                f"{type(model).__name__}.forward takes {params or 'other arguments'}: give "
                "the tensor itself (or a tuple)")
    if (p is not None and p.is_floating_point() and tensors
            and not any(t.is_floating_point() for t in tensors)
            and not isinstance(first, (nn.Embedding, nn.EmbeddingBag))):
        return (f"the inputs are {str(tensors[0].dtype).replace('torch.', '')} but the model "
                f"computes in {str(p.dtype).replace('torch.', '')}: convert them "
                "(e.g. inputs.float())")
    width = getattr(first, "in_features", None) or getattr(first, "in_channels", None)
    if width is not None and tensors and tensors[0].dim() >= 2 \
            and tensors[0].shape[-1 if hasattr(first, "in_features") else 1] != width:
        axis = "last" if hasattr(first, "in_features") else "second"
        return (f"the model's first layer ({type(first).__name__}) reads {width} features on "
                f"the {axis} axis, the inputs have shape {tuple(tensors[0].shape)}")
    if p is not None and tensors and any(t.device != p.device for t in tensors):
        return (f"the inputs are on {tensors[0].device}, the model on {p.device}: move one "
                "of them")
    return ""


def forward_failed(exc: Exception, model: nn.Module, batch, what: str,
                   fix: str = ", or pass forward_fn(model, batch) to say how a batch is fed"
                   ) -> ValueError:
    """The ``ValueError`` for a forward of ``model`` that raised ``exc`` on ``batch`` (``what``
    names the argument the batch came from; ``fix`` ends the advice): the batch, the model,
    the likely cause."""
    p = next(model.parameters(), None)
    held = (f"{str(p.dtype).replace('torch.', '')} on {p.device}" if p is not None
            else "no parameters")
    hint = _hint(model, batch, exc)
    return ValueError(f"the model's forward failed on {what} ({describe(batch)}; the model "
                      f"holds {held}): " + (hint + ". " if hint else "")
                      + f"{type(exc).__name__}: {str(exc)[:300]}. Check {what}'s shape, dtype "
                      f"and device{fix}")


def check_forward(model: nn.Module, inputs, forward, what: str, fix: str = "") -> None:
    """One forward ``forward(model, inputs)`` in ``eval()`` mode without gradients (the modes
    put back after: no BatchNorm statistic moves); its failure raised as
    :func:`forward_failed`."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            forward(model, inputs)
    except Exception as e:  # noqa: BLE001 - the user's inputs: one message naming them
        raise forward_failed(e, model, inputs, what, fix) from e
    finally:
        for m, mode in modes:
            m.training = mode
