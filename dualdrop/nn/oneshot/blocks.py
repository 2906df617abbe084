"""The blocks of a model for the one-shot pipeline (``pipeline``): the chain of blocks found or
named, and checked on a calibration batch.

A *chain* is a ``nn.ModuleList`` / ``nn.Sequential`` whose children are each called once per
forward, in order, the hidden state entering child ``k + 1`` being (the first element of) child
``k``'s output with nothing done to it in between (checked by object identity, every block
replaced by a recorder that returns its input in the shape of the first block's real output).
The layers outside the blocks are sorted into a *prologue* (called before the first block), an
*epilogue* (after the last) and the unreached; a layer called between the blocks breaks the
chain."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from dualdrop.nn.oneshot.layers import Step
from dualdrop.nn.oneshot.calibration import _Stop

def find_blocks(model: nn.Module, steps: list[Step], blocks=None) -> list[tuple[str, list]]:
    """Candidate chains of blocks, best first: ``(label, [(name, module), ...])``.

    ``blocks``: ``None`` (every ``ModuleList`` / ``Sequential`` with two or more children that
    hold prunable layers, most such children first), a container's name, or a list of module
    names (the blocks, in forward order)."""
    named = dict(model.named_modules())
    if blocks is not None:
        if isinstance(blocks, str):
            box = named.get(blocks)
            if box is None:
                raise ValueError(f"blocks={blocks!r} names no module of the model; give the "
                                 "name of the container of its blocks, e.g. 'transformer.h' "
                                 "or 'model.layers'")
            if not isinstance(box, (nn.ModuleList, nn.Sequential)) or len(box) < 1:
                raise ValueError(f"blocks={blocks!r} is a {type(box).__name__}, not a "
                                 "ModuleList or Sequential of blocks; give a container or a "
                                 "list of block names")
            chain = [(f"{blocks}.{c}" if blocks else c, m) for c, m in box.named_children()]
            return [(blocks, chain)]
        if (not isinstance(blocks, (list, tuple)) or not blocks
                or not all(isinstance(b, str) for b in blocks)):
            raise TypeError("blocks must be None, a container's name or a list of module "
                            f"names, got {blocks!r}")
        missing = [b for b in blocks if b not in named]
        if missing:
            raise ValueError(f"blocks: {missing} name no module of the model")
        return [(f"{blocks[0]}..{blocks[-1]}", [(b, named[b]) for b in blocks])]
    step_mods = {id(s.module) for s in steps}
    cands = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            chain = [(f"{name}.{c}" if name else c, child) for c, child in m.named_children()]
            holding = sum(any(id(x) in step_mods for x in child.modules()) for _, child in chain)
            if holding >= 2:
                cands.append((holding, name or "(model)", chain))
    cands.sort(key=lambda c: -c[0])
    return [(label, chain) for _, label, chain in cands]


def hidden_slot(args, kwargs):
    """Where a block's hidden state comes in: ``("arg", 0)`` or ``("kw", name)``."""
    if args and isinstance(args[0], torch.Tensor):
        return ("arg", 0)
    for name in ("hidden_states", "x", "input", "src", "tgt"):
        if isinstance(kwargs.get(name), torch.Tensor):
            return ("kw", name)
    for name, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            return ("kw", name)
    return None


def slot_get(args, kwargs, slot):
    kind, where = slot
    if kind == "arg":
        return args[where] if len(args) > where else None
    return kwargs.get(where)


def slot_put(args, kwargs, slot, value):
    kind, where = slot
    if kind == "arg":
        return (*args[:where], value, *args[where + 1:]), kwargs
    return args, {**kwargs, where: value}


def hidden_of(out):
    """The hidden state in a block's output: the output, or its first element."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out:
        return out[0]
    if isinstance(out, Mapping) and out:
        return next(iter(out.values()))
    return None


def shaped_like(template, hidden):
    """An output shaped as ``template`` (a block's real output) with ``hidden`` in its place."""
    if isinstance(template, torch.Tensor):
        return hidden
    if hasattr(template, "_fields"):  # a namedtuple
        return template._replace(**{template._fields[0]: hidden})
    if isinstance(template, tuple):
        return (hidden, *template[1:])
    if isinstance(template, list):
        return [hidden, *template[1:]]
    if isinstance(template, Mapping):
        out = template.__class__(template) if not hasattr(template, "to_tuple") else \
            template.__class__(**template)
        out[next(iter(template.keys()))] = hidden
        return out
    return hidden


class SwapForward:
    """Replace the blocks' ``forward`` (instance attributes; the class's method and any hooks
    untouched) and put them back."""

    def __init__(self, chain, make):
        self.chain, self.make, self.saved = chain, make, []

    def __enter__(self):
        for k, (_, blk) in enumerate(self.chain):
            self.saved.append(blk.__dict__.get("forward"))
            blk.forward = self.make(k)
        return self

    def __exit__(self, *exc):
        for (_, blk), old in zip(self.chain, self.saved):
            if old is None:
                blk.__dict__.pop("forward", None)
            else:
                blk.forward = old
        return False


class _NotAChain(Exception):
    pass


@dataclass
class BlockPlan:
    label: str
    chain: list
    slot: tuple
    template: object
    prologue: list
    inner: list      # per block: its steps
    epilogue: list
    unreached: list


def plan_blocks(model, steps, first_batch, forward_fn, blocks, source):
    """The :class:`BlockPlan` of the first candidate chain that holds on ``first_batch``, or
    ``None`` (with the reasons) when none does; ``source``: where the weights live
    (``sources``: the first block is loaded for a probe)."""
    reasons = []
    for label, chain in find_blocks(model, steps, blocks):
        try:
            return _check_chain(model, steps, label, chain, first_batch, forward_fn,
                                source), []
        except _NotAChain as e:
            reasons.append(f"{label}: {e}")
    return None, reasons


def _check_chain(model, steps, label, chain, batch, forward_fn, source):
    blocks = [blk for _, blk in chain]
    # the first block's call, without running it
    seen = {}

    def grab(module, args, kwargs):
        seen["call"] = (args, kwargs)
        raise _Stop

    h = blocks[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        forward_fn(model, batch)
    except _Stop:
        pass
    finally:
        h.remove()
    if "call" not in seen:
        raise _NotAChain(f"{chain[0][0]} is not called by the forward")
    args0, kwargs0 = seen["call"]
    slot = hidden_slot(args0, kwargs0)
    if slot is None:
        raise _NotAChain(f"{chain[0][0]} takes no tensor")
    source.load(0, blocks[0])
    try:
        template = blocks[0](*args0, **kwargs0)
    finally:
        source.release(0, blocks[0], write=False)
    if not isinstance(hidden_of(template), torch.Tensor):
        raise _NotAChain(f"{chain[0][0]} returns no tensor")
    # every block replaced by a recorder: a chain, and where the other layers are called
    n = len(blocks)
    counts = [0] * n
    last = [None]
    where: dict[int, list] = {}
    pos = [-1]  # -1 before the blocks, k inside/after block k
    broken = []

    def make(k):
        def fwd(*args, **kwargs):
            hid = slot_get(args, kwargs, slot)
            if not isinstance(hid, torch.Tensor):
                broken.append(f"{chain[k][0]} gets no hidden state where the first block "
                              f"gets it ({slot[0]} {slot[1]!r})")
            elif k > 0 and hid is not last[0]:
                broken.append(f"the hidden state entering {chain[k][0]} is not the output of "
                              f"{chain[k - 1][0]} (something happens between them)")
            elif counts[k] or k != pos[0] + 1:
                broken.append(f"{chain[k][0]} is not called once, after {chain[k - 1][0]}"
                              if k else f"{chain[0][0]} is called more than once")
            counts[k] += 1
            pos[0] = k
            last[0] = hid
            return shaped_like(template, hid)
        return fwd

    in_block = {}
    for k, blk in enumerate(blocks):
        for m in blk.modules():
            in_block[id(m)] = k
    outside = [s for s in steps if id(s.module) not in in_block]
    handles = []
    for s in steps:
        def hook(module, a, kw, s=s):
            where.setdefault(id(s.module), []).append(pos[0])
        handles.append(s.module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with SwapForward(chain, make):
            forward_fn(model, batch)
    finally:
        for hd in handles:
            hd.remove()
    if broken:
        raise _NotAChain(broken[0])
    if counts != [1] * n:
        raise _NotAChain("not every block is called once per forward")
    prologue, epilogue, unreached = [], [], []
    for s in outside:
        w = where.get(id(s.module))
        if not w:
            unreached.append(s)
        elif all(p == -1 for p in w):
            prologue.append(s)
        elif all(p == n - 1 for p in w):
            epilogue.append(s)
        else:
            raise _NotAChain(f"{s.names[0]} is called between the blocks")
    for s in steps:
        if id(s.module) in in_block and id(s.module) in where:
            raise _NotAChain(f"{s.names[0]} (inside {chain[in_block[id(s.module)]][0]}) is "
                             "also called outside its block")
    inner = [[s for s in steps if in_block.get(id(s.module)) == k] for k in range(n)]
    return BlockPlan(label, chain, slot, template, prologue, inner, epilogue, unreached)
