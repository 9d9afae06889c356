"""Base ConfigContainer builders: defaults pinned to their sources, valid at world size 1."""

import pytest

from bridge_recipes.recipes import base as common


@pytest.fixture
def validate(monkeypatch):
    """Megatron-Bridge's runtime_config_update (the pre-launch validation pretrain() runs)."""
    from megatron.bridge.training.config import runtime_config_update

    monkeypatch.setenv("WORLD_SIZE", "1")

    def run(cfg):
        cfg.model.gradient_accumulation_fusion = False
        cfg.env_vars = {}
        runtime_config_update(cfg)
        return cfg

    return run


def test_pretrain_uses_mock_data_and_a_null_tokenizer(validate):
    cfg = common.pretrain_config("qwen35_35b_a3b")
    assert cfg.dataset.blend is None and cfg.dataset.blend_per_split is None
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer" and cfg.tokenizer.vocab_size == 248320
    assert cfg.model.seq_length == cfg.dataset.seq_length == 4096
    validate(cfg)
    assert cfg.dataset.mock


def test_sft_defaults_are_the_openrecipes_workload(validate):
    cfg = common.sft_config("qwen35_27b")
    o, s = cfg.optimizer, cfg.scheduler
    assert (o.lr, o.min_lr, o.weight_decay, o.adam_beta1, o.adam_beta2) == (1e-5, 1e-6, 0.1, 0.9, 0.98)
    assert s.lr_decay_style == "cosine" and s.lr_warmup_iters == cfg.train.train_iters // 10
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.model.seq_length) == (128, 1, 8192)
    assert cfg.model.calculate_per_token_loss
    assert o.use_distributed_optimizer
    validate(cfg)


def test_peft_adds_lora_on_attention_gdn_and_mlp(validate, tmp_path):
    cfg = common.peft_config("qwen35_35b_a3b")
    assert cfg.peft is not None and cfg.peft.dim == 32
    assert {"linear_qkv", "in_proj", "out_proj", "linear_fc1"} <= set(cfg.peft.target_modules)
    assert cfg.optimizer.lr == 1e-4
    with pytest.raises(AssertionError, match="pretrained checkpoint"):
        validate(cfg)  # LoRA without base weights is refused before launch
    cfg = common.peft_config("qwen35_35b_a3b")
    cfg.checkpoint.pretrained_checkpoint = str(tmp_path)
    validate(cfg)


@pytest.mark.parametrize("builder", [common.vlm_pretrain_config, common.vlm_sft_config])
def test_vlm_builders(builder, validate):
    cfg = builder("qwen35_vl_35b_a3b")
    assert type(cfg.model).__name__ == "Qwen35VLMoEModelProvider"
    assert type(cfg.dataset).__name__ == "MockVLMSFTDatasetConfig"
    assert cfg.dataset.hf_processor_path == "Qwen/Qwen3.5-35B-A3B"
    assert not cfg.ddp.overlap_grad_reduce
    validate(cfg)


def test_vlm_builder_rejects_a_text_model():
    with pytest.raises(ValueError, match="text model"):
        common.vlm_pretrain_config("qwen35_35b_a3b")


def _shared_training_fields(cfg):
    """What a text builder and its VL form share: optimizer, schedule, batch and length, loss
    normalisation, the starting checkpoint, every DDP setting but the two VL overlap flags."""
    import dataclasses

    ddp = {f.name: getattr(cfg.ddp, f.name) for f in dataclasses.fields(cfg.ddp)}
    ddp.pop("overlap_grad_reduce")
    ddp.pop("overlap_param_gather")
    return {
        "optimizer": cfg.optimizer,
        "scheduler": cfg.scheduler,
        "train": cfg.train,
        "ddp": ddp,
        "seq_length": (cfg.model.seq_length, cfg.dataset.seq_length),
        "calculate_per_token_loss": cfg.model.calculate_per_token_loss,
        "pretrained_checkpoint": cfg.checkpoint.pretrained_checkpoint,
        "mixed_precision": cfg.mixed_precision,
    }


def test_vlm_sft_has_the_sft_defaults():
    vl = common.vlm_sft_config("qwen35_vl_35b_a3b")
    text = common.sft_config("qwen35_35b_a3b")
    assert _shared_training_fields(vl) == _shared_training_fields(text)
    assert vl.peft is None and not vl.model.freeze_vision_model and not vl.model.freeze_language_model
    assert vl.checkpoint.save.endswith("qwen35_vl_35b_a3b_sft/checkpoints")
