"""Sparsify existing PyTorch models: adaptive dropout and the penalty methods it is dual to.

Entry points::

    from dualdrop.nn import sparsify, export_sparse, sparsity_report, default_hparams, METHODS

    sp = sparsify(model, "vardrop-lr")            # in place, every weight-bearing layer
    opt = torch.optim.Adam(model.parameters(), lr=sp.hparams["lr"])   # build it AFTER sparsify
    loss = data_loss + sp.regularizer(n_train)    # per step
    sp.after_step(opt, step, total_steps)         # after every opt.step()
    sp.density()                                  # {weight: fraction nonzero, "total": ...}
    plain = export_sparse(model, layout="dense")  # loads strictly into the plain architecture
    small = compact(model, example_inputs=x)      # dead units removed (needs torch-pruning)
    save_pretrained(hf_model, "dir"); load_pretrained("dir")   # any pruned Hugging Face model
    print(latency(model, x))                      # every export layout timed (docs/inference.md)
    sp.finalize()                                 # or fold the pruning into the model in place

Methods (``METHODS``, plus ``"penalty:<name>"`` for any separable ``penalties`` catalog name),
one ``Method`` record each (``dualdrop.nn.registry``): variational dropout without / with local /
with local + additive reparameterization (``vardrop``, ``vardrop-lr``, ``vardrop-lr-ar``),
hard-concrete L0 gates per weight or per neuron (``hardconcrete``, ``hardconcrete-neuron``),
gradual magnitude pruning (``magnitude``), and the eta-trick family (``eta-trick``, ``adaprox``,
``adatikhonov``, ``logsum``). One folder or module per family under ``dualdrop.nn.methods``
(``vardrop/``, ``hardconcrete/``, ``penalty/``: ``method.py`` records, state and the reference
torch forms, ``fused.py`` the numba loops; ``magnitude.py``); shared machinery below them
(``_numba``, ``_noise``, ``_gradhook``, ``_memory``); ``targets`` (which tensors), ``export``
(export and reports). Adding a method: docs/add-method.md.

Every method is a ``torch.nn.utils.parametrize`` parametrization of each selected weight tensor
(any module); the ones that change the forward (local reparameterization, neuron gates) also
hook their Linear / convolution layers. Densities count weights only (biases are neither pruned
nor counted), a tied weight once, with each method's deterministic test-time rule;
``model.eval()`` runs exactly that pruned network.
"""

from dualdrop.nn._memory import tune_allocator
from dualdrop.nn._base import Method, state_of
from dualdrop.nn._heads import HeadPrunedAttention
from dualdrop.nn.compact import compact, compact_report, load_compact, save_compact
from dualdrop.nn.export import (CSRLinear, export_sparse, fold, format_report, linear_density,
                                sparsity_report)
from dualdrop.nn.hf import load_pretrained, save_pretrained
from dualdrop.nn.inference import LatencyReport, count_flops, latency
from dualdrop.nn.oneshot import prune_oneshot, prune_oneshot_from_disk
from dualdrop.nn.onnx import OnnxModel, export_onnx
from dualdrop.nn.quantize import Int8DynamicLinear, quantize_dynamic_int8
from dualdrop.nn.registry import REGISTRY, describe, method_class
from dualdrop.nn.sparsifier import METHODS, Sparsifier, default_hparams, sparsify

__all__ = ["sparsify", "export_sparse", "sparsity_report", "format_report", "default_hparams",
           "METHODS", "REGISTRY", "Method", "method_class", "describe", "Sparsifier",
           "CSRLinear", "fold", "state_of", "tune_allocator", "compact", "compact_report",
           "save_compact", "load_compact", "HeadPrunedAttention", "prune_oneshot", "prune_oneshot_from_disk",
           "linear_density", "latency", "LatencyReport", "count_flops", "export_onnx",
           "OnnxModel", "Int8DynamicLinear", "quantize_dynamic_int8", "save_pretrained",
           "load_pretrained"]
