"""Hugging Face transformers: the compact model of a structurally pruned transformer, and saving
/ loading every pruned form as config + safetensors.

- ``compact_pretrained`` (what ``dualdrop.nn.compact`` does for a Hugging Face model): dead FFN
  neurons and attention heads removed block by block (:mod:`dualdrop.nn.hf.compact`), for
  BERT-, GPT-2- and Llama-shaped blocks (:mod:`dualdrop.nn.hf.families`);
- ``save_pretrained`` / ``load_pretrained``: each form in the checkpoint ``transformers`` loads
  where it can, else in dualdrop's form (:mod:`dualdrop.nn.hf.io`).

Nothing here imports transformers until a function needs it.
"""

from dualdrop.nn.hf.compact import compact_pretrained
from dualdrop.nn.hf.families import family
from dualdrop.nn.hf.io import load_pretrained, route_save_pretrained, save_pretrained

__all__ = ["compact_pretrained", "save_pretrained", "load_pretrained", "route_save_pretrained",
           "family"]
