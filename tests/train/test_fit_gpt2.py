"""A Hugging Face GPT-2 through ``fit`` with every method, then exported in every layout; and a
refused ``fit`` of it leaves it as given."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dualdrop.nn import METHODS, export_sparse
from dualdrop.train.engine import fit

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=200))


def tokens(n=8, t=12):
    return torch.randint(0, 200, (n, t), generator=torch.Generator().manual_seed(1))


def lm_loss(model, batch):
    (x,) = batch
    return model(x, labels=x).loss


@pytest.mark.parametrize("method", list(METHODS) + ["penalty:mcp"])
def test_gpt2_fits_with_every_method_and_exports(method):
    model, x = gpt2(), tokens()
    loader = DataLoader(TensorDataset(x), batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tied embedding skipped by the hooked methods
        out = fit(model, method, loader, lm_loss, steps=3, lr=1e-2, progress=False,
                  val_loader=loader)
    assert out.finished and len(out.sparsifier.states()) >= 8
    assert all(torch.isfinite(p).all() for p in model.parameters())
    model.eval()
    with torch.no_grad():
        want = model(x).logits
        for layout in ("dense", "csr"):
            torch.testing.assert_close(export_sparse(model, layout)(x).logits, want,
                                       atol=1e-5, rtol=1e-5)
        small = export_sparse(model, "compact", example_inputs=x[:2])
        torch.testing.assert_close(small(x).logits, want, atol=1e-5, rtol=1e-5)


def test_a_refused_fit_leaves_gpt2_as_given():
    model = gpt2()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loader = DataLoader(TensorDataset(tokens()), batch_size=4)
    with pytest.raises(ValueError, match="scalar tensor"):
        fit(model, "vardrop-lr", loader, lambda m, b: m(b[0]).logits.mean(-1), steps=2,
            progress=False)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert not any(hasattr(m, "parametrizations") for m in model.modules())
