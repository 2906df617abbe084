"""The unlabeled data of healing (``dualdrop.train.heal``), in the forms users have it.

Distillation needs inputs only: the teacher's outputs are the targets. ``heal_source(data, ...)``
turns each form into a *source* of batches that a training loop can run for many epochs and
resume exactly:

- a tensor (or NumPy array) of samples: batches of ``batch_size`` along dim 0 (images, or token
  ids of equal length);
- a list or tuple of batches (tensors, ``(inputs, targets)`` tuples, dicts of tensors): the
  calibration batches of ``prune_oneshot`` as they were given (healing's default data);
- a list of strings with a ``tokenizer`` (any callable of Hugging Face's tokenizer interface):
  padded batches of ``batch_size``, truncated to ``max_length`` tokens;
- a DataLoader, or any iterable that can be iterated again each epoch;
- a file: ``.txt`` (one text a line; blank lines are not texts), ``.jsonl`` (one JSON string
  or ``{"text": ...}`` a line), both with a ``tokenizer``; ``.npy`` (an array of samples, read
  without pickle); ``.pt`` (a tensor, a list of batches or a dict of tensors, read with
  ``torch.load(weights_only=True)``).

On the command line (``dualdrop prune --heal-data``, ``dualdrop heal --heal-data``) the
tokenizer of a text file is named by ``--tokenizer NAME_OR_PATH`` and loaded by
:func:`load_tokenizer` (transformers' ``AutoTokenizer``).

A source held in memory (every form but a DataLoader) is a :class:`BatchList`: its batches are
fixed, only their order changes from epoch to epoch (drawn from its own generator), so the
teacher's output of each batch can be computed once and cached, and a resumed run restores the
generator's state and skips the batches done. A DataLoader is wrapped as it is
(:class:`LoaderSource`); its shuffle comes from its own generator or torch's, which the training
loop saves and restores (``dualdrop.train.engine``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from penalties.checks import check_int

TEXT_KINDS = (".txt", ".jsonl")
FILE_KINDS = TEXT_KINDS + (".npy", ".pt")


class BatchList:
    """Fixed batches in memory, in a new order every epoch (``shuffle``) drawn from
    ``generator``; iterating yields ``(index, batch)``: the index keys the teacher cache."""

    cacheable = True

    def __init__(self, batches: list, shuffle: bool = True, seed: int = 0):
        self.batches = list(batches)
        self.shuffle = shuffle
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        n = len(self.batches)
        order = (torch.randperm(n, generator=self.generator).tolist() if self.shuffle
                 else range(n))
        for i in order:
            yield i, self.batches[i]


class LoaderSource:
    """A DataLoader (or any re-iterable of batches) as a source: yields ``(None, batch)``; its
    ``generator`` is the loader's own, when it has one, for the loop to save and restore."""

    cacheable = False

    def __init__(self, loader):
        self.loader = loader
        gen = getattr(loader, "generator", None)
        self.generator = gen if gen is not None else getattr(
            getattr(loader, "sampler", None), "generator", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield None, batch


def heal_source(data, *, tokenizer=None, batch_size: int = 32, max_length: int = 128,
                shuffle: bool = True, seed: int = 0):
    """``data`` (module docstring) as a :class:`BatchList` or :class:`LoaderSource`.

    TypeError/ValueError naming ``data`` (or ``tokenizer``) and the fix for a form it does not
    take: a one-pass iterator, an empty collection, text without a tokenizer, a file of another
    kind."""
    batch_size = check_int("batch_size", batch_size, low=1)
    max_length = check_int("max_length", max_length, low=1)
    if tokenizer is not None and not callable(tokenizer):
        raise TypeError(f"tokenizer must be callable (a Hugging Face tokenizer), got "
                        f"{type(tokenizer).__name__}")
    if isinstance(data, (str, os.PathLike)):
        data = read_file(data)
    if isinstance(data, np.ndarray):
        data = _from_numpy(data, "data")
    if isinstance(data, torch.Tensor):
        if data.dim() == 0 or len(data) == 0:
            raise ValueError(f"data is a tensor of shape {tuple(data.shape)}: give samples "
                             "along dim 0")
        return BatchList(list(data.split(batch_size)), shuffle, seed)
    if isinstance(data, dict):
        return BatchList(_split_dict(data, batch_size), shuffle, seed)
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError("data is empty: give batches, texts or samples to heal on")
        if all(isinstance(x, str) for x in data):
            return BatchList(tokenize(data, tokenizer, batch_size, max_length), shuffle, seed)
        if any(isinstance(x, str) for x in data):
            raise TypeError("data mixes strings and other items; give a list of texts or a "
                            "list of batches")
        bad = [type(b).__name__ for b in data
               if not isinstance(b, (torch.Tensor, dict, tuple, list))]
        if bad:
            raise TypeError(f"data holds items of type {bad[0]}; a list must hold batches "
                            "(tensors, (inputs, targets) tuples or dicts of tensors) or texts")
        return BatchList(list(data), shuffle, seed)
    if hasattr(data, "__iter__"):
        if iter(data) is data:
            raise TypeError(f"data is a one-pass iterator ({type(data).__name__}): healing "
                            "runs over it every epoch; give a list of batches or a DataLoader")
        try:
            n = len(data)
        except TypeError:
            n = None
        if n == 0:
            raise ValueError("data (a DataLoader) is empty: it yields no batch")
        return LoaderSource(data)
    raise TypeError(f"data must be a tensor, a list of batches, a list of texts (with "
                    f"tokenizer=...), a DataLoader or a file path ({', '.join(FILE_KINDS)}), "
                    f"got {type(data).__name__}")


def tokenize(texts: list, tokenizer, batch_size: int, max_length: int) -> list:
    """Padded, truncated batches (dicts of tensors) of ``texts``."""
    if tokenizer is None:
        raise ValueError("data is text: pass tokenizer=... (the student's tokenizer) to turn "
                         "it into token ids")
    blank = [i for i, t in enumerate(texts) if not t.strip()]
    if blank:
        raise ValueError(f"data: text {blank[0]} (of {len(blank)} blank ones) is empty; give "
                         "texts with words in them")
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        out.append({k: v for k, v in dict(enc).items() if isinstance(v, torch.Tensor)})
    return out


def is_text_file(path) -> bool:
    """Whether ``path`` names a file of texts (which needs a tokenizer)."""
    return Path(path).suffix.lower() in TEXT_KINDS


def load_tokenizer(name):
    """``transformers.AutoTokenizer.from_pretrained(name)``: a Hub name or a folder written by
    ``save_pretrained``. A tokenizer without a padding token (GPT-2's) pads with its
    end-of-text token: the attention mask hides the padding from both models, so which id
    fills it does not matter. ImportError when transformers is missing, ValueError naming
    ``name`` when it cannot be loaded."""
    try:
        from transformers import AutoTokenizer  # optional dependency, imported when used
    except ImportError:
        raise ImportError("reading text needs a tokenizer from the transformers package: "
                          "pip install transformers (or give token ids as a .pt/.npy "
                          "file)") from None
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError) as exc:
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"tokenizer {name!r} cannot be loaded ({line}); give a folder "
                         "written by save_pretrained or a Hugging Face Hub name") from None
    if getattr(tok, "pad_token", None) is None and getattr(tok, "eos_token", None) is not None:
        tok.pad_token = tok.eos_token
    return tok


def read_file(path) -> object:
    """The contents of a data file (module docstring): a list of texts, an array or what a
    ``.pt`` file holds."""
    p = Path(path)
    kind = p.suffix.lower()
    if kind not in FILE_KINDS:
        raise ValueError(f"data file {str(p)!r}: unknown kind {kind or '(no suffix)'!r}; give "
                         f"one of {', '.join(FILE_KINDS)}")
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(p)!r} does not exist")
    if kind == ".txt":
        return [line.rstrip("\n") for line in p.read_text(encoding="utf-8").splitlines()
                if line.strip()]
    if kind == ".jsonl":
        texts = []
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"data file {str(p)!r} line {i} is not JSON ({exc.msg})") from None
            text = rec.get("text") if isinstance(rec, dict) else rec
            if not isinstance(text, str):
                raise ValueError(f"data file {str(p)!r} line {i}: expected a JSON string or an "
                                 "object with a \"text\" string")
            texts.append(text)
        return texts
    if kind == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"data file {str(p)!r} cannot be read without pickle ({exc}); "
                             "save a plain numeric array") from None
        return _from_numpy(arr, f"data file {str(p)!r}")
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated zip, a pickle of other objects, ...
        raise ValueError(f"data file {str(p)!r} cannot be read with torch.load(weights_only="
                         f"True) ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         "); save tensors, lists or dicts of tensors") from None


def _from_numpy(arr: np.ndarray, what: str) -> torch.Tensor:
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{what} is an array of {arr.dtype}; give numbers (samples along "
                        "dim 0)")
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.float() if arr.dtype.kind == "f" and arr.dtype != np.float32 else t


def _split_dict(d: dict, batch_size: int) -> list:
    """A dict of tensors with the same first dimension (one big tokenized batch) split into
    batches."""
    lens = {k: len(v) for k, v in d.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not lens or len(set(lens.values())) != 1:
        raise ValueError("data is a dict: it must map names to tensors with the same number "
                         "of samples along dim 0 (a tokenized batch)")
    n = next(iter(lens.values()))
    return [{k: (v[i:i + batch_size] if k in lens else v) for k, v in d.items()}
            for i in range(0, n, batch_size)]
