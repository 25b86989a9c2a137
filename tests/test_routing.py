import copy

import pytest
import torch
from torch import nn

from dormouse import rng
from dormouse.model.attnres import AttnRes
from dormouse.model.ffn import MoE
from dormouse.model.kda_layer import KDALayer
from dormouse.resolve import resolve
from dormouse.train.routing import describe, route


class Gain(nn.Module):
    """RMSNorm-like: one gain vector."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(4))  # loose vector
        self.temperature = nn.Parameter(torch.tensor(1.0))  # loose scalar
        self.frozen = nn.Parameter(torch.zeros(3), requires_grad=False)
        self.scale = nn.Parameter(torch.ones(16, 1))  # a loose 2-D tensor, declared on the parameter itself
        self.scale._dormouse_route = "adamw_no_decay"
        self.emb = nn.Embedding(256, 16)
        self.hidden = nn.Linear(16, 32)
        self.norm = Gain(16)
        self.conv = nn.Conv1d(32, 32, 4, groups=32)  # depthwise: weight [32, 1, 4]
        self.lm_head = nn.Linear(16, 256, bias=False)  # the LM head, routed by its place (undeclared)
        self.tied_head = nn.Linear(16, 256, bias=False)
        self.tied_head.weight = self.emb.weight  # the same tensor under a second name
        self.table = nn.Embedding(64, 8)
        self.table._dormouse_route = "sparse"  # an Engram-like table


DEFAULT = {
    "A_log": "adamw_no_decay",
    "temperature": "adamw_no_decay",
    "scale": "adamw_no_decay",
    "emb.weight": "adamw_decay",
    "hidden.weight": "matrices",
    "hidden.bias": "adamw_no_decay",
    "norm.weight": "adamw_no_decay",
    "conv.weight": "adamw_no_decay",
    "conv.bias": "adamw_no_decay",
    "lm_head.weight": "adamw_decay",
    "table.weight": "sparse",
}


def table(groups) -> dict[str, str]:
    return {name: g.name for g in groups for name, _ in g.params}


def test_default_policy_pinned():
    model = Toy()
    groups = route(model)
    assert table(groups) == DEFAULT
    assert [(g.name, g.optimizer, g.weight_decay) for g in groups] == [
        ("matrices", "NesterovSinkhorn", True),
        ("adamw_decay", "AdamW", True),
        ("adamw_no_decay", "AdamW", False),
        ("sparse", "SparseRowAdam", False),
    ]
    # Every trainable tensor exactly once (the tied one under its first name), the frozen one nowhere.
    ids = [id(p) for g in groups for _, p in g.params]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters() if p.requires_grad}
    assert id(model.frozen) not in ids


def test_opt_adamw_puts_everything_but_sparse_tables_on_adamw():
    groups = route(Toy(), opt="adamw")
    want = {n: ("adamw_decay" if g == "matrices" else g) for n, g in DEFAULT.items()}
    assert table(groups) == want
    assert {g.optimizer for g in groups} == {"AdamW", "SparseRowAdam"}  # row-wise Adam: sparse grads


def test_describe():
    assert describe(route(Toy())) == "\n".join(
        [
            "group matrices: 1 tensors, 512 params, NesterovSinkhorn",
            "group adamw_decay: 2 tensors, 8192 params, AdamW",
            "group adamw_no_decay: 7 tensors, 229 params, AdamW",  # 4 + 1 + 16 + 32 + 16 + 128 + 32
            "group sparse: 1 tensors, 512 params, SparseRowAdam",
        ]
    )


def test_unroutable_parameters_are_refused_with_name_and_shape():
    cases = {
        "loose 2-D": nn.Parameter(torch.zeros(4, 8)),
        "stacked experts": nn.Parameter(torch.zeros(3, 4, 8)),
        "4-D": nn.Parameter(torch.zeros(2, 2, 2, 2)),
    }
    for what, p in cases.items():
        model = Toy()
        model.mystery = p
        with pytest.raises(ValueError, match=rf"cannot route parameter mystery of shape {tuple(p.shape)}"[:40]):
            route(model)
        p._dormouse_route = "adamw_decay"  # declaring it is the fix
        assert table(route(model))["mystery"] == "adamw_decay", what


def test_bad_declarations_are_refused():
    model = Toy()
    model.hidden._dormouse_route = "adam"
    with pytest.raises(ValueError, match=r"hidden._dormouse_route = 'adam' is not a route"):
        route(model)
    model = Toy()
    model.norm.weight._dormouse_route = "matrices"
    with pytest.raises(ValueError, match=r"norm.weight \(16,\) is declared 'matrices' but is not 2-D"):
        route(model)
    model = Toy()
    model.tied_head._dormouse_route = "adamw_no_decay"  # the tied tensor, declared twice, two ways
    model.emb._dormouse_route = "adamw_decay"
    with pytest.raises(ValueError, match="emb.weight is declared into different groups"):
        route(model)
    with pytest.raises(ValueError, match="unknown opt 'sgd'"):
        route(Toy(), opt="sgd")


def test_declaration_forms_and_precedence():
    model = Toy()
    model.hidden._dormouse_route = {"bias": "adamw_decay"}  # dict form: only the bias
    model.emb.weight._dormouse_route = "adamw_no_decay"  # the parameter's own wins over rules and modules
    model.emb._dormouse_route = "adamw_decay"
    got = table(route(model))
    assert got["hidden.weight"] == "matrices" and got["hidden.bias"] == "adamw_decay"
    assert got["emb.weight"] == "adamw_no_decay"


def test_module_declarations_survive_a_copy_parameter_ones_do_not():
    # Why the docstring prefers the module form: torch drops a Parameter's attributes on deepcopy.
    with pytest.raises(ValueError, match=r"cannot route parameter scale of shape \(16, 1\)"):
        route(copy.deepcopy(Toy()))  # Toy declares `scale` on the parameter
    model = Toy()
    model._dormouse_route = {"scale": "adamw_no_decay"}  # the same declaration, on the owning module
    model.extra = nn.Linear(4, 4)
    model.extra.weight._dormouse_route = "adamw_decay"
    got = table(route(copy.deepcopy(model)))
    assert got["scale"] == "adamw_no_decay"
    assert got["lm_head.weight"] == "adamw_decay" and got["table.weight"] == "sparse"
    assert got["extra.weight"] == "matrices"  # the parameter's declaration did not travel


def test_real_layers_route_by_rules_and_their_declarations():
    gen = rng.generator(0, 0, "init")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = KDALayer(32, 2, 16, generator=gen)
            self.ffn = MoE(32, 64, n_experts=2, top_k=1, generator=gen)
            self.res = AttnRes(32, eps=1e-6, generator=gen)

    groups = route(Block())
    got = table(groups)
    for name in ["A_log", "dt_bias", "q_conv.weight", "g_b.bias", "o_norm.norm.weight"]:
        assert got[f"mixer.{name}"] == "adamw_no_decay", name
    for name in ["q_proj.weight", "f_a.weight", "f_b.weight", "b_proj.weight", "g_b.weight", "o_proj.weight"]:
        assert got[f"mixer.{name}"] == "matrices", name
    assert got["ffn.router.weight"] == "adamw_no_decay"  # declared in ffn.py: a gate
    assert got["ffn.experts.1.w_down.weight"] == "matrices"
    assert got["res.w"] == "adamw_no_decay" and got["res.norm.weight"] == "adamw_no_decay"
    assert {g.name for g in groups} == {"matrices", "adamw_no_decay"}


# Every parameter of the `small` preset with the engram on, and its group: layer 0 stands for layers 0-3.
SMALL_LAYER = {
    "mixer_norm.weight": "adamw_no_decay",
    "mixer.q_proj.weight": "matrices",
    "mixer.k_proj.weight": "matrices",
    "mixer.v_proj.weight": "matrices",
    "mixer.q_conv.weight": "adamw_no_decay",
    "mixer.k_conv.weight": "adamw_no_decay",
    "mixer.v_conv.weight": "adamw_no_decay",
    "mixer.f_a.weight": "matrices",
    "mixer.f_b.weight": "matrices",
    "mixer.A_log": "adamw_no_decay",
    "mixer.dt_bias": "adamw_no_decay",
    "mixer.b_proj.weight": "matrices",
    "mixer.g_a.weight": "matrices",
    "mixer.g_b.weight": "matrices",
    "mixer.g_b.bias": "adamw_no_decay",
    "mixer.o_norm.norm.weight": "adamw_no_decay",
    "mixer.o_proj.weight": "matrices",
    "ffn_norm.weight": "adamw_no_decay",
    "ffn.w_gate.weight": "matrices",
    "ffn.w_up.weight": "matrices",
    "ffn.w_down.weight": "matrices",
}
SMALL = {
    "embed.weight": "adamw_decay",
    "final_norm.weight": "adamw_no_decay",
    "engram.0.table.weight": "sparse",
    "engram.0.w_k.weight": "matrices",
    "engram.0.w_v.weight": "matrices",
    "engram.0.key_norm.weight": "adamw_no_decay",
    "engram.0.hidden_norm.weight": "adamw_no_decay",
    "engram.0.conv.weight": "adamw_no_decay",
    "engram.0.conv.norm.weight": "adamw_no_decay",
} | {f"layers.{i}.{name}": group for i in range(4) for name, group in SMALL_LAYER.items()}


def test_small_preset_routing_is_pinned():
    from dormouse import config
    from dormouse.model.model import DormouseLM

    model = DormouseLM(resolve(config.build("small", {"model": {"engram": True}}), cuda_available=False).model)
    assert table(route(model)) == SMALL
    adamw = table(route(model, "adamw"))
    assert set(adamw.values()) == {"adamw_decay", "adamw_no_decay", "sparse"}
    assert all(adamw[n] == "adamw_decay" for n, g in SMALL.items() if g == "matrices")


# The auxiliary heads of `small` with DSpark and JEPA on: nothing else moves.
SMALL_AUX = {
    "draft.anchor_norm.weight": "adamw_no_decay",
    "draft.byte.weight": "adamw_decay",
    "draft.state_norm.weight": "adamw_no_decay",
    "draft.w_in.weight": "matrices",
    "draft.w_out.weight": "matrices",
    "draft.out_norm.weight": "adamw_no_decay",
    "draft.head.weight": "adamw_decay",  # declared in dspark.py: an output head
    "jepa.norm.weight": "adamw_no_decay",
    "jepa.up.weight": "matrices",
    "jepa.down.weight": "matrices",
}


def test_small_preset_with_dspark_and_jepa_routing_is_pinned():
    from dormouse import config
    from dormouse.model.model import DormouseLM

    cfg = config.build("small", {"model": {"engram": True, "dspark_weight": 0.1, "jepa_weight": 0.1}})
    model = DormouseLM(resolve(cfg, cuda_available=False).model)
    assert table(route(model)) == SMALL | SMALL_AUX


def test_the_model_s_untied_lm_head_routes_to_adamw_decay_undeclared():
    # The head is an nn.Linear the model declares nothing on: routing places it by being the model's lm_head.
    from dormouse import config
    from dormouse.model.model import DormouseLM

    cfg = config.build("nano", {"model": {"tie_embeddings": False}})
    model = DormouseLM(resolve(cfg, cuda_available=False).model)
    assert not hasattr(model.lm_head, "_dormouse_route")
    assert table(route(model))["lm_head.weight"] == "adamw_decay"
