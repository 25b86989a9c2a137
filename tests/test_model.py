import copy
import dataclasses
import itertools
import math

import pytest
import torch

from dormouse import config, ledger, rng
from dormouse.errors import DormouseError
from dormouse.model.dropout import branch_drop_of, drop_path, dropout, keep_all, step_generator
from dormouse.model.loop import Branches, Stream
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve

MIXERS = ("kda", "attention")
EXPERTS = ((1, 1), (4, 2))
MEMORY = (("disabled", 0), ("enabled", 3), ("size-match", 3), ("enforced", 3))
ARMS = list(itertools.product(MIXERS, EXPERTS, (False, True), MEMORY))


def tiny(mixer="kda", experts=(1, 1), attn_res=False, memory=("disabled", 0), **extra):
    """The nano preset shrunk for speed, with one arm combination: the engram on and dropout off, the
    settings these tests check (a test of dropout or of the engram's absence sets its own)."""
    model = {
        "engram": True,
        "dropout": 0.0,
        "d_model": 32,
        "n_heads": 2,
        "ffn_hidden": 64,
        "mixer": mixer,
        "n_experts": experts[0],
        "experts_top_k": experts[1],
        "attn_res": attn_res,
        "persistent_memory": memory[0],
        "memory_slots": memory[1],
        "kda_chunk_size": 16,
        "engram_rows": 512,
        "engram_dim": 8,
    }
    model.update(extra)
    cfg = config.build("nano", {"model": model, "train": {"seq_len": 24}})
    return resolve(cfg, cuda_available=False).model


def ids(b, t, step=0):
    return torch.randint(0, 256, (b, t), generator=rng.generator(0, step, "test"))


def arm_id(arm):
    mixer, (n, k), res, (mem, _) = arm
    return f"{mixer}-e{n}k{k}-{'attnres' if res else 'plain'}-{mem}"


@pytest.mark.parametrize("arm", ARMS, ids=arm_id)
def test_every_parameter_gets_a_finite_nonzero_gradient(arm):
    mixer, experts, attn_res, memory = arm
    model = DormouseLM(tiny(mixer, experts, attn_res, memory))
    if attn_res:
        # A zero pseudo-query gives the key norm's gain exactly zero gradient at init (logits = 0·keys):
        # move the queries off zero so a detached gain would still show.
        for r in model.attn_res:
            r.w.data.normal_(0, 0.1, generator=rng.generator(0, 0, "test"))
    x = ids(2, 24)
    out = model(x, ids(2, 24, step=1))
    out.loss.backward()
    grads = {n: None if p.grad is None else p.grad.to_dense() for n, p in model.named_parameters()}
    dead = [n for n, g in grads.items() if g is None or not g.abs().sum() > 0]
    bad = [n for n, g in grads.items() if g is not None and not torch.isfinite(g).all()]
    assert not dead, f"no gradient reaches: {dead}"
    assert not bad, f"non-finite gradient in: {bad}"
    if experts[0] > 1:
        assert set(out.aux) == {"moe_balance"} and out.aux["moe_balance"] >= 1.0 - 1e-6
        assert torch.allclose(out.loss, out.ce + 0.01 * out.aux["moe_balance"])
    else:
        assert out.aux == {} and torch.equal(out.loss, out.ce)


@torch.no_grad()
def loud_engram(model: DormouseLM) -> DormouseLM:
    """Engram tables and conv taps of O(1) (init: 0.02), so the memories move the logits well above the
    decode tolerance and a wrong key, gate or conv tail would show."""
    for memory in model.engram.values():
        memory.table.weight.mul_(50)
        if memory.conv is not None:
            memory.conv.weight.mul_(50)
    return model


@pytest.mark.parametrize("arm", ARMS, ids=arm_id)
def test_step_by_step_decoding_equals_the_full_forward(arm):
    mixer, experts, attn_res, memory = arm
    # Engram memories at both block layers, each with its short conv (the default).
    model = loud_engram(DormouseLM(tiny(mixer, experts, attn_res, memory, engram_layers="0,1"))).eval()
    assert_decode_equals_forward(model)


def assert_decode_equals_forward(model: DormouseLM) -> None:
    """Stepping every byte, and prefilling 9 then stepping the rest, give the full forward's logits."""
    x = ids(2, 21)  # not a multiple of the chunk
    full = model(x).logits
    cache = model.new_cache(2)
    steps = []
    for t in range(x.shape[1]):
        logits, cache = model.step(x[:, t], cache)
        steps.append(logits)
    assert cache.position == 21
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5, rtol=0), (torch.stack(steps, 1) - full).abs().max()
    # prefill a prompt with the full forward, then step the rest
    prefill = model(x[:, :9], cache=model.new_cache(2), return_cache=True)
    cache = prefill.cache
    rest = []
    for t in range(9, 21):
        logits, cache = model.step(x[:, t], cache)
        rest.append(logits)
    assert torch.allclose(torch.stack(rest, 1), full[:, 9:], atol=1e-5, rtol=0)


def test_initial_loss_is_near_uniform():
    model = DormouseLM(tiny())
    ce = model(ids(4, 24), ids(4, 24, step=1)).ce.item()
    assert abs(ce - math.log(256)) < 0.05, ce


def test_init_is_a_pure_function_of_the_seed():
    torch.manual_seed(123)
    a = DormouseLM(tiny(), seed=5).state_dict()
    torch.manual_seed(456)
    b = DormouseLM(tiny(), seed=5).state_dict()
    c = DormouseLM(tiny(), seed=6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_untied_head_is_its_own_parameter():
    tied, untied = DormouseLM(tiny()), DormouseLM(tiny(tie_embeddings=False))
    assert tied.lm_head is None
    assert untied.num_params() == tied.num_params() + 256 * 32


def test_attn_res_starts_as_the_uniform_mean():
    model = DormouseLM(tiny(attn_res=True))
    assert all(torch.equal(r.w, torch.zeros(32)) for r in model.attn_res)


def test_memory_size_match_fills_whole_chunks():
    cfg = tiny(memory=("size-match", 3))
    assert cfg.memory_slots == 8  # 3 rounded up: (8 + 24) % 16 == 0
    assert (cfg.memory_slots + 24) % 16 == 0


def test_memory_enabled_skip_is_counted_and_enforced_skip_refused():
    x = ids(1, 24)
    ledger.COUNTS.clear()
    enabled = DormouseLM(tiny(memory=("enabled", 3)))
    with_memory, without = enabled(x).logits, enabled(x, use_memory=False).logits
    assert ledger.COUNTS["memory.skipped"] == 1
    assert not torch.allclose(with_memory, without)  # the slots change what the model sees
    enforced = DormouseLM(tiny(memory=("enforced", 3)))
    with pytest.raises(ledger.FallbackRefused, match="memory.enforced"):
        enforced(x, use_memory=False)
    ledger.COUNTS.clear()


def test_memory_slots_are_not_scored():
    model = DormouseLM(tiny(memory=("enabled", 3)))
    x = ids(2, 24)
    assert model(x).logits.shape == (2, 24, 256)


def test_moe_with_one_expert_is_exactly_dense():
    dense = DormouseLM(tiny(experts=(1, 1)))
    assert not any("router" in n for n, _ in dense.named_parameters())


def test_the_engram_memory_is_consulted_on_every_path():
    model = DormouseLM(tiny(engram_layers="0,1")).eval()
    x = ids(2, 24)
    stats = model(x).engram
    assert set(stats.reads) == {0, 1} and 0 < stats.rows <= stats.arms == 2 * 2 * 24 * 6  # 2 memories
    cache = model.new_cache(2)
    for t in range(5):
        for memory in model.engram.values():
            before, _ = model.step(x[:, t], cache)
            with torch.no_grad():
                memory.table.weight.add_(1.0)
            after, _ = model.step(x[:, t], cache)
            with torch.no_grad():
                memory.table.weight.sub_(1.0)
            assert not torch.allclose(before, after)  # decode reads every memory's table too
        _, cache = model.step(x[:, t], cache)
    assert DormouseLM(tiny(engram=False))(x).engram is None


def test_each_memory_sits_at_its_layer_with_its_own_hash_seed():
    model = DormouseLM(tiny(engram_layers="1", engram_conv=False), seed=3)
    assert list(model.engram) == ["1"] and model.engram["1"].hash_seed == 3 + 10007
    assert model.engram["1"].conv is None
    two = DormouseLM(tiny(engram_layers="0,1"), seed=3)
    assert [m.hash_seed for m in two.engram.values()] == [3, 3 + 10007]
    assert two.engram_fingerprint() != DormouseLM(tiny(engram_layers="0"), seed=3).engram_fingerprint()
    with torch.no_grad():
        moved = loud_engram(DormouseLM(tiny(engram_layers="1"), seed=3)).eval()
        zeroed = copy.deepcopy(moved)
        zeroed.engram["1"].w_v.weight.zero_()  # this memory adds exactly nothing
        a, b = first_iteration_inputs(moved, ids(2, 24)), first_iteration_inputs(zeroed, ids(2, 24))
    # The memory joins layer 1's input: layer 0 sees no difference, layer 1 does.
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])


def first_iteration_inputs(model: DormouseLM, x: torch.Tensor) -> list[torch.Tensor]:
    """The input of each block layer in the first loop iteration of model(x): its x plus what is still
    pending (a previous layer's FFN output or a memory's output, added in the layer's pre-norm)."""
    seen = []

    def record(mod, args, kwargs):
        pending = kwargs.get("pending")
        seen.append(args[0] if pending is None else args[0] + pending)

    hooks = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in model.layers]
    model(x)
    for hook in hooks:
        hook.remove()
    return seen[: len(model.layers)]


def test_decode_carries_each_memorys_conv_tail():
    model = loud_engram(DormouseLM(tiny(engram_layers="0,1"))).eval()
    x = ids(2, 12)
    full = model(x).logits
    cache = model(x[:, :9], cache=model.new_cache(2), return_cache=True).cache
    # Orders 2,3,4: dilation 4, so each tail holds the last (4 − 1) · 4 = 12 gated values (zeros before byte 0).
    assert {j: tuple(t.shape) for j, t in cache.engram.conv.items()} == {0: (2, 12, 32), 1: (2, 12, 32)}
    logits, _ = model.step(x[:, 9], cache)
    assert torch.allclose(logits, full[:, 9], atol=1e-5, rtol=0)
    for j in (0, 1):  # forget one memory's tail: the next byte's logits move
        forgot = dataclasses.replace(cache.engram, conv={**cache.engram.conv, j: None})
        logits, _ = model.step(x[:, 9], dataclasses.replace(cache, engram=forgot))
        assert (logits - full[:, 9]).abs().max() > 1e-3, j


# ---- the loop's arms: a smaller depth, truncated gradients, Mixture-of-Recursions -------------------------


def test_grad_iterations_records_gradients_through_the_last_iterations_only():
    x, y = ids(2, 24), ids(2, 24, step=1)
    model = DormouseLM(tiny())
    full, last = model(x, y), model(x, y, grad_iterations=1)
    # The same function, fewer gradients. Not the same bits: without gradients a KDA layer projects q, k,
    # v, ... by one matmul each instead of the packed one (kda_layer.py `_project`), another rounding.
    assert (full.logits - last.logits).abs().max() <= 1e-6 and (full.loss - last.loss).abs() <= 1e-5
    last.loss.backward()
    assert model.engram["0"].table.weight.grad is None  # the memory acts in the first iteration only
    assert model.layers[0].mixer.q_proj.weight.grad.abs().sum() > 0  # the second iteration's
    with pytest.raises(ValueError, match=r"depth 3 is outside \[1, 2\]"):
        model(x, depth=3)
    with pytest.raises(ValueError, match="runs the config's depth 2, not 1"):
        model(x, depth=1, return_cache=True)


def head_input_and_logits(model: DormouseLM, x: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the hidden state the head read, logits) of model(x) at `depth`."""
    seen, head = [], model._head

    def record(h, pending=None):  # the head's hidden state: h plus what its final norm adds
        logits, hidden = head(h, pending)
        seen.append(hidden)
        return logits, hidden

    model._head = record
    with torch.no_grad():
        logits = model(x, depth=depth).logits
    del model._head
    return seen[0], logits


@pytest.mark.parametrize("capacity, taken", [(0.25, 3), (0.3, 3), (1.0, 10)])
def test_mor_updates_exactly_the_routed_positions(capacity, taken):
    model = DormouseLM(tiny(mor=True, mor_capacity=capacity))  # training mode: top-k over each sequence
    x = ids(2, 10)
    h1, first = head_input_and_logits(model, x, depth=1)  # the stream entering the second iteration
    with torch.no_grad():
        score = model.router.scorer(h1)[..., 0]
    updated = (head_input_and_logits(model, x, depth=2)[1] != first).any(-1)  # [B, T]
    assert updated.sum(-1).tolist() == [taken, taken]  # ceil(capacity · 10) per sequence
    best = score.topk(taken, dim=-1).indices.sort(-1).values
    assert [u.nonzero().flatten().tolist() for u in updated] == best.tolist()
    model.eval()  # the causal rule: a position takes the iteration when σ(score) > 0.5
    updated = (head_input_and_logits(model, x, depth=2)[1] != first).any(-1)
    assert torch.equal(updated, score > 0) and 0 < updated.sum() < 20


@pytest.mark.parametrize("aux_weight", [0.1, 0.0])
def test_mor_router_gets_gradients_and_its_term_is_reported(aux_weight):
    model = DormouseLM(tiny(mor=True, mor_aux_weight=aux_weight))
    out = model(ids(2, 24), ids(2, 24, step=1))
    assert set(out.aux) == {"mor_router"} and out.aux["mor_router"] > 0
    assert torch.allclose(out.loss, out.ce + aux_weight * out.aux["mor_router"])
    out.loss.backward()
    # With weight 0 the LM loss alone reaches the router, through the gate σ(score).
    dead = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.to_dense().abs().sum() > 0]
    assert not dead, f"no gradient reaches: {dead}"


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("memory", [("disabled", 0), ("enabled", 3)])
def test_mor_decoding_equals_the_full_forward(mixer, memory):
    model = loud_engram(DormouseLM(tiny(mixer, memory=memory, mor=True, engram_layers="0,1"))).eval()
    assert_decode_equals_forward(model)


# ---- dropout: masks from the (seed, step, "dropout") stream, training mode only -------------------------


def test_dropout_zero_is_bitwise_the_forward_without_a_generator():
    x, y = ids(2, 24), ids(2, 24, step=1)
    plain, zero = DormouseLM(tiny(dropout=0.0)), DormouseLM(tiny(dropout=0.0))  # training mode
    a, b = plain(x, y), zero(x, y, dropout_gen=step_generator(0, 0))
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)


@pytest.mark.parametrize("extra", [{}, {"mor": True}, {"attn_res": True, "persistent_memory": "enabled"}])
def test_dropout_masks_are_a_pure_function_of_the_generator_and_off_in_eval(extra):
    if extra.get("persistent_memory"):
        extra = {**extra, "memory_slots": 3}
    x, y = ids(2, 24), ids(2, 24, step=1)
    model = DormouseLM(tiny(dropout=0.3, **extra))
    torch.manual_seed(1)  # the global RNG plays no part
    a = model(x, y, dropout_gen=step_generator(0, 5))
    torch.manual_seed(2)
    b = model(x, y, dropout_gen=step_generator(0, 5))
    other = model(x, y, dropout_gen=step_generator(0, 6))
    rank1 = model(x, y, dropout_gen=step_generator(0, 5, rank=1))
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    assert not torch.allclose(a.logits, other.logits) and not torch.allclose(a.logits, rank1.logits)
    a.loss.backward()  # the masks are differentiable through
    assert model.embed.weight.grad.abs().sum() > 0
    no_drop = DormouseLM(tiny(**extra))
    no_drop.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model.eval()(x, y).logits, no_drop.eval()(x, y).logits)  # eval never drops


def test_the_dropout_helper_drops_a_fraction_p_and_scales_the_rest_by_one_over_one_minus_p():
    n, p = 100_000, 0.3
    x = torch.rand(n, generator=rng.generator(0, 0, "test")) + 0.5  # no zeros of its own
    y = dropout(x, p, rng.generator(0, 0, "test"))
    zeroed = int((y == 0).sum())
    # Zeros ~ Binomial(n, p): std sqrt(n p (1 − p)) ≈ 145; 5 std would fail a fair mask once in ~3.5 million.
    assert abs(zeroed - n * p) < 5 * math.sqrt(n * p * (1 - p)), zeroed
    kept = y != 0
    assert torch.equal(y[kept], x[kept] / (1 - p))
    again = dropout(x, p, rng.generator(0, 0, "test"))
    assert torch.equal(again, y)


def test_a_training_forward_with_dropout_and_no_generator_is_refused():
    model = DormouseLM(tiny(dropout=0.1))
    with pytest.raises(DormouseError, match="dropout 0.1 is on .* no dropout_gen"):
        model(ids(2, 24), ids(2, 24, step=1))
    model.eval()(ids(2, 24))  # eval mode draws nothing, so needs nothing


def test_drop_path_drops_whole_rows_at_rate_p_and_scales_the_rest():
    n, p = 20_000, 0.25
    x = torch.rand(n, 3, 4, generator=rng.generator(0, 0, "test")) + 0.5  # no zeros of its own
    y = drop_path(x, p, rng.generator(0, 1, "test"))
    dropped = (y == 0).flatten(1).all(1)
    assert torch.equal((y == 0).flatten(1).any(1), dropped)  # a row is dropped whole or not at all
    # dropped rows ~ Binomial(n, p): std ≈ 61
    assert abs(int(dropped.sum()) - n * p) < 5 * math.sqrt(n * p * (1 - p))
    assert torch.equal(y[~dropped], x[~dropped] / (1 - p))


def test_a_layer_under_drop_path_is_its_branches_masked_per_sequence_in_draw_order():
    # reference: mixer output masked per row, the FFN reading x plus that masked output, its own output masked
    model = DormouseLM(tiny(drop_path=0.5))
    layer, p = model.layers[0], 0.5
    x = torch.randn(6, 16, 32, generator=rng.generator(0, 0, "test"))
    got, _, _ = layer(x, drop=branch_drop_of(keep_all, p, True, step_generator(0, 3)))
    gen = step_generator(0, 3)
    keep_a, keep_f = (torch.rand((6, 1, 1), generator=gen) >= p for _ in range(2))
    a = layer.mixer(layer.mixer_norm(x)) * keep_a / (1 - p)
    f, _ = layer.ffn(layer.ffn_norm(x + a))
    assert torch.equal(got.a, a) and torch.equal(got.mixed, x + a)
    assert torch.equal(got.f, f * keep_f / (1 - p))
    assert 0 < int(keep_a.sum()) < 6 and not torch.equal(keep_a, keep_f)  # this draw tests both cases


def test_drop_path_is_off_in_eval_and_needs_a_generator_in_training():
    x, y = ids(2, 24), ids(2, 24, step=1)
    model, plain = DormouseLM(tiny(drop_path=0.2)), DormouseLM(tiny())
    plain.load_state_dict(model.state_dict())
    with pytest.raises(DormouseError, match="drop_path 0.2 is on .* no dropout_gen"):
        model(x, y)
    a, b = model(x, y, dropout_gen=step_generator(0, 5)), model(x, y, dropout_gen=step_generator(0, 5))
    assert torch.equal(a.loss, b.loss) and not torch.equal(a.loss, plain(x, y).loss)
    with torch.no_grad():
        assert torch.equal(model.eval()(x, y).logits, plain.eval()(x, y).logits)


def test_engram_dropout_masks_each_memory_output_from_the_stream_and_is_off_in_eval():
    # reference: the same weights without the field, each memory's output masked by a forward hook with
    # the mask the stream's first draw gives (dropout 0: the memory's is the forward's only draw)
    p, x, y = 0.5, ids(2, 24), ids(2, 24, step=1)
    model, plain = DormouseLM(tiny(engram_dropout=p)), DormouseLM(tiny())
    plain.load_state_dict(model.state_dict())
    assert model.memories() and [j for j, _ in model.memories()] == [0]
    gen = step_generator(0, 3)

    def masked(_module, _inputs, output):
        delta, *rest = output
        keep = torch.rand(delta.shape, generator=gen, dtype=torch.float32) >= p
        return (delta * keep / (1 - p), *rest)

    hook = plain.engram["0"].register_forward_hook(masked)
    got, ref = model(x, y, dropout_gen=step_generator(0, 3)), plain(x, y)
    hook.remove()
    assert torch.equal(got.logits, ref.logits) and torch.equal(got.loss, ref.loss)
    assert not torch.equal(got.logits, plain(x, y).logits)
    with torch.no_grad():
        assert torch.equal(model.eval()(x, y).logits, plain.eval()(x, y).logits)
    with pytest.raises(config.ConfigError, match="engram_dropout 0.5 with engram off"):
        tiny(engram=False, engram_dropout=p)


def test_dropout_is_refused_outside_zero_to_one():
    for p in (1.0, -0.1):
        with pytest.raises(config.ConfigError, match=r"dropout .* out of range; allowed \[0.0, 1.0\)"):
            tiny(dropout=p)


def test_the_plain_stream_hands_the_next_layer_its_input_unsummed_and_other_readers_the_sum():
    # A block layer's f waits in the stream: the next block layer adds it in its pre-norm's kernel
    # (layer_input), every other reader gets the fp32 sum x + a + f (input); MoR's gate takes the delta.
    gen = torch.Generator().manual_seed(0)
    e, mixed, a = (torch.randn(2, 3, 4, generator=gen) for _ in range(3))
    f = torch.randn(2, 3, 4, generator=gen).bfloat16()
    stream = Stream(e, None)
    stream.add_layer(Branches(mixed, a.bfloat16(), f))
    x, pending = stream.layer_input(1)
    assert x is mixed and pending is f
    assert torch.equal(stream.input(-1), mixed + f) and stream.layer_input(1)[1] is None
    gate = torch.full((2, 3, 1), 0.5)
    stream.add_layer(Branches(mixed, a.bfloat16(), f), gate)
    assert stream.pending is None and torch.equal(stream.x, (mixed + f) + gate * (a.bfloat16() + f))
