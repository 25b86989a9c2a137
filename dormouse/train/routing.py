"""THE optimizer routing policy: which parameter goes to which optimizer. There is no second copy.

`route(model)` walks the model once and puts every trainable parameter in exactly one group:

    matrices        2-D weights of nn.Linear modules (the hidden matrices)           NesterovSinkhorn
    adamw_decay     2-D embeddings (nn.Embedding weights) and the LM head             AdamW, weight decay
    adamw_no_decay  every parameter of ndim ≤ 1 (norm gains, biases, A_log, dt_bias,  AdamW, no decay
                    AttnRes pseudo-queries, gate vectors, scalars) and depthwise conv
                    filters [C, 1, k]
    sparse          Engram tables (declared; updated row-wise, no decay)              SparseRowAdam

The rules look at shapes and at the type of the module that owns a parameter, never at its name, and
at one module by its place: the model's `lm_head` (an untied head is an nn.Linear, but an output head,
not a hidden matrix: its parameters go to adamw_decay; a head tied to the embedding is an embedding). A
special case is declared next to the parameter, by its owner, and wins over the rules:

    self.head._dormouse_route = "adamw_decay"                 # module: all of its own (direct) parameters
    self.head._dormouse_route = {"weight": "adamw_decay"}     # module: some of them, by attribute name
    self.scale._dormouse_route = "adamw_no_decay"             # the parameter itself

A parameter's own attribute wins over its module's. Prefer the module form: torch drops attributes set
on a Parameter when it copies it (`copy.deepcopy`, and `.to()` under swap_tensors / FSDP2), while a
module's attribute travels with the module.

A parameter the rules cannot place (a loose 2-D or 4-D tensor, a stacked expert tensor) is refused with
its name, shape and owner: declare it. A tensor reachable under two names (tied weights) is routed
once, under the first name `named_parameters()` gives. `opt="adamw"` moves the matrices onto AdamW
(with weight decay); sparse tables stay on SparseRowAdam, the row-wise (lazy) Adam, under both: torch's
AdamW refuses sparse gradients, and a dense one would cost the whole table every step.
"""

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from dormouse.errors import CheckpointError
from dormouse.train.optim import NesterovSinkhorn
from dormouse.train.sparse import SparseRowAdam

ROUTES = ("matrices", "adamw_decay", "adamw_no_decay", "sparse")
OPTIMIZER = {
    "matrices": "NesterovSinkhorn",
    "adamw_decay": "AdamW",
    "adamw_no_decay": "AdamW",
    "sparse": "SparseRowAdam",
}
WEIGHT_DECAY = {"matrices": True, "adamw_decay": True, "adamw_no_decay": False, "sparse": False}
OPTS = ("sinkhorn", "adamw")
ATTR = "_dormouse_route"


@dataclass
class Group:
    name: str
    optimizer: str
    params: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    weight_decay: bool = False

    @property
    def numel(self) -> int:
        return sum(p.numel() for _, p in self.params)


def route(model: nn.Module, opt: str = "sinkhorn") -> list[Group]:
    """Every trainable parameter of `model` in exactly one group; groups in ROUTES order, empty ones left out."""
    if opt not in OPTS:
        raise ValueError(f"unknown opt {opt!r}; choose one of {OPTS}")
    owners = _owners(model)
    head = getattr(model, "lm_head", None)
    heads = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    groups = {name: Group(name, OPTIMIZER[name], weight_decay=WEIGHT_DECAY[name]) for name in ROUTES}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        where = _route_one(name, p, owners[id(p)], id(p) in heads)
        if opt == "adamw" and where == "matrices":
            where = "adamw_decay"
        groups[where].params.append((name, p))
    return [g for g in groups.values() if g.params]


def _owners(model: nn.Module) -> dict[int, list[tuple[str, nn.Module, str]]]:
    """id(param) -> every (module name, module, attribute name) that holds it directly."""
    out: dict[int, list] = defaultdict(list)
    seen = set()
    for mname, mod in model.named_modules(remove_duplicate=False):
        for local, p in mod.named_parameters(recurse=False):
            if (id(p), id(mod), local) not in seen:
                seen.add((id(p), id(mod), local))
                out[id(p)].append((mname, mod, local))
    return out


def _route_one(name: str, p: nn.Parameter, owners: list[tuple[str, nn.Module, str]], head: bool) -> str:
    declared = _declared(name, p, owners)
    shape = tuple(p.shape)
    if declared is not None:
        if declared == "matrices" and p.ndim != 2:
            raise ValueError(f"parameter {name} {shape} is declared 'matrices' but is not 2-D")
        return declared
    if head:
        return "adamw_decay"  # the model's lm_head: an output head, not a hidden matrix
    if p.ndim <= 1:
        return "adamw_no_decay"
    kinds = {(type(mod), local) for _, mod, local in owners}
    if p.ndim == 2 and any(issubclass(t, nn.Embedding | nn.EmbeddingBag) and loc == "weight" for t, loc in kinds):
        return "adamw_decay"  # a head tied to the embedding lands here too
    if p.ndim == 2 and any(issubclass(t, nn.Linear) and loc == "weight" for t, loc in kinds):
        return "matrices"
    if p.ndim == 3 and p.shape[1] == 1:
        return "adamw_no_decay"  # depthwise conv filters [C, 1, k]: per-channel, not matrices
    held_by = ", ".join(f"{mname or '<root>'}.{local} ({type(mod).__name__})" for mname, mod, local in owners)
    raise ValueError(
        f"cannot route parameter {name} of shape {shape} held by {held_by}: no rule places it; declare "
        f"{ATTR} = one of {ROUTES} on its module (or on the parameter) next to where it is created"
    )


def _declared(name: str, p: nn.Parameter, owners: list[tuple[str, nn.Module, str]]) -> str | None:
    own = getattr(p, ATTR, None)
    if own is not None:
        return _check(own, f"{name}.{ATTR}")
    found = {}
    for mname, mod, local in owners:
        decl = getattr(mod, ATTR, None)
        if isinstance(decl, dict):
            decl = decl.get(local)
        if decl is not None:
            found[f"{mname or '<root>'}.{ATTR}"] = _check(decl, f"{mname or '<root>'}.{ATTR}")
    if len(set(found.values())) > 1:
        raise ValueError(f"parameter {name} is declared into different groups by its owners: {found}")
    return next(iter(found.values()), None)


def _check(route: object, where: str) -> str:
    if route not in ROUTES:
        raise ValueError(f"{where} = {route!r} is not a route; choose one of {ROUTES}")
    return route


def describe(groups: list[Group]) -> str:
    """The trainer's start-up lines: `group <name>: <n> tensors, <n> params, <optimizer>`."""
    return "\n".join(f"group {g.name}: {len(g.params)} tensors, {g.numel} params, {g.optimizer}" for g in groups)


class Optimizers:
    """The optimizers of one model, driven as one: AdamW (both adamw groups) and NesterovSinkhorn (matrices).

    `set_lr(multiplier)` sets every group's lr to its base lr times the schedule's multiplier. The state
    dict carries the optimizer state (moments, step counts) and the group layout, which a load checks;
    hyperparameters (lr, betas, weight decay) come from the config this object was built with. Like
    torch's, the state dict holds references to live tensors: serialise it before stepping again.
    A checkpoint uses `split_state_dict`: the sparse tables' per-row state goes apart, to travel with
    the tables.
    """

    def __init__(self, groups: list[Group], optimizers: dict[str, torch.optim.Optimizer], base_lr: dict[str, float]):
        self.groups = groups
        self.optimizers = optimizers
        self.base_lr = base_lr
        self.multiplier = 1.0

    def layout(self) -> list[list]:
        return [[g.name, [n for n, _ in g.params]] for g in self.groups]

    def set_lr(self, multiplier: float) -> None:
        self.multiplier = multiplier
        for opt in self.optimizers.values():
            for pg in opt.param_groups:
                pg["lr"] = self.base_lr[pg["name"]] * multiplier

    def lrs(self) -> dict[str, float]:
        return {pg["name"]: pg["lr"] for opt in self.optimizers.values() for pg in opt.param_groups}

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"layout": self.layout(), **{k: opt.state_dict() for k, opt in self.optimizers.items()}}

    def split_state_dict(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """`state_dict()` without the sparse tables' per-row state, and that state on its own.

        The row-wise moments and step counts are as large as the tables, so they travel with them (the
        engram file) rather than in optimizer.pt: returns (the rest, {"<param name>.<key>": tensor}).
        The rest lists the keys it left out under "sparse_tensors", so a load without them is refused.
        """
        state = self.state_dict()
        if "sparse" not in state:
            return state, {}
        names = self._names("sparse")
        sparse = state["sparse"]
        tensors = {f"{names[i]}.{key}": t for i, per_row in sparse["state"].items() for key, t in per_row.items()}
        return {**state, "sparse": {**sparse, "state": {}}, "sparse_tensors": sorted(tensors)}, tensors

    def load_split_state_dict(self, state: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Load what `split_state_dict` returned (the tables' state read back from their file)."""
        state = dict(state)
        listed = state.pop("sparse_tensors", [])
        if sorted(tensors) != listed:
            raise CheckpointError(
                f"the optimizer state lists sparse table state {listed}, the tables' file holds {sorted(tensors)}"
            )
        self._check_layout(state)
        if tensors:
            index = {name: i for i, name in enumerate(self._names("sparse"))}
            per_param: dict[int, dict] = {}
            for key, t in tensors.items():
                name, field_name = key.rsplit(".", 1)
                per_param.setdefault(index[name], {})[field_name] = t
            state["sparse"] = {**state["sparse"], "state": per_param}
        self.load_state_dict(state)

    def _names(self, group: str) -> list[str]:
        """The parameter names of one group, in its optimizer's order."""
        return next(names for name, names in self.layout() if name == group)

    def _check_layout(self, state: dict) -> None:
        if state.get("layout") != self.layout():
            raise ValueError(
                f"optimizer state has group layout {_summary(state.get('layout'))}; "
                f"this model routes to {_summary(self.layout())}"
            )

    def load_state_dict(self, state: dict) -> None:
        self._check_layout(state)
        for key, opt in self.optimizers.items():
            hparams = [{k: v for k, v in pg.items() if k != "params"} for pg in opt.param_groups]
            opt.load_state_dict(state[key])
            for pg, h in zip(opt.param_groups, hparams, strict=True):
                pg.update(h)


def _summary(layout) -> str:
    if not isinstance(layout, list):
        return repr(layout)
    return ", ".join(f"{name}: {len(names)} tensors" for name, names in layout)


def build_optimizers(
    groups: list[Group],
    cfg,
    *,
    momentum: float = 0.95,
    sinkhorn_iters: int = 5,
    capturable: bool = False,
    fused: bool | None = None,
) -> Optimizers:
    """One AdamW (betas (0.9, 0.95), eps 1e-8) for the adamw groups, one NesterovSinkhorn for the matrices.

    `cfg` has `lr`, `weight_decay` and `sinkhorn_lr_scale`. Base lrs: `lr` for AdamW, `lr · sinkhorn_lr_scale`
    for matrices (config.py says why the scale).
    `capturable`: NesterovSinkhorn reads its lr from device tensors, for a CUDA graph (train/graphed_update.py).
    `fused`: AdamW's fused kernel (one launch for all tensors; it can skip a step on the device, which a
    graphed update needs); None: on CUDA only, the CPU keeping torch's default (foreach) arithmetic.
    """
    base_lr, adamw_groups, optimizers = {}, [], {}
    for g in groups:
        params = [p for _, p in g.params]
        wd = cfg.weight_decay if g.weight_decay else 0.0
        if g.optimizer == "AdamW":
            base_lr[g.name] = cfg.lr
            adamw_groups.append({"params": params, "weight_decay": wd, "name": g.name})
        elif g.optimizer == "NesterovSinkhorn":
            base_lr[g.name] = cfg.lr * cfg.sinkhorn_lr_scale
            optimizers["matrices"] = NesterovSinkhorn(
                [{"params": params, "name": g.name}],
                lr=base_lr[g.name],
                momentum=momentum,
                weight_decay=wd,
                iters=sinkhorn_iters,
                capturable=capturable,
            )
        elif g.optimizer == "SparseRowAdam":
            base_lr[g.name] = cfg.lr
            optimizers["sparse"] = SparseRowAdam([{"params": params, "name": g.name}], lr=cfg.lr, betas=(0.9, 0.95))
        else:
            raise NotImplementedError(
                f"group {g.name} ({len(g.params)} tensors, e.g. {g.params[0][0]}) needs the {g.optimizer} "
                "optimizer, which does not exist yet"
            )
    if adamw_groups:
        for pg in adamw_groups:
            pg["lr"] = base_lr[pg["name"]]
        if fused is None:
            fused = all(p.is_cuda for pg in adamw_groups for p in pg["params"])
        optimizers["adamw"] = torch.optim.AdamW(adamw_groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    return Optimizers(groups, dict(sorted(optimizers.items())), base_lr)
