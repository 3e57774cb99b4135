"""Sharded learners on PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer
state split across the learners of the default process group, one decoder layer per unit of sharding.

:func:`shard_model` shards a causal LM (also wrapped by ``peft`` for LoRA), a ``ValueModel`` or a ``RewardModel``
in place; :func:`through_root` runs a function (e.g. ``layout_logprobs``, which calls the decoder and the output
layer separately) as a forward pass of the sharded root, so the root's own parameters (embeddings, final norm,
output layer) are gathered for it; :func:`gather_into` copies the sharded weights into an unsharded twin one unit
at a time, and :func:`scatter_into` the other way: rank 0's whole weights into every learner's shards of a model the
others built on the ``meta`` device (:func:`shard_from`), so no learner but rank 0 ever holds the whole model;
:func:`load_sharded` and :func:`load_sharded_optimizer` load full tensors or lazy row readers into this learner's
shards. Gradients are SUMMED over the learners (not averaged): pickaxe's losses are normalised by the
whole step's counts and each learner computes its share of the micro-batches.

Every function that talks to the other learners is a collective: every learner calls it, in the same order.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from pickaxe.errors import PickaxeError

Offload = Literal["none", "optimizer", "params"]
OFFLOADS = ("none", "optimizer", "params")
LAYER_LISTS = ("layers", "h", "blocks", "layer")
"""Names of the ``nn.ModuleList`` holding a transformer's decoder layers (Llama/Qwen/Mistral ``layers``, GPT-2
``h``, ...)."""
ROOT_CALL = "run_sharded"
"""The method :func:`shard_model` adds to a sharded root: ``root.run_sharded(fn)`` runs ``fn()`` as its forward."""

T = TypeVar("T")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of ``model`` (a ``transformers`` causal LM, the same wrapped by ``peft``, a ``ValueModel``
    or ``RewardModel``): the first non-empty ``nn.ModuleList`` named like :data:`LAYER_LISTS`, in order. Raises
    ``PickaxeError`` for a model without one."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in LAYER_LISTS and len(module) > 0:
            return list(module)
    raise PickaxeError(
        f"cannot shard {type(model).__name__}: no decoder layers found (an nn.ModuleList named "
        f"{'/'.join(LAYER_LISTS)}); shard a transformers causal LM, a ValueModel or a RewardModel, or use "
        "--dist.shard none"
    )


def group_device() -> torch.device:
    """Where the default group's collectives run: this learner's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def is_meta(model: nn.Module) -> bool:
    """Whether ``model`` has a parameter or buffer on the ``meta`` device (built without memory, to be sharded and
    filled: see :func:`shard_from`)."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def mesh_device(param: torch.Tensor) -> torch.device:
    """Where the collectives over ``param``'s learners run: this learner's GPU for a CUDA mesh (also when the
    shard is offloaded to the host), else the CPU; a plain tensor's own device."""
    if not isinstance(param, DTensor):
        return param.device
    kind = param.device_mesh.device_type
    return torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This learner's piece of ``t``: a DTensor's local shard, a plain tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def compute_device(model: nn.Module) -> torch.device:
    """The device ``model`` computes on: its parameters' device, or for a sharded model its mesh's (the shards may
    live on the host with ``offload``)."""
    return mesh_device(next(model.parameters()))


def local_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of the dim-0 rows learner ``rank`` of ``world`` holds of a tensor with ``rows`` rows:
    FSDP2's split, ``torch.chunk``'s rule (chunks of ``ceil(rows / world)`` rows; the last learners may hold fewer
    or none)."""
    size = -(-rows // world) if rows else 0
    start = min(rank * size, rows)
    return start, min(start + size, rows)


def _run(self: nn.Module, fn: Callable[[], T]) -> T:
    out = fn()
    # a view would lose the root's pre-backward hook to a later in-place op (FSDP2 warns): hand out a copy
    return out.clone() if isinstance(out, torch.Tensor) and out._base is not None else out


class AllReduceScatter:
    """FSDP2's gradient reduce-scatter as an all-reduce of the whole flat gradient, keeping this learner's chunk:
    what :func:`shard_model` uses on gloo, whose reduce-scatter cost 0.87-1.06 CPU-s per rank for the 0.54 GB
    gradient of a 135M model where an all-reduce of it cost 0.56-0.62 (two learners, this project's 2-core
    machine). The sums are the reduce-scatter's: each element is the sum of the learners' values (for two learners
    in the same order, so bit for bit). It has the shape of FSDP2's ``ReduceScatter`` comm (``allocate`` and a
    call), whose base class is not public."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A fresh buffer for the reduced chunk."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        """All-reduce ``input_tensor`` (the learners' chunks end to end) in place, then copy this learner's chunk
        into ``output_tensor``; synchronous (FSDP2 calls it so on the CPU)."""
        dist.all_reduce(input_tensor, op=op, group=group)
        output_tensor.copy_(input_tensor.view(dist.get_world_size(group), -1)[dist.get_rank(group)])
        return None


def shard_model(model: nn.Module, offload: Offload = "none", bf16: bool = False) -> None:
    """Shard ``model`` in place over the default process group: ``fully_shard`` each decoder layer
    (:func:`decoder_layers`), then the root (the remaining parameters: embeddings, final norm, output layer, heads),
    on a 1-D mesh of the model's device type (CPU: gloo; CUDA: NCCL, each learner on its own GPU).

    ``bf16``: parameters gathered and computed in bfloat16, float32 master weights, gradients reduced in float32
    (``MixedPrecisionPolicy``). ``offload`` ``params``: parameters, gradients and optimizer state kept on the host
    between uses (``CPUOffloadPolicy``; the optimizer steps on the CPU); ``optimizer`` leaves the model on the
    device (the learner's optimizer is then a :class:`~pickaxe.models.host_optimizer.HostAdamW`). On a CPU device
    both change nothing here. Gradient reduction sums over the learners (divide factor 1; on gloo an all-reduce,
    :class:`AllReduceScatter`). A model on the ``meta`` device
    is sharded on the group's device (:func:`group_device`); :func:`shard_from` then gives its shards memory and
    values.
    """
    if offload not in OFFLOADS:
        raise PickaxeError(f"unknown offload {offload!r}; choose one of {', '.join(OFFLOADS)}")
    if not (dist.is_available() and dist.is_initialized()):
        raise PickaxeError("sharding needs the learners' process group: call pickaxe.dist.data_parallel.init first")
    if isinstance(model, FSDPModule):
        raise PickaxeError(f"{type(model).__name__} is already sharded; shard_model once per model")
    layers = decoder_layers(model)
    device = next(model.parameters()).device
    if device.type == "meta":  # built on the meta device to be filled after sharding: the group's device
        device = group_device()
    mesh = DeviceMesh.from_group(dist.group.WORLD, device.type)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload == "params" and device.type != "cpu":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    gloo = dist.get_backend() == "gloo"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
            if gloo:
                module.set_custom_reduce_scatter(AllReduceScatter())
    object.__setattr__(model, ROOT_CALL, types.MethodType(_run, model))
    register_fsdp_forward_method(model, ROOT_CALL)


def through_root(model: nn.Module, fn: Callable[[], T]) -> T:
    """``fn()`` run as a forward pass of ``model``'s sharded root (its own parameters gathered for it, its
    gradients reduced after the backward pass), for code that calls a sharded model's parts directly (the decoder
    and the output layer of chunked log-probs); plainly ``fn()`` for an unsharded model."""
    call = getattr(model, ROOT_CALL, None)
    if call is None:
        return fn()
    out = call(fn)
    if not torch.is_grad_enabled():  # no backward pass will reshard the root: free its gathered parameters now
        model.reshard()
    return out


def _units(sharded: nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The named parameters of each unit of sharding: each decoder layer's, then the root's remaining ones."""
    names = {id(p): name for name, p in sharded.named_parameters()}
    seen: set[int] = set()
    for layer in decoder_layers(sharded):
        unit = [(names[id(p)], p) for p in layer.parameters() if id(p) in names]
        seen.update(id(p) for _, p in unit)
        yield unit
    yield [(name, p) for name, p in sharded.named_parameters() if id(p) not in seen]


def padded_chunks(shapes: list[tuple[int, ...]], world: int) -> list[int]:
    """The elements of each learner's rows of tensors of ``shapes`` padded to FSDP2's chunk (``ceil(rows / world)``
    rows, :func:`local_rows`): what one learner sends or receives per tensor in a gather or scatter of a unit."""
    return [(-(-s[0] // world) if s else 0) * math.prod(s[1:]) for s in shapes]


def _gather_unit(params: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Full values of the DTensor ``params`` (one dtype) on rank 0, in ONE gather: every learner's shards, padded to
    the chunk size, flattened into one buffer. The other learners send theirs and get None (half an all-gather's
    traffic, and no whole copy of the unit on them)."""
    world = dist.get_world_size()
    shapes = [tuple(p.shape) for p in params]
    chunks = padded_chunks(shapes, world)
    pieces = []
    for p, chunk in zip(params, chunks, strict=True):
        local = p.to_local().detach().reshape(-1)
        pieces.append(torch.nn.functional.pad(local, (0, chunk - local.numel())))
    mine = torch.cat(pieces).to(mesh_device(params[0]))  # an offloaded shard is on the host
    if dist.get_rank() != 0:
        dist.gather(mine, None, dst=0)
        return None
    everyone = torch.empty(world * mine.numel(), dtype=mine.dtype, device=mine.device)
    dist.gather(mine, list(everyone.view(world, -1)), dst=0)
    everyone = everyone.view(world, -1)
    out, offset = [], 0
    for shape, chunk in zip(shapes, chunks, strict=True):
        rows = everyone[:, offset : offset + chunk].reshape(-1)
        out.append(rows[: math.prod(shape)].view(shape))
        offset += chunk
    return out


@torch.no_grad()
def gather_into(sharded: nn.Module, full: nn.Module | None, trainable_only: bool = False) -> int:
    """Copy ``sharded``'s weights into ``full``, rank 0's unsharded twin with the same parameter names (None on the
    other learners): a collective every learner calls. One unit of sharding (a decoder layer, then the root's
    remaining parameters) is gathered to rank 0 at a time, one gather per unit and dtype, never the whole model.
    ``trainable_only``: only parameters with ``requires_grad`` (LoRA's adapters). Returns the bytes gathered."""
    if full is not None and dist.get_rank() != 0:
        raise ValueError("gather_into gathers on rank 0: pass the unsharded twin there, None on the other learners")
    target = dict(full.named_parameters()) if full is not None else {}
    total = 0
    for unit in _units(sharded):
        unit = [(n, p) for n, p in unit if isinstance(p, DTensor) and (p.requires_grad or not trainable_only)]
        for dtype in sorted({p.dtype for _, p in unit}, key=str):
            same = [(n, p) for n, p in unit if p.dtype == dtype]
            values = _gather_unit([p for _, p in same])
            total += sum(p.numel() * p.element_size() for _, p in same)
            if full is not None and values is not None:
                for (name, _), value in zip(same, values, strict=True):
                    target[name].copy_(value)
    return total


def _layout(model: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """Name, (global) shape and dtype of every parameter, then every buffer, of ``model``: what must agree between
    rank 0's whole model and the others' sharded one before :func:`scatter_into` pairs them up."""
    tensors = (*model.named_parameters(), *model.named_buffers())
    return [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]


def _check_layouts(model: nn.Module) -> None:
    """Every learner compares the layout of its model with the others' (a collective); a model built another way
    (another shape or dtype) is a ``PickaxeError`` on every learner alike, instead of a scatter that hangs."""
    layouts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, _layout(model))
    for rank, other in enumerate(layouts):
        if other != layouts[0]:
            diff = next(((a, b) for a, b in zip(layouts[0], other or [], strict=False) if a != b), None)
            raise PickaxeError(
                f"learner {rank} built another model than rank 0 (first difference: {diff}, or "
                f"{len(other)} against {len(layouts[0])} tensors): build every learner's model from the same config"
            )


@torch.no_grad()
def scatter_into(full: nn.Module | None, sharded: nn.Module | None) -> int:
    """Copy rank 0's whole ``full`` into every learner's shards of ``sharded`` (the same parameter names, sharded
    with :func:`shard_model`, e.g. built on the ``meta`` device and given memory with ``to_empty``): the counterpart
    of :func:`gather_into`, a collective every learner calls. One unit of sharding (a decoder layer, then the root's
    remaining parameters) at a time, one ``scatter`` per unit and dtype: rank 0 sends each learner its rows (FSDP2's
    split, padded to the chunk size), so no learner but rank 0 ever holds a whole tensor of the model. Buffers
    (rotary ``inv_freq``: ``to_empty`` leaves them garbage) are broadcast whole. Rank 0 passes ``full`` and its own
    sharded copy, or None for ``sharded`` when it shards ``full`` in place afterwards (its rows then stay where they
    are); the other learners pass None and their sharded model. The values land bit for bit. Returns the bytes of
    the parameters scattered."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if (full is not None) != (rank == 0) or (sharded is None and rank != 0):
        raise ValueError("scatter_into: rank 0 passes its whole model, the others None and their sharded model")
    source = full if full is not None else sharded
    assert source is not None
    _check_layouts(source)
    device = group_device()
    target = dict(sharded.named_parameters()) if sharded is not None else {}
    total = 0
    for unit in _units(source):
        for dtype in sorted({p.dtype for _, p in unit}, key=str):
            same = [(n, p) for n, p in unit if p.dtype == dtype]
            shapes = [tuple(p.shape) for _, p in same]
            chunks = padded_chunks(shapes, world)
            mine = torch.empty(sum(chunks), dtype=dtype, device=device)
            if rank == 0:
                pieces: list[list[torch.Tensor]] = [[] for _ in range(world)]
                for (_, p), shape, chunk in zip(same, shapes, chunks, strict=True):
                    for r in range(world):
                        start, stop = local_rows(shape[0], r, world)
                        piece = p.detach()[start:stop].reshape(-1)
                        pieces[r].append(torch.nn.functional.pad(piece, (0, chunk - piece.numel())))
                dist.scatter(mine, [torch.cat(x).to(device) for x in pieces], src=0)
            else:
                dist.scatter(mine, None, src=0)
            total += sum(math.prod(s) * mine.element_size() for s in shapes)
            offset = 0
            for (name, _), chunk in zip(same, chunks, strict=True):
                if name in target:
                    local = target[name].to_local()
                    local.copy_(mine[offset : offset + local.numel()].view_as(local))
                offset += chunk
    own = dict(sharded.named_buffers()) if sharded is not None else {}
    for name, buffer in source.named_buffers():
        value = buffer.detach().to(device, copy=True) if rank == 0 else torch.empty_like(own[name], device=device)
        dist.broadcast(value, src=0)
        if name in own:
            own[name].copy_(value)
    return total


@torch.no_grad()
def broadcast_module(model: nn.Module) -> None:
    """Rank 0's parameters and buffers of ``model`` into every other learner's (same names, not sharded; a module
    given memory with ``to_empty`` after a meta build), tensor by tensor: a collective every learner calls."""
    _check_layouts(model)
    device = group_device()
    for _, tensor in (*model.named_parameters(), *model.named_buffers()):
        value = tensor.detach().to(device, copy=True)
        dist.broadcast(value, src=0)
        if dist.get_rank() != 0:
            tensor.copy_(value)


def shard_from(model: nn.Module, full: nn.Module | None, offload: Offload = "none", bf16: bool = False) -> nn.Module:
    """Shard ``model`` (:func:`shard_model`) and fill its shards from rank 0's whole ``full``
    (:func:`scatter_into`; None on the other learners): a collective every learner calls. A ``model`` on the
    ``meta`` device gets memory first (``to_empty`` on the group's device; on the host with ``params`` offload on CUDA),
    only for this learner's shards. Returns ``model``."""
    shard_model(model, offload, bf16)
    if is_meta(model):
        device = group_device()
        # FSDP2 offloads shards materialised on the host
        host = torch.device("cpu") if offload == "params" else device
        model.to_empty(device=host)
        if host != device:  # buffers are not offloaded: they compute where the model does
            for module in model.modules():
                for key, buffer in module._buffers.items():
                    if buffer is not None:
                        module._buffers[key] = torch.empty_like(buffer, device=device)
    scatter_into(full, model)
    return model


def _local_piece(value: Any, param: DTensor, device: torch.device | None = None) -> torch.Tensor:
    """This learner's rows of ``value`` (a full tensor or a lazy reader: ``.shape`` and ``value[a:b]``) as the
    local tensor of ``param``'s layout, on ``device`` (default: the local shard's): always a copy (an optimizer
    steps its state in place, which must not reach the caller's tensors)."""
    device = param.to_local().device if device is None else device
    if isinstance(value, DTensor):  # already sharded: this learner's piece if laid out alike, else gathered first
        value = value.to_local() if value.placements == param.placements else value.full_tensor()
        if tuple(value.shape) != tuple(param.shape):
            return value.to(device=device, dtype=param.dtype, copy=True)
    shape = tuple(value.shape)
    if shape != tuple(param.shape):
        raise PickaxeError(
            f"cannot load a {list(shape)} tensor into a {list(param.shape)} parameter: the state is another "
            "model's; load a checkpoint of this model"
        )
    start, stop = local_rows(shape[0], param.device_mesh.get_local_rank(), param.device_mesh.size())
    piece = value[start:stop]
    return torch.as_tensor(piece).to(device=device, dtype=param.dtype, copy=True)


def sharded_like(value: Any, param: DTensor, device: torch.device | None = None) -> DTensor:
    """A DTensor laid out like ``param`` whose local piece is this learner's rows of ``value`` (a full tensor or a
    lazy reader), read with ``value[a:b]`` only, on ``device`` (default: where ``param``'s piece is)."""
    local = _local_piece(value, param, device)
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def full_value(value: Any) -> torch.Tensor:
    """A full tensor of ``value`` (a tensor, a DTensor: gathered, a collective; or a lazy reader: read whole)."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, torch.Tensor):
        return value
    shape = tuple(value.shape)
    return torch.as_tensor(value[0 : shape[0]] if shape else value[()])


@torch.no_grad()
def load_sharded(model: nn.Module, state: dict[str, Any]) -> None:
    """Load ``state`` (parameter and buffer names to full tensors or lazy readers) into ``model``: each learner
    copies its own rows of every sharded parameter (read with ``value[a:b]``) and whole buffers and unsharded
    parameters, without a collective for values that are not DTensors (so an unsharded model, rank 0's whole
    policy, loads the same way). Missing or unexpected names raise ``PickaxeError`` naming them."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise PickaxeError(f"state does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, current in own.items():
        if isinstance(current, DTensor):
            current.to_local().copy_(_local_piece(state[name], current))
        else:
            current.copy_(full_value(state[name]))


def load_sharded_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load ``state`` (an unsharded optimizer's ``state_dict``, or a sharded one's with full tensors or lazy readers
    as values) into ``optimizer``, built over sharded parameters in the same order: every per-parameter tensor
    shaped like its parameter becomes this learner's shard, read into the optimizer's ``state_device`` when it has
    one (``HostAdamW``: host memory) rather than the parameter's; scalars (Adam's ``step``) are kept whole."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    where = getattr(optimizer, "state_device", None)
    per_param = {}
    for index, entry in state.get("state", {}).items():
        param = params[int(index)]
        converted = {}
        for key, value in entry.items():
            if isinstance(param, DTensor) and hasattr(value, "shape") and tuple(value.shape) == tuple(param.shape):
                converted[key] = (
                    value
                    if isinstance(value, DTensor) and value.placements == param.placements
                    else sharded_like(value, param, where)
                )
            elif hasattr(value, "shape") and not isinstance(value, torch.Tensor):
                converted[key] = full_value(value)
            elif isinstance(value, torch.Tensor):  # a copy: the optimizer steps it in place (Adam's step)
                converted[key] = value.clone()
            else:
                converted[key] = value
        per_param[index] = converted
    optimizer.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})
