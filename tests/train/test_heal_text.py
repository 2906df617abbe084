"""Healing on text files from the command line: ``dualdrop prune --heal-data FILE.txt`` and
``dualdrop heal --heal-data FILE.jsonl`` with ``--tokenizer`` (a tiny word-level tokenizer saved
by ``save_pretrained`` into a folder, loaded back by transformers' AutoTokenizer: no network)."""

import json
import sys

import numpy as np
import pytest
import torch

from dualdrop.cli import main
from dualdrop.train import load_run

pytestmark = pytest.mark.filterwarnings("ignore:prune_oneshot leaves these weights dense")

WORDS = "the a cat dog sat ran on mat fast slow red blue big small".split()

TEXT_MODULE = '''
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    """Token ids in, one vector of logits per text out: the mean over the real tokens."""

    def __init__(self, vocab=16, width=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.fc = nn.Linear(width, 24)
        self.head = nn.Linear(24, 5)

    def forward(self, input_ids, attention_mask=None):
        h = torch.relu(self.fc(self.emb(input_ids)))
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        m = m.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1).clamp_min(1))
'''


@pytest.fixture(scope="module")
def text_user(tmp_path_factory):
    """A module ``ddheal_text_nets`` importable from here, a TinyLM saved, token-id calibration
    (.npz), a tokenizer folder and the same sentences as .txt and .jsonl."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("text")
    (d / "ddheal_text_nets.py").write_text(TEXT_MODULE)
    sys.path.insert(0, str(d))
    import ddheal_text_nets

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]",
                            pad_token="[PAD]").save_pretrained(d / "tok")
    g = torch.Generator().manual_seed(0)
    texts = [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (int(n),), generator=g))
             for n in torch.randint(2, 7, (40,), generator=g)]
    (d / "texts.txt").write_text("\n".join(texts) + "\n\n")          # a blank line: no text
    (d / "texts.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i})
                                             for i, t in enumerate(texts)))
    torch.manual_seed(0)
    net = ddheal_text_nets.TinyLM().eval()
    torch.save(net.state_dict(), d / "lm.pt")
    ids = torch.randint(2, len(WORDS) + 2, (32, 6), generator=g)
    np.savez(d / "calib.npz", input_ids=ids.numpy(), attention_mask=np.ones((32, 6), np.int64))
    yield {"dir": d, "texts": texts}
    sys.path.remove(str(d))
    sys.modules.pop("ddheal_text_nets", None)


def _prune(d, out, *extra):
    return [str(a) for a in ["prune", "--model", d / "lm.pt", "--model-class",
                             "ddheal_text_nets:TinyLM", "--calib", d / "calib.npz", "--method",
                             "magnitude", "--density", "0.3", "--out", out, "--no-progress",
                             *extra]]


def _support(net):
    return {n: p.detach() != 0 for n, p in net.named_parameters()
            if n in ("fc.weight", "head.weight")}


def test_prune_and_heal_on_text_files_with_a_tokenizer(text_user, tmp_path, capsys):
    d = text_user["dir"]
    out = tmp_path / "healed"
    assert main(_prune(d, out, "--heal-steps", "30", "--heal-lr", "1e-2", "--heal-batch-size",
                       "8", "--heal-data", d / "texts.txt", "--tokenizer", d / "tok")) == 0
    final = json.loads((out / "final.json").read_text())
    assert final["heal"]["steps"] == 30 and final["heal"]["tokenizer"] == str(d / "tok")
    assert final["heal"]["loss_last"] < final["heal"]["loss_first"]
    # the text was tokenized as the tokenizer does it: the healed network differs from the
    # pruned one, and its support is the pruned one's
    pruned = tmp_path / "pruned"
    assert main(_prune(d, pruned)) == 0
    a, b = load_run(out), load_run(pruned)
    assert all(torch.equal(s, _support(b)[n]) for n, s in _support(a).items())
    assert not torch.equal(a.fc.weight, b.fc.weight)
    # the same sentences as .jsonl through `dualdrop heal`: the same healing, step for step
    capsys.readouterr()
    assert main(["heal", str(pruned), "--teacher", str(d / "lm.pt"), "--steps", "30", "--lr",
                 "1e-2", "--batch-size", "8", "--heal-data", str(d / "texts.jsonl"),
                 "--tokenizer", str(d / "tok"), "--no-progress"]) == 0
    assert "healed" in capsys.readouterr().out
    c = load_run(pruned)
    for (n, p), q in zip(a.named_parameters(), c.parameters()):
        assert torch.allclose(p, q, atol=1e-6), n


def test_text_refusals_name_the_tokenizer_option(text_user, tmp_path, capsys, monkeypatch):
    d = text_user["dir"]
    cases = [
        (["--heal-steps", "5", "--heal-data", d / "texts.txt"], "give --tokenizer"),
        (["--heal-steps", "5", "--tokenizer", d / "tok"], "--tokenizer is for text data"),
        (["--heal-steps", "5", "--heal-data", d / "texts.jsonl", "--tokenizer", d / "nope"],
         "cannot be loaded"),
    ]
    for extra, match in cases:
        out = tmp_path / "r"
        assert main(_prune(d, out, *extra)) == 2
        err = capsys.readouterr().err
        assert "--tokenizer" in err and match in err, err
        assert not out.exists()                         # refused before any file is written
    monkeypatch.setitem(sys.modules, "transformers", None)   # transformers not installed
    assert main(_prune(d, tmp_path / "r", "--heal-steps", "5", "--heal-data",
                       d / "texts.txt", "--tokenizer", d / "tok")) == 2
    assert "pip install transformers" in capsys.readouterr().err


def test_a_tokenizer_without_padding_pads_with_its_end_token(tmp_path):
    """GPT-2's tokenizer has no padding token: load_tokenizer pads with the end-of-text one
    (the attention mask hides it), so texts of different lengths batch."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dualdrop.train.heal_data import load_tokenizer, tokenize

    vocab = {"<eos>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]",
                            eos_token="<eos>").save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.pad_token == "<eos>"
    (batch,) = tokenize(["the cat sat on the mat", "a dog"], tok, 8, 16)
    assert batch["input_ids"].tolist()[1] == [vocab["a"], vocab["dog"], 0, 0, 0, 0]
    assert batch["attention_mask"].tolist()[1] == [1, 1, 0, 0, 0, 0]
