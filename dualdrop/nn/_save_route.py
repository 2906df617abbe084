"""``model.save_pretrained`` of the Hugging Face models dualdrop hands out, routed to
``dualdrop.nn.hf.io`` (an instance attribute; the class and every other model are untouched).

``sparsify``, ``export_sparse``, ``quantize_dynamic_int8``, ``compact`` and ``load_pretrained``
set the attribute on the model they return (:func:`route_save_pretrained`); calling it saves the
model in the form its layout needs (``dualdrop.nn.hf.io``'s module docstring). The saving
itself reads every export form, so ``dualdrop.nn.hf.io`` sits *above* the modules that make those
forms; it installs its implementation here when it is imported (:func:`set_saver`), which
``import dualdrop.nn`` always does. This module sits below all of them: the modules that route a
model import nothing of the saver's.
"""

from __future__ import annotations

from dualdrop.nn._layers import is_pretrained

_SAVER = []   # the implementation, installed by dualdrop.nn.hf.io


def set_saver(fn) -> None:
    """Install ``fn(model, save_directory, args, kwargs)`` as the routed ``save_pretrained``."""
    _SAVER[:] = [fn]


class _RoutedSave:
    """``model.save_pretrained`` of a model dualdrop handed out (module docstring)."""

    __slots__ = ("model",)

    def __init__(self, model):
        self.model = model

    def __call__(self, save_directory, *args, **kwargs):
        if not _SAVER:  # dualdrop.nn imports dualdrop.nn.hf, whose io module installs it
            raise RuntimeError("dualdrop.nn.hf.io is not imported; import dualdrop.nn first")
        return _SAVER[0](self.model, save_directory, args, kwargs)

    def __repr__(self):
        return f"<save_pretrained of {type(self.model).__name__}, routed by dualdrop>"


def route_save_pretrained(model):
    """Route ``model.save_pretrained`` through dualdrop (an instance attribute; no-op for a
    model that is not a Hugging Face ``PreTrainedModel``). Returns ``model``."""
    if is_pretrained(model) and not isinstance(model.__dict__.get("save_pretrained"),
                                               _RoutedSave):
        model.__dict__["save_pretrained"] = _RoutedSave(model)
    return model
