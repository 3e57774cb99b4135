"""The ``Algorithm`` interface: owns networks and optimizers, learns from Batches."""

from __future__ import annotations

import inspect
import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import optimizer as torch_optimizer

from pickaxe.data.batch import Batch
from pickaxe.errors import NonFiniteError
from pickaxe.models.policy import Policy
from pickaxe.models.sharding import local_tensor, mesh_device


def first_nonfinite(named: Any, grads: bool = False) -> str | None:
    """Name of the first parameter (or its gradient) holding NaN/Inf, if any. With sharded parameters (DTensors)
    a collective: every learner checks its shards and they agree on the same name."""
    named = list(named)
    what = "gradient of " if grads else "parameter "
    tensors = [(p.grad if grads else p) for _, p in named]
    if any(isinstance(t, DTensor) for t in tensors):
        local = [None if t is None else local_tensor(t) for t in tensors]
        device = mesh_device(next(t for t in tensors if t is not None))
        bad = [torch.zeros((), device=device) if t is None else (~torch.isfinite(t)).any().float() for t in local]
        flags = all_reduce(torch.stack([b.to(device) for b in bad]), "max").tolist() if bad else []
        return next((f"{what}{name}" for (name, _), flag in zip(named, flags, strict=True) if flag > 0), None)
    for (name, _), t in zip(named, tensors, strict=True):
        if t is not None and not torch.isfinite(t).all():
            return f"{what}{name}"
    return None


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are sharded across the learners (FSDP2's DTensors: ``--dist.shard fsdp``).
    Their gradients are already summed over the learners by the backward pass (a reduce-scatter)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``grads`` together. Over sharded gradients (DTensors) the full norm: each learner's sum
    of squares of its shards, summed over the learners (a collective, on the mesh's device: offloaded shards are on
    the host)."""
    first = grads[0] if grads else None
    if first is not None and type(first) is torch.Tensor and first.device.type in ("cpu", "cuda"):
        device, dtype = first.device, first.dtype
        if all(type(g) is torch.Tensor and g.device == device and g.dtype == dtype for g in grads):
            # get_total_norm's own ops for one device and dtype, without its grouping (the same values)
            return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    sharded = [g for g in grads if isinstance(g, DTensor)]
    if not sharded:
        return nn.utils.get_total_norm(grads)
    device = mesh_device(sharded[0])
    squares = [torch.linalg.vector_norm(g.to_local(), dtype=torch.float32).pow(2).to(device) for g in sharded]
    total = all_reduce(torch.stack(squares).sum())
    plain = [g for g in grads if not isinstance(g, DTensor)]
    if plain:
        total = total + nn.utils.get_total_norm(plain).float().to(device).pow(2)
    return total.sqrt()


def clip_with_norm(
    params: list[torch.Tensor], max_norm: float, norm: torch.Tensor, norm_value: float | None = None
) -> None:
    """Scale the gradients of ``params`` so that their total norm ``norm`` is at most ``max_norm``
    (``clip_grads_with_norm_``; the factor moved to where the gradients are, for shards offloaded to the host).
    Given ``norm_value`` (``norm`` already read on the host), a norm clearly below ``max_norm`` (or an infinite
    ``max_norm``) skips the scaling: its factor would be clamped to exactly 1, and ``x * 1`` is ``x``."""
    if norm_value is not None and (norm_value + 1e-6) * (1.0 + 1e-5) < max_norm:
        return
    grad = params[0].grad
    device = grad.to_local().device if isinstance(grad, DTensor) else grad.device
    nn.utils.clip_grads_with_norm_(params, max_norm, norm.to(device))


def reduce_sums(values: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The tensors of ``values`` (None kept) summed over the learner group in ONE collective, as float32."""
    present = [v.detach().float().reshape(-1) for v in values if v is not None]
    if not present:
        return values
    bucket = all_reduce(torch.cat(present))
    out: list[torch.Tensor | None] = []
    offset = 0
    for v in values:
        if v is None:
            out.append(None)
        else:
            out.append(bucket[offset : offset + v.numel()].view_as(v))
            offset += v.numel()
    return out


def all_finite(tensors: Any) -> bool:
    """Whether every tensor of ``tensors`` is free of NaN/Inf, in one host read (not one per tensor).

    Plain floating-point tensors are summed first, one reduction each instead of ``isfinite``'s several ops: a NaN
    or an infinity anywhere makes the total NaN or infinite, so a finite total is the answer; only a non-finite one
    (a NaN, or finite values whose sum overflows) is checked element by element."""
    tensors = list(tensors)
    if tensors and all(type(t) in (torch.Tensor, nn.Parameter) and t.is_floating_point() for t in tensors):
        device = tensors[0].device
        if bool(torch.isfinite(torch.stack([t.sum().float().to(device) for t in tensors]).sum())):
            return True
    flags = [torch.isfinite(t).all() for t in tensors]
    return not flags or bool(torch.stack([f.to(flags[0].device) for f in flags]).all())


def data_parallel() -> tuple[int, int]:
    """``(rank, world size)`` of the data-parallel learner group (``torch.distributed``'s default group, set up by
    ``pickaxe.dist.data_parallel``), ``(0, 1)`` without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def my_share(count: int) -> range:
    """The indices, of ``count`` micro-batches (or minibatch chunks), that this learner computes: every ``world``-th
    one from its rank (all of them without a group). The loss normalisers stay the whole step's counts, so the
    summed gradients of all learners are the single-process gradient."""
    rank, world = data_parallel()
    return range(rank, count, world)


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``tensor`` summed (``op="sum"``) or maxed (``"max"``) over the learner group, in place, and returned; a
    no-op without a group. A collective, not a host read: on CUDA it runs on the stream without waiting."""
    if data_parallel()[1] > 1:
        reduce_op = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
        torch.distributed.all_reduce(tensor, op=reduce_op)
    return tensor


def all_reduce_gradients(
    params: list[torch.Tensor], sums: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Sum the gradients of ``params`` and the tensor ``sums`` (per-learner partial losses and metric sums) over
    the learner group in ONE collective on one flattened buffer (float32, or float64 if a gradient is), not one
    per parameter. Every parameter's ``grad`` becomes its view of the summed buffer, zeros where no learner had
    one. Returns the summed ``sums`` and ``[len(params)]`` flags, > 0 where some learner had a gradient: read them
    with the step's other values and pass them to :func:`drop_absent_gradients` (no extra host read here)."""
    device = params[0].device if params else sums.device if sums is not None else torch.device("cpu")
    wide = any(p.grad is not None and p.grad.dtype == torch.float64 for p in params)
    dtype = torch.float64 if wide else torch.float32
    grads = [
        p.grad.detach().reshape(-1).to(dtype)
        if p.grad is not None
        else torch.zeros(p.numel(), dtype=dtype, device=device)
        for p in params
    ]
    flags = torch.tensor([float(p.grad is not None) for p in params], dtype=dtype, device=device)
    tail = [] if sums is None else [sums.detach().reshape(-1).to(device=device, dtype=dtype)]
    bucket = all_reduce(torch.cat([*grads, flags, *tail]))
    offset = 0
    for p in params:
        p.grad = bucket[offset : offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
    flags = bucket[offset : offset + len(params)]
    offset += len(params)
    summed = None if sums is None else bucket[offset:].to(sums.dtype).view_as(sums)
    return summed, flags


def drop_absent_gradients(params: list[torch.Tensor], flags: list[float]) -> list[torch.Tensor]:
    """Set ``grad`` to None where ``flags`` (read from :func:`all_reduce_gradients`) say no learner had one, as in
    one process, where the optimizer then skips the parameter; returns the parameters that keep a gradient."""
    kept = []
    for p, flag in zip(params, flags, strict=True):
        if flag > 0:
            kept.append(p)
        else:
            p.grad = None
    return kept


@dataclass
class StepPlan:
    """What :func:`clip_and_step` finds once per optimizer rather than every step: the module it clips (weakly
    held: a plan for another module is found afresh), that module's parameters, whether they are sharded
    (DTensors), and the number of parameter groups the optimizer had. Sharding a module (``shard()``) builds a new
    optimizer over its new parameters, so a new plan."""

    module: weakref.ref
    params: list[nn.Parameter]
    sharded: bool
    groups: int


PLANS: weakref.WeakKeyDictionary[torch.optim.Optimizer, StepPlan] = weakref.WeakKeyDictionary()


def step_plan(module: nn.Module, optimizer: torch.optim.Optimizer) -> StepPlan:
    """The cached :class:`StepPlan` of ``module`` stepped by ``optimizer`` (made on first use, or when either
    changed: another module, a parameter group added)."""
    plan = PLANS.get(optimizer)
    if plan is None or plan.module() is not module or plan.groups != len(optimizer.param_groups):
        params = list(module.parameters())
        sharded = any(isinstance(p, DTensor) for p in params)
        plan = StepPlan(weakref.ref(module), params, sharded, len(optimizer.param_groups))
        PLANS[optimizer] = plan
    return plan


def clear_grads(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=True)``: every gradient of its parameters set to None (a plain loop,
    without the profiler scope ``zero_grad`` opens on every call)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


def unhooked_step(optimizer: torch.optim.Optimizer) -> Callable[[], Any] | None:
    """``optimizer.step`` as the optimizer class defines it, without the wrappers torch puts around every call
    (a profiler scope, the hook loops, the grad-mode switch; ``step_once`` runs it under ``no_grad`` as they
    would), or None when anything hooks into the step (step hooks, global or the optimizer's, or an instance
    ``step`` such as an LR scheduler's counter) or the optimizer is differentiable: then ``optimizer.step`` runs
    as usual."""
    hooks = (
        getattr(torch_optimizer, "_global_optimizer_pre_hooks", True),
        getattr(torch_optimizer, "_global_optimizer_post_hooks", True),
        getattr(optimizer, "_optimizer_step_pre_hooks", True),
        getattr(optimizer, "_optimizer_step_post_hooks", True),
    )
    if any(hooks) or "step" in vars(optimizer) or optimizer.defaults.get("differentiable", False):
        return None
    step = type(optimizer).step
    if not getattr(step, "hooked", False):
        return None
    raw = inspect.unwrap(step)
    return lambda: raw(optimizer)


def plain_fused_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a ``torch.optim.Adam`` (the class itself) with ``fused=True`` in its plain form: no
    AMSGrad, no decoupled weight decay, not capturable or differentiable, float learning rates and betas, and no
    gradient scaler attached (``grad_scale``/``found_inf``). Its step is then :func:`fused_adam_step`'s."""
    if type(optimizer) is not torch.optim.Adam or hasattr(optimizer, "grad_scale") or hasattr(optimizer, "found_inf"):
        return False
    for group in optimizer.param_groups:
        flags = (group["amsgrad"], group["capturable"], group["differentiable"], group.get("decoupled_weight_decay"))
        if not group["fused"] or any(flags):
            return False
        if any(isinstance(v, torch.Tensor) for v in (group["lr"], *group["betas"])):
            return False
    return True


def fused_adam_step(optimizer: torch.optim.Optimizer) -> bool:
    """The step of a :func:`plain_fused_adam` optimizer as ``Adam.step`` runs it, minus its Python: per parameter
    group the parameters with a gradient and their state, grouped by device and dtype (torch's own grouping), the
    step counters incremented and ``torch._fused_adam_`` called with the group's settings (the same kernels with
    the same arguments, so the same update bit for bit). Returns False, having done nothing, when a parameter with a
    gradient has no state yet (its first step: ``Adam.step`` creates it)."""
    state = optimizer.state
    work = []
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        states = [state.get(p) for p in params]
        if not all(states):
            return False
        if params:
            work.append((group, params, states))
    for group, params, states in work:
        grads = [p.grad for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        steps = [s["step"] for s in states]
        beta1, beta2 = group["betas"]
        lists = [params, grads, exp_avgs, exp_avg_sqs, [], steps]
        for (p, g, m, v, _, t), _ in torch._C._group_tensors_by_device_and_dtype(lists, False).values():
            torch._foreach_add_(t, 1)
            torch._fused_adam_(
                p,
                g,
                m,
                v,
                [],
                t,
                amsgrad=False,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                grad_scale=None,
                found_inf=None,
            )
    return True


def step_once(optimizer: torch.optim.Optimizer) -> None:
    """One ``optimizer.step()``, through :func:`unhooked_step` where nothing hooks into it (the same update), and
    for a plain fused Adam through :func:`fused_adam_step`."""
    raw = unhooked_step(optimizer)
    if raw is None:
        optimizer.step()
        return
    with torch.no_grad():
        if plain_fused_adam(optimizer) and fused_adam_step(optimizer):
            return
        raw()


def clip_and_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    loss: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
    name: str = "loss",
    sums: torch.Tensor | None = None,
    reduce: bool = False,
) -> list[float]:
    """Clip ``module``'s gradients to ``max_grad_norm`` and step, refusing a non-finite ``loss`` or gradient first.

    The step's one host synchronisation reads, together: the total gradient norm (which clipping needs anyway, and
    which is NaN/Inf exactly when some gradient is), ``loss`` (the step's summed loss), ``extra`` (any metric
    tensors the caller wants read at the same time) and ``sums`` (metric sums). On a bad value the gradients are
    dropped and ``NonFiniteError`` names the first non-finite parameter or gradient (or ``name = value``), before
    clipping (which would spread a NaN to every gradient) and before ``optimizer.step()``, so weights and optimizer
    state stay as they were. Returns ``[grad_norm, loss (if given), *extra, *sums]`` as floats, the norm before
    clipping.

    With ``reduce`` and a data-parallel learner group (:func:`data_parallel`), the gradients, ``loss`` and ``sums``
    are this learner's share: they are summed over the group first, in one collective, so every learner reads the
    same norm and loss, makes the same decision (a non-finite step is refused on all of them or none) and steps
    the same weights. ``extra`` is read as it is (values every learner computed alike). With sharded parameters
    (:func:`is_sharded`) the gradients are already summed (FSDP's reduce-scatter): ``loss`` and ``sums`` are summed
    in one collective and the norm is the full one over every learner's shards.
    """
    present = None
    plan = step_plan(module, optimizer)
    if plan.sharded:
        params = [p for p in plan.params if p.grad is not None]
        if data_parallel()[1] > 1:
            loss, sums = reduce_sums([loss, sums])
    elif reduce and data_parallel()[1] > 1:
        params = [p for p in plan.params if p.requires_grad]
        local = [t.detach().float().reshape(-1) for t in (loss, sums) if t is not None]
        summed, present = all_reduce_gradients(params, torch.cat(local) if local else None)
        if summed is not None and loss is not None:
            loss, sums = summed[:1], (summed[1:] if sums is not None else None)
        elif summed is not None:
            sums = summed
    else:
        params = [p for p in plan.params if p.grad is not None]
    norm = total_norm([p.grad for p in params]) if params else torch.zeros(())
    parts = [norm.detach().float().reshape(1)]
    parts += [t.detach().float().reshape(-1).to(norm.device) for t in (loss, extra, sums, present) if t is not None]
    values = torch.cat(parts).tolist()
    if present is not None:  # the flags came last in the one read
        k = len(params)
        params = drop_absent_gradients(params, values[len(values) - k :])
        values = values[: len(values) - k]
    what = None
    if loss is not None and not math.isfinite(values[1]):
        what = first_nonfinite(module.named_parameters()) or f"{name} = {values[1]}"
    elif not math.isfinite(values[0]):
        what = first_nonfinite(module.named_parameters(), grads=True) or f"gradient norm = {values[0]}"
    if what is not None:
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(what)
    if params:
        clip_with_norm(params, max_grad_norm, norm, values[0])
    step_once(optimizer)
    return values


def guarded_step(
    loss: torch.Tensor, module: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, name: str = "loss"
) -> torch.Tensor:
    """Backward, clip and step, refusing (``NonFiniteError``) a non-finite loss or gradient before
    ``optimizer.step()`` (see :func:`clip_and_step`: one host read per step), so a bad update never reaches the
    weights. Returns the gradient norm before clipping (a CPU tensor)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return torch.tensor(clip_and_step(module, optimizer, max_grad_norm, loss, name=name)[0])


class Algorithm(ABC):
    """Base class of every learner.

    ``policy`` is what the collector acts with (exploration included) and what evaluation calls with
    ``deterministic=True``. ``update`` takes the freshly collected ``Batch`` and returns scalar metrics;
    on-policy algorithms learn from it directly, off-policy ones store it in their replay buffer first,
    so the Trainer's loop is the same for both.
    """

    policy: Policy
    supports_sharding: ClassVar[bool] = False
    """Whether the algorithm can train with its parameters, gradients and optimizer state sharded across the
    learners (``--dist.shard fsdp``: ``shard()`` is called on every learner once the group exists)."""
    supports_data_parallel: ClassVar[bool] = False
    """Whether ``update`` splits its work among data-parallel learners (each computes its share of every optimizer
    step and the gradients are summed). An algorithm without it runs its whole update on every learner (correct,
    with no speed-up); ``pickaxe.dist.data_parallel`` refuses to launch it on several learners."""

    def set_progress(self, step: int, total_steps: int) -> None:  # noqa: B027 - optional hook
        """Called before each collect with env steps so far, for schedules (learning rate, epsilon, ...)."""

    @abstractmethod
    def update(self, batch: Batch) -> dict[str, float]:
        """Learn from one collected batch; return metrics (namespaced, e.g. ``loss/policy``)."""

    @abstractmethod
    def networks(self) -> dict[str, nn.Module]:
        """The modules whose weights make the model checkpoint, by name."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue learning exactly (networks, optimizers, buffers, counters)."""
        return {name: net.state_dict() for name, net in self.networks().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        for name, net in self.networks().items():
            net.load_state_dict(state[name])
