"""The sequential pipeline: one block at a time, every calibration batch through it, so the cost
of a one-shot prune grows linearly with depth.

A layer is pruned on the inputs that come through the layers pruned before it. Feeding each
layer by a forward of the whole network from its input (one partial forward per layer) costs a
number of layer evaluations that grows with the square of the depth. The field's answer
(SparseGPT's own code; llm-compressor's sequential pipeline) is to cut the network into its
*blocks* (the decoder layers of a transformer), keep the hidden states that enter the current
block in an *activation cache*, and run only that block over the cache:

1. **Blocks** (``blocks``). ``blocks=None`` finds them: among the model's ``nn.ModuleList`` /
   ``nn.Sequential`` containers, the one with the most children holding prunable layers whose
   children form a *chain* on a calibration batch: each called once per forward, in order, the
   hidden state entering child ``k + 1`` being (the first element of) child ``k``'s output, with
   nothing done to it in between (checked by object identity). ``blocks="transformer.h"`` (a
   container's name) or a list of module names chooses them. Layers outside the blocks are
   pruned before them (*prologue*: an input projection, a stem convolution) or after them
   (*epilogue*: a classification head), on forwards of the whole model in which the blocks
   return the cached hidden states at once. A model with no chain of blocks is walked whole
   (``sequential="layer"`` asks for that).
2. **Capture.** One forward per calibration batch in which every block is replaced by a
   recorder: it keeps the block's call arguments (the attention mask, position embeddings:
   whatever the model computes once and passes to every block) and the hidden state entering
   the first block, and the forward stops after the last block.
3. **Stages inside a block.** A block's layers are pruned in the order the block calls them;
   layers that read the same tensor (an attention's q/k/v projections, an MLP's gate and up
   projections) form one *stage* fed by one pass, since pruning one of them cannot change what
   the others read. A stage's pass runs the block over every cached batch and stops once the
   stage's layers have had their inputs; their Grams are accumulated (``calibration``), each layer is
   pruned, and the next stage's pass sees the pruned layers.
4. **Outputs.** The block, fully pruned, runs once more over the cache, and its outputs replace
   its inputs there: they are the next block's inputs.

The result equals that of the layer-by-layer walk (each layer sees exactly the inputs it would
see there), at a cost of about ``1 + (stages - 1) / 2 + 1/n_batches`` block forwards per block
(GPT-2's four stages: about 2.5 block forwards) plus the Grams.

**Where the weights live** is the pipeline's *source* (``sources``): the model in memory, or a
checkpoint read and written block by block (``SafetensorsSource``: the source loads a block
before its first pass, writes it once pruned and frees it before the next).

**Memory.** The model (or, from disk, the current block), the activation
cache (one hidden state per calibration batch: ``tokens x width x 4`` bytes; in memory up to
``cache_memory_mb``, then in files under ``offload_dir``), the stage's Grams (float64,
``in^2`` each; layers reading one input share theirs) and one batch's activations inside one
block.

**Several processes** (``distributed``): the ranks' calibration batches are compared before
anything runs, split over the ranks (or each rank's own shard), the Grams summed.

**Resume.** With ``checkpoint_dir``, the pruned weights of each finished segment (prologue,
each block, epilogue) and its report rows are written there (each file to a temporary name,
then moved into place); a run started again with the same settings loads them and continues
after the last finished block, with the same result (the finished blocks only run their
outputs pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from dualdrop.nn._inputs import forward_failed
from dualdrop.nn.oneshot.blocks import (BlockPlan, SwapForward, hidden_of, plan_blocks, shaped_like,
                                        slot_get, slot_put)
from dualdrop.nn._memory import peak_rss_mb
from dualdrop.nn.oneshot.calibration import (GramAccumulator, _Stop, _device, calibration_mode,
                                             hook_steps, token_mask)
from dualdrop.nn.oneshot.layers import Step
from dualdrop.nn.oneshot.methods.base import layer_objective
from dualdrop.nn.oneshot.sources import MemorySource
from dualdrop.nn.oneshot.storage import ActivationCache, Resume

SEQUENTIAL = ("auto", "block", "layer")


@dataclass
class Stage:
    """Steps fed by one pass: ``calls`` calls of their modules per forward (the pass stops
    after the last); ``shared``: Linear / Conv1D steps reading one tensor (one Gram)."""

    steps: list
    calls: int
    shared: bool = False
    key: object = None  # the tensor the steps read, while planning only


@dataclass
class PipelineResult:
    """What :func:`run` did: the report's ``rows``, the steps never called (``unreached``), the
    ``mode`` (``"block"`` or ``"layer"``), the blocks' container (``blocks``) and per block its
    name, seconds and peak memory (``block_info``)."""

    rows: list = field(default_factory=list)
    unreached: list = field(default_factory=list)
    mode: str = "layer"
    blocks: str = ""
    block_info: list = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# planning


def _record(steps: list[Step], run):
    """Run ``run()`` (one forward; a ``_Stop`` ends it) with pre-hooks on the steps' modules:
    ``(reached, unreached, calls, keys)``, the reached steps in the order the forward first
    calls them (an attention's input step before its output step), how often each reached
    module is called and the tensor it first reads (``id(module)`` keys)."""
    first, calls, keys = {}, {}, {}
    modules = {}
    for s in steps:
        modules.setdefault(id(s.module), (s.module, s))

    def make(mid, step):
        def hook(module, args, kwargs):
            if mid not in first:
                first[mid] = len(first)
                keys[mid] = step.input_key(args, kwargs)
            calls[mid] = calls.get(mid, 0) + 1
        return hook

    handles = [m.register_forward_pre_hook(make(mid, s), with_kwargs=True)
               for mid, (m, s) in modules.items()]
    try:
        run()
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    kind_rank = {"mha_in": 0, "mha_out": 1}
    reached = [s for s in steps if id(s.module) in first]
    reached.sort(key=lambda s: (first[id(s.module)], kind_rank.get(s.kind, 0)))
    unreached = [s for s in steps if id(s.module) not in first]
    return reached, unreached, {id(s.module): calls[id(s.module)] for s in reached}, keys


def trace(model, steps: list[Step], calib, forward_fn) -> tuple[list[Step], list[Step], dict]:
    """``(ordered, unreached, calls)``: the steps in the order the forward first calls them,
    those no forward call reached, and how often each step's module is called per forward
    (``id(module)`` keys); one forward of the first calibration batch, its failure named."""
    batch = next(iter(calib), None)
    if batch is None:
        raise ValueError("calib gave no batch")

    def forward():
        with calibration_mode(model):
            try:
                forward_fn(model, batch)
            except Exception as e:  # noqa: BLE001 - the user's data or forward_fn: one message
                raise forward_failed(e, model, batch, "the first calibration batch") from e

    return _record(steps, forward)[:3]


def _stages(steps: list[Step], run) -> tuple[list[Stage], list[Step]]:
    """The stages of the steps ``run()`` reaches, in call order (consecutive steps that read
    one tensor object, each called once, share a stage), and the unreached steps."""
    reached, unreached, calls, keys = _record(steps, run)
    stages: list[Stage] = []
    for s in reached:
        mid = id(s.module)
        key = keys.get(mid) if calls[mid] == 1 else None
        last = stages[-1] if stages else None
        if (last is not None and key is not None and last.key is key
                and all(id(t.module) != mid for t in last.steps)):
            last.steps.append(s)
            last.calls += 1
            last.shared = True
        else:
            stages.append(Stage([s], calls[mid], False, key))
    for st in stages:
        st.key = None
    return stages, unreached


# ----------------------------------------------------------------------------------------------
# running


class _Runner:
    def __init__(self, prune_step, precision, bar, dist, resume):
        self.prune_step = prune_step
        self.precision = precision
        self.bar = bar
        self.dist = dist
        self.resume = resume
        self.cuda = False

    def stage(self, stage: Stage, feeds) -> list[dict]:
        """One pass of ``feeds`` (``(mask, thunk)`` per batch) with the stage's hooks, then
        its steps pruned; the report rows."""
        t0 = time.perf_counter()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        acc = GramAccumulator(stage.steps, stage.shared, self.precision)
        counter = [0]
        handles = hook_steps(stage.steps, acc, stage.calls, counter)
        try:
            for mask, thunk in feeds:
                counter[0] = 0
                acc.new_batch(mask)
                try:
                    thunk()
                except _Stop:
                    pass
        finally:
            for h in handles:
                h.remove()
        if self.dist is not None:
            self.dist.all_reduce_grams(acc)
        gram_mb = acc.nbytes() / 2 ** 20
        t_pass = (time.perf_counter() - t0) / len(stage.steps)
        rows = []
        for i, step in enumerate(stage.steps):
            Gs = acc.grams(i)
            counts = acc.row_counts(i)
            for G in Gs:
                if not bool(torch.isfinite(G).all()):
                    raise ValueError(f"the calibration inputs of {step.names[0]} are not finite "
                                     "(the layers before it overflow on calib, or calib holds "
                                     "NaN/inf): check calib and the model's dtype")
            owner = self.dist.owner(i) if self.dist is not None else None
            if owner is None or owner == self.dist.rank:
                rows_i = self._prune(step, Gs, counts, t_pass, gram_mb)
            else:
                rows_i = None
            if self.dist is not None:
                rows_i = self.dist.share_step(step, owner, rows_i)
            rows += rows_i
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix_str(step.names[0][-40:])
        acc.release()
        return rows

    def _prune(self, step, Gs, counts, t_pass, gram_mb):
        W0s = step.weights()
        Ws, secs = self.prune_step(step, W0s, Gs)
        if Ws is None:
            Ws = W0s
        else:
            step.set_weights(Ws)
        peak = torch.cuda.max_memory_allocated() / 2 ** 20 if self.cuda else peak_rss_mb()
        rows = []
        for name, W0, W, G, s, n in zip(step.names, W0s, Ws, Gs, secs, counts):
            kept = int((W != 0).sum())
            rows.append({"layer": name, "kind": step.kind, "shape": list(W0.shape),
                         "rows": n, "kept": kept, "density": kept / W0.numel(),
                         "objective": layer_objective(W, W0, G),
                         "seconds": s + t_pass, "gram_mb": gram_mb, "peak_mb": peak})
        return rows

    def segment(self, name, steps, stages_of, feeds_of, on_pruned=None) -> list[dict]:
        """Prune a segment's stages (``stages_of()`` traces them, ``feeds_of()`` gives a fresh
        iterator of feeds per pass), or load it from the resume state; ``on_pruned()`` runs
        once the segment is pruned, before it is recorded as done."""
        if self.resume is not None and self.resume.done(name) is not None:
            rows = self.resume.load(name, steps)
            if self.bar is not None:
                self.bar.update(len(steps))
            return rows
        stages, unreached = stages_of()
        rows = []
        for st in stages:
            rows += self.stage(st, feeds_of())
        if on_pruned is not None:
            on_pruned()
        if self.resume is not None and (self.dist is None or self.dist.rank == 0):
            self.resume.save(name, [s for st in stages for s in st.steps], rows)
        self.unreached += unreached
        return rows


def run(model, steps: list[Step], calib, forward_fn, prune_step, *, progress=True,
        desc="one-shot", sequential="auto", blocks=None, token_mask_fn=None, offload_dir=None,
        cache_memory_mb=None, gram_precision="auto", checkpoint_dir=None, fingerprint=None,
        source=None, dist=None, resume=None) -> PipelineResult:
    """Prune ``steps`` of ``model`` in forward order (module docstring); ``prune_step(step, W0s,
    Gs) -> (Ws, seconds)``. Returns a :class:`PipelineResult`.

    ``sequential``: ``"auto"`` (blocks when a chain of them is found, else the whole model),
    ``"block"`` (blocks, or a ``ValueError`` saying why not), ``"layer"`` (the whole model:
    one partial forward per stage). ``source``: where the weights live (``sources``; default
    the model in memory); ``dist``: the distributed context (``distributed``)."""
    if sequential not in SEQUENTIAL:
        raise ValueError(f"sequential={sequential!r}; expected one of {list(SEQUENTIAL)}")
    if dist is not None:  # every rank every batch, or calibration_sharded said
        dist.check_calibration(calib)
    result = PipelineResult()
    source = MemorySource() if source is None else source
    if resume is None and checkpoint_dir is not None:
        resume = Resume(checkpoint_dir, fingerprint or {})
    bar = tqdm(total=len(steps), desc=desc, unit="layer", leave=False) if progress else None
    runner = _Runner(prune_step, gram_precision, bar, dist, resume)
    runner.unreached = []
    runner.cuda = _device(model).type == "cuda"
    mine = (lambda b: True) if dist is None else dist.mine

    def model_feeds(replay=None):
        def gen():
            for b, batch in enumerate(calib):
                if not mine(b):
                    continue
                if replay is not None:
                    replay.current = b
                yield token_mask(batch, token_mask_fn), (lambda batch=batch: forward_fn(model,
                                                                                        batch))
        return gen()

    try:
        with calibration_mode(model):
            first = next(iter(calib), None)
            if first is None:
                raise ValueError("calib gave no batch")
            plan, reasons = (None, []) if sequential == "layer" else plan_blocks(
                model, steps, first, forward_fn, blocks, source)
            if plan is None:
                if sequential == "block" or blocks is not None:
                    raise ValueError("sequential='block': no chain of blocks found ("
                                     + ("; ".join(reasons) or "no ModuleList or Sequential "
                                        "holds two or more prunable layers")
                                     + "); pass blocks=[...] or sequential='layer'")
                if source.needs_blocks:
                    raise ValueError("pruning from disk needs the model's blocks; "
                                     + "; ".join(reasons))
                result.rows = runner.segment(
                    "model", steps,
                    lambda: _stages(steps, lambda: forward_fn(model, first)),
                    model_feeds)
                result.unreached = runner.unreached
                return result
            result.mode, result.blocks = "block", plan.label
            result.rows, result.block_info = _run_blocks(
                model, plan, calib, forward_fn, runner, model_feeds, mine, token_mask_fn,
                offload_dir, cache_memory_mb, source, first)
            result.unreached = runner.unreached + plan.unreached
            return result
    finally:
        if bar is not None:
            bar.close()


class _Replay:
    """Blocks that return at once: the last one the cached final hidden state of the batch in
    flight (``current``), the others their input."""

    def __init__(self, plan, cache):
        self.plan, self.cache, self.current = plan, cache, None

    def make(self, k):
        last = len(self.plan.chain) - 1

        def fwd(*args, **kwargs):
            if k == last:
                return shaped_like(self.plan.template, self.cache.get(self.current))
            return shaped_like(self.plan.template, slot_get(args, kwargs, self.plan.slot))
        return fwd


def _run_blocks(model, plan: BlockPlan, calib, forward_fn, runner, model_feeds, mine,
                token_mask_fn, offload_dir, cache_memory_mb, source, first):
    rows, info = [], []
    chain, slot = plan.chain, plan.slot
    blocks = [blk for _, blk in chain]

    def stop_at_blocks():
        def stop(module, a, kw):
            raise _Stop
        return blocks[0].register_forward_pre_hook(stop, with_kwargs=True)

    # prologue
    if plan.prologue:
        def prologue_stages():
            h = stop_at_blocks()
            try:
                return _stages(plan.prologue, lambda: forward_fn(model, first))
            finally:
                h.remove()
        rows += runner.segment("prologue", plan.prologue, prologue_stages, model_feeds)

    # capture: every block a recorder of its call; the hidden state entering block 0
    cache = ActivationCache(offload_dir, cache_memory_mb)
    try:
        statics: dict[int, list] = {}
        masks: dict[int, torch.Tensor | None] = {}
        current = [None]

        def make(k):
            def fwd(*args, **kwargs):
                hid = slot_get(args, kwargs, slot)
                a, kw = slot_put(args, kwargs, slot, None)
                statics[current[0]][k] = (a, kw)
                if k == 0:
                    cache.set(current[0], hid)
                if k == len(blocks) - 1:
                    raise _Stop
                return shaped_like(plan.template, hid)
            return fwd

        first_mine = []
        with SwapForward(chain, make):
            for b, batch in enumerate(calib):
                if not mine(b):
                    continue
                if not first_mine:
                    first_mine.append(batch)
                current[0] = b
                statics[b] = [None] * len(blocks)
                masks[b] = token_mask(batch, token_mask_fn)
                try:
                    forward_fn(model, batch)
                except _Stop:
                    pass
                if any(s is None for s in statics[b]):
                    raise ValueError(f"calibration batch {b} did not go through every block "
                                     f"of {plan.label}; every batch must take the same path")
        order = sorted(statics)
        if not order:
            raise ValueError("this process got no calibration batch")
        source.after_capture()  # until the epilogue only the blocks run

        def call(k, b):
            a, kw = statics[b][k]
            dev = _first_device(blocks[k])
            a, kw = slot_put(a, kw, slot, cache.get(b, dev))
            return blocks[k](*a, **kw)

        for k, (bname, blk) in enumerate(chain):
            t0 = time.perf_counter()
            source.load(k, blk)
            inner = plan.inner[k]
            if inner:
                def stages_of(k=k, inner=inner):
                    return _stages(inner, lambda: call(k, order[0]))

                def feeds_of(k=k):
                    return ((masks[b], (lambda b=b: call(k, b))) for b in order)
                rows += runner.segment(f"block-{k:04d}", inner, stages_of, feeds_of,
                                       lambda k=k, blk=blk: source.pruned(k, blk))
            for b in order:  # the block's outputs are the next block's inputs
                out = hidden_of(call(k, b))
                if not isinstance(out, torch.Tensor):
                    raise ValueError(f"{bname} returned no tensor on batch {b}")
                cache.set(b, out)
            source.release(k, blk)
            info.append({"block": bname, "seconds": time.perf_counter() - t0,
                         "peak_mb": peak_rss_mb()})

        # epilogue: the blocks return the cached final hidden states at once
        source.before_epilogue()
        if plan.epilogue:
            replay = _Replay(plan, cache)
            with SwapForward(chain, replay.make):
                def epilogue_stages():
                    replay.current = order[0]
                    return _stages(plan.epilogue, lambda: forward_fn(model, first_mine[0]))
                rows += runner.segment("epilogue", plan.epilogue, epilogue_stages,
                                       lambda: model_feeds(replay))
    finally:
        cache.close()
    return rows, info


def _first_device(module: nn.Module):
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return None

