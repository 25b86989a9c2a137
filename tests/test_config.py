from dataclasses import fields
from pathlib import Path

import pytest

from dormouse import config, config_checks, config_flags
from dormouse.cli import build_parser
from dormouse.errors import ConfigError, DormouseError
from dormouse.resolve import resolve, resolve_values


def parse(*argv):
    return config_flags.config_from_args(build_parser().parse_args(["inspect", *argv]))


def test_presets_match_the_issue():
    nano = resolve(config.build("nano"), cuda_available=False)
    assert (nano.model.d_model, nano.model.n_heads, nano.model.block_layers, nano.model.depth) == (128, 4, 2, 2)
    assert (nano.train.seq_len, nano.train.batch_size) == (256, 8)
    small = resolve(config.build("small"), cuda_available=False)
    assert (small.model.d_model, small.model.n_heads, small.model.head_dim) == (512, 8, 64)
    assert (small.model.block_layers, small.model.depth, small.model.ffn_hidden) == (4, 2, 1536)
    assert (small.train.seq_len, small.train.batch_size) == (512, 10)
    base = resolve(config.build("base"), cuda_available=False)
    assert (base.model.d_model, base.model.n_heads, base.model.block_layers, base.model.depth) == (768, 12, 6, 2)
    assert base.train.seq_len == 1024 and base.model.head_dim == 64


def test_resolve_fills_derived_values_and_decides_auto():
    cfg = resolve(config.build("nano"), cuda_available=False)
    assert cfg.model.head_dim == 32
    assert cfg.model.ffn_hidden == 384  # 8/3 * 128 = 341.3 → next multiple of 64
    assert cfg.train.device == "cpu" and cfg.model.kda_backend == "chunked"


def test_precedence_preset_file_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('preset = "small"\n[model]\ndepth = 3\nd_model = 256\n[optimizer]\nlr = 0.01\n')
    cfg = parse("--config", str(f), "--depth", "5")
    assert cfg.preset == "small"
    assert cfg.model.depth == 5  # flag beats file
    assert cfg.model.d_model == 256  # file beats preset
    assert cfg.model.block_layers == 4  # preset
    assert cfg.train.lr == 0.01
    assert parse("--config", str(f), "--preset", "nano").preset == "nano"


def test_booleans_and_short_arms():
    assert parse("--no-short-conv").model.short_conv is False
    assert parse("--short-conv").model.short_conv is True
    assert parse("--no-kda").model.mixer == "attention"
    assert parse("--engram").model.engram is True and parse().model.engram is False
    with pytest.raises(ConfigError, match="--no-kda contradicts --mixer kda"):
        parse("--no-kda", "--mixer", "kda")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seq-len", "0"], r"seq_len 0 is out of range; allowed \[1, inf\]"),
        (["--n-heads", "3"], "n_heads 3 does not divide d_model 128"),
        (["--head-dim", "300"], r"head_dim 300 is out of range; allowed \[0, 256\]"),
        (["--norm-eps", "0"], r"norm_eps 0.0 is out of range; allowed \(0.0"),
        (["--lr-floor", "1.5"], r"lr_floor 1.5 is out of range; allowed \[0.0, 1.0\]"),
        (["--lr", "nan"], "lr nan is not finite"),
        (["--device", "cuda"], "no CUDA device"),
        (["--dtype", "bf16", "--device", "cpu"], "bf16"),
        (["--kda-backend", "fla", "--device", "cpu"], "kda backend 'fla' needs CUDA, got device cpu"),
        (["--eval-bytes", "10"], "eval_bytes 10 is shorter than one sequence"),
        (["--engram-layers", "2"], r"engram_layers '2': distinct block layers in 0\.\.1, comma-separated"),
        (["--engram-layers", "0,0"], r"engram_layers '0,0': distinct block layers"),
        (["--engram-layers", "0,x"], r"engram_layers '0,x': distinct block layers"),
        (["--engram-layers", "-1"], r"engram_layers '-1': distinct block layers"),
        (["--engram", "--engram-layers", ""], "engram_layers is empty while engram is on"),
        (["--engram-orders", "2,x"], "engram_orders '2,x': distinct integers in 1..16"),
        (["--engram-orders", "3,3"], "engram_orders '3,3'"),
        (["--rand-depth", "--mor"], r"rand_depth and mor cannot be combined \(--rand-depth with --mor\)"),
        (["--rand-depth", "--rand-depth-min", "2"], "rand_depth_min 2 must be below depth 2"),
        (["--rand-depth", "--rand-depth-bptt", "3"], "rand_depth_bptt 3 exceeds depth 2"),
        (["--rand-depth-bptt", "1"], "act only with --rand-depth"),
        (["--byte-noise", "0", "--byte-noise-source", "unigram"], "byte_noise_source unigram acts only with byte"),
        (["--opt", "adamw", "--sinkhorn-lr-scale", "0.1"], r"sinkhorn_lr_scale 0.1 acts only with --opt sinkhorn"),
        (["--mor", "--depth", "1"], "mor routes the iterations after the first: it needs depth >= 2"),
        (["--mor", "--attn-res"], "mor with attn_res is not built"),
        (["--experts-dense"], r"experts_dense needs n_experts > 1 \(--n-experts\)"),
        (["--mor-capacity", "0"], r"mor_capacity 0.0 is out of range; allowed \(0.0, 1.0\]"),
        (["--mor-capacity", "1.5"], r"mor_capacity 1.5 is out of range"),
        (["--gate-lower-bound", "-6"], r"kda_safe_gate needs gate_lower_bound in \[-5.0, 0.0\).*--no-kda-safe-gate"),
        (["--gate-lower-bound", "0"], r"kda_safe_gate needs gate_lower_bound in \[-5.0, 0.0\) .*; got 0.0"),
    ],
)
def test_validate_refuses_with_field_and_range(argv, message, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(DormouseError, match=message):
        parse(*argv)


def test_safe_gate_is_the_default_and_any_bound_builds_without_it():
    assert parse().model.kda_safe_gate is True
    assert parse("--no-kda-safe-gate", "--gate-lower-bound", "-20").model.gate_lower_bound == -20.0


def test_engram_layers_are_parsed_ascending_and_may_be_empty_only_without_engram():
    assert config.engram_layers(parse().model) == (0,)
    cfg = parse("--preset", "small", "--engram-layers", "3, 1")
    assert cfg.model.engram_layers == "3, 1" and config.engram_layers(cfg.model) == (1, 3)
    assert config.engram_layers(parse("--no-engram", "--engram-layers", "").model) == ()
    assert parse().model.engram_conv is True and parse("--no-engram-conv").model.engram_conv is False


def test_config_file_refusals(tmp_path):
    bad_key = tmp_path / "a.toml"
    bad_key.write_text("[model]\nd_modle = 3\n")
    with pytest.raises(ConfigError, match=r"\[model\] has no field 'd_modle'; known: \["):
        parse("--config", str(bad_key))
    wrong_table = tmp_path / "w.toml"
    wrong_table.write_text("[model]\nengram = true\n")
    with pytest.raises(ConfigError, match=r"\[model\] has no field 'engram'; it belongs in \[arms\]"):
        parse("--config", str(wrong_table))
    old_table = tmp_path / "t.toml"
    old_table.write_text("[train]\nlr = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown table\(s\) \['train'\]; allowed: preset, data, model"):
        parse("--config", str(old_table))
    bad_type = tmp_path / "b.toml"
    bad_type.write_text('[model]\ndepth = "two"\n')
    with pytest.raises(ConfigError, match="depth: expected int, got 'two'"):
        parse("--config", str(bad_type))
    bad_toml = tmp_path / "c.toml"
    bad_toml.write_text("[model\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        parse("--config", str(bad_toml))
    with pytest.raises(ConfigError, match="cannot read config file"):
        parse("--config", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="unknown preset"):
        config.build("huge")


def test_round_trip_through_dict():
    cfg = parse("--preset", "small", "--depth", "3")
    again = resolve(config.Config.from_dict(cfg.to_dict()), cuda_available=False)
    assert again == cfg


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NANOGPT_BYTES = 5000 * 64 * 256  # nanoGPT's tiny-shakespeare run: 5000 steps of 64 x 256 characters


def committed(path: Path) -> config.Config:
    """A committed config, validated (resolving it for CUDA would need fla, which CI does not have)."""
    values = config.load_toml(path)
    cfg = config.build(values.get("preset", config.DEFAULT_PRESET), config.toml_overrides(values, str(path)))
    config_checks.validate(cfg)
    return cfg


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_committed_configs_are_valid(path):
    assert committed(path).train.device in ("auto", "cuda")


def test_tinyshakespeare_recipe_stays_within_nanogpts_bytes_with_five_evals_ending_at_the_budget():
    cfg = committed(CONFIGS / "tinyshakespeare.toml")
    t = cfg.train
    assert t.steps * t.batch_size * t.seq_len <= NANOGPT_BYTES
    assert t.steps == 5 * t.eval_every and t.steps % t.ckpt_every == 0


# What a recipe may set away from the defaults: the corpus's sizes and budget, its eval cadence, and the
# regularisers a small corpus needs against memorising it (dropout, byte noise, weight decay).
SIZES_AND_BUDGET = {"seq_len", "batch_size", "steps", "minutes", "eval_every", "eval_bytes", "ckpt_every"}
CORPUS_SETTINGS = SIZES_AND_BUDGET | {"dropout", "byte_noise", "weight_decay"}


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_defaults_are_the_recipes_choices(path):
    """Every setting a committed recipe makes, but its sizes, budget and regularisers, is the default:
    with no flags, train runs the measured best (each recipe line names its evidence)."""
    values = config.load_toml(path)
    defaults = config.Config()
    for section, table in config.toml_overrides(values, str(path)).items():
        for key, value in table.items():
            if key not in CORPUS_SETTINGS:
                assert getattr(getattr(defaults, section), key) == value, f"{path.name}: {key} is not the default"
    lines = [line for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")]
    assert all("evidence/" in line or line.split("=")[0].strip() in CORPUS_SETTINGS | {"preset"} for line in lines)


def test_the_defaults_are_the_measured_best():
    m, t = config.Config().model, config.Config().train
    assert (m.engram, m.dropout, t.opt, t.weight_decay, t.lr_floor) == (False, 0.0, "adamw", 0.1, 0.5)
    assert (t.byte_noise, t.ema_decay, t.dtype, t.cuda_graph) == (0.0, 0.998, "auto", None)
    assert all(name in ("nano", "small", "base") for name in config.PRESETS)
    sized = {f.name for cls in config.SECTIONS.values() for f in fields(cls) if f.metadata["group"] in ("model",)}
    for preset in config.PRESETS.values():  # presets name sizes only
        assert set(preset["model"]) <= sized | {"engram_rows", "engram_dim"}
        assert set(preset["train"]) <= {"seq_len", "batch_size"}


def test_auto_dtype_and_cuda_graph_follow_the_device():
    cpu = resolve_values(config.build("nano"), cuda_available=False).train
    assert (cpu.dtype, cpu.cuda_graph) == ("fp32", False)
    cuda = resolve_values(config.build("nano"), cuda_available=True).train
    assert (cuda.dtype, cuda.cuda_graph) == ("bf16", True)
    mor = resolve_values(config.build("nano", {"model": {"mor": True}}), cuda_available=True).train
    assert mor.cuda_graph is False  # auto leaves the graph off where an arm cannot be captured
    with pytest.raises(ConfigError, match="cuda_graph with mor is not built"):
        resolve_values(config.build("nano", {"model": {"mor": True}, "train": {"cuda_graph": True}}))


def test_attention_layers_make_a_hybrid_block_and_refuse_what_is_not_one():
    from dormouse.model.attention import CausalSelfAttention
    from dormouse.model.kda_layer import KDALayer
    from dormouse.model.model import DormouseLM

    hybrid = {"model": {"block_layers": 4, "attention_layers": "3,1"}}
    cfg = resolve(config.build("nano", hybrid), cuda_available=False)
    assert config.layer_mixers(cfg.model) == ["kda", "attention", "kda", "attention"]
    kinds = [type(layer.mixer) for layer in DormouseLM(cfg.model).layers]
    assert kinds == [KDALayer, CausalSelfAttention, KDALayer, CausalSelfAttention]
    # QK-norm on by default, off with --no-attn-qk-norm (eps: the model's norm_eps)
    for flags, has in [({}, True), ({"attn_qk_norm": False}, False)]:
        c = resolve(
            config.build("nano", {"model": {**hybrid["model"], **flags, "norm_eps": 1e-5}}), cuda_available=False
        )
        mixers = [layer.mixer for layer in DormouseLM(c.model).layers if isinstance(layer.mixer, CausalSelfAttention)]
        assert [m.q_norm is not None for m in mixers] == [has, has]
        assert all(m.k_norm.eps == 1e-5 for m in mixers if has)
    for model, message in [
        ({"attention_layers": "2"}, "distinct layer indices in 0..1"),
        ({"attention_layers": "0,0"}, "distinct layer indices"),
        ({"attention_layers": "x"}, "distinct layer indices"),
        ({"attention_layers": "0,1"}, "names every block layer: use --mixer attention"),
        ({"attention_layers": "0", "mixer": "attention"}, "every layer is attention already"),
    ]:
        with pytest.raises(ConfigError, match=message):
            config_checks.validate(config.build("nano", {"model": model}))
