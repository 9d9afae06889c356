"""Base ConfigContainer builders every recipe starts from: pretrain, SFT and PEFT, text and VL.

A base builder fixes the model (from the offline catalog) and the defaults that do not depend
on hardware: optimizer family, schedule shape, data, tokenizer, logging, checkpointing. A
hardware recipe then applies its execution policy (layout, kernels, environment) on top.

Defaults and where they come from:
- pretrain: Megatron-Bridge's pretrain defaults (distributed Adam, cosine 3e-4 -> 3e-5,
  500 warm-up steps, 4,096-token sequences), mock data and a NullTokenizer sized to the
  248,320-token vocabulary, so a pretrain recipe runs with no download.
- SFT: the OpenRecipes H200 SFT workload (openrecipes-35b-h200, openrecipes-27b-h200 in
  docs/sources.md): 8,192-token rows, global batch 128, lr 1e-5 cosine to 1e-6 with 10%
  warm-up, weight decay 0.1, betas 0.9/0.98, per-token loss. Mock rows until a dataset is selected (``--dataset``).
- PEFT: the SFT defaults plus LoRA (rank 32, alpha 32) on the attention, GDN and MLP
  projections and lr 1e-4, as Megatron-Bridge's PEFT recipes do.
- VL forms: the same, with the VL provider, the mock VLM conversation dataset, and no
  gradient/parameter-gather overlap (Megatron-Bridge's VLM defaults).
Every base builder switches on the resilience defaults of :mod:`bridge_recipes.recipes.resilience`
(async torch_dist checkpoints with automatic resume, NVRx fault tolerance and straggler
detection). Nothing here opens a network connection; tokenizers and processors named by HF id are only
loaded by the training process.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from bridge_recipes.models.qwen35 import Qwen35Spec, build_provider, get_spec, is_vlm
from bridge_recipes.recipes.resilience import enable_resilience

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

PRETRAIN_SEQ_LENGTH = 4096
SFT_SEQ_LENGTH = 8192  # OpenRecipes SFT rows (openrecipes-35b-h200)
SFT_GLOBAL_BATCH = 128  # OpenRecipes SFT workload (openrecipes-35b-h200)
SFT_ROWS = 6400  # the published row set (openrecipes-35b-h200)
LORA_TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "in_proj", "out_proj"]


def _spec(model: Qwen35Spec | str) -> Qwen35Spec:
    return get_spec(model) if isinstance(model, str) else model


def run_dir(name: str) -> str:
    """Where a run writes checkpoints and logs unless overridden (``checkpoint.save=...``)."""
    return os.path.join(os.getcwd(), "experiments", name)


def adam_cosine(
    lr: float,
    min_lr: float,
    warmup_iters: int,
    *,
    beta2: float = 0.95,
    weight_decay: float = 0.1,
    decay_iters: int | None = None,
):
    """Distributed Adam with cosine decay and constant weight decay."""
    from megatron.bridge.training.config import OptimizerConfig, SchedulerConfig

    optimizer = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        min_lr=min_lr,
        weight_decay=weight_decay,
        bf16=True,
        adam_beta1=0.9,
        adam_beta2=beta2,
        adam_eps=1e-8,
        clip_grad=1.0,
        use_distributed_optimizer=True,
    )
    scheduler = SchedulerConfig(
        lr_decay_style="cosine",
        lr_warmup_iters=warmup_iters,
        lr_warmup_init=0.0,
        lr_decay_iters=decay_iters,
        start_weight_decay=weight_decay,
        end_weight_decay=weight_decay,
        weight_decay_incr_style="constant",
        override_opt_param_scheduler=True,
    )
    return optimizer, scheduler


def mock_text_dataset(seq_length: int):
    """Megatron's mock GPT dataset (random tokens; ``blend=None``)."""
    from megatron.bridge.training.config import GPTDatasetConfig

    return GPTDatasetConfig(
        random_seed=1234,
        seq_length=seq_length,
        blend=None,
        split="9999,8,2",
        reset_attention_mask=False,
        reset_position_ids=False,
        eod_mask_loss=False,
        num_dataset_builder_threads=1,
        data_sharding=True,
        dataloader_type="single",
        skip_getting_attention_mask_from_dataset=True,
    )


def mock_vlm_dataset(seq_length: int, processor: str):
    """Megatron-Bridge's synthetic image conversations (``processor``: HF id or local folder)."""
    from megatron.bridge.data.builders import MockVLMSFTDatasetConfig

    return MockVLMSFTDatasetConfig(
        seq_length=seq_length,
        hf_processor_path=processor,
        prompt="Describe this image.",
        num_workers=1,
        dataloader_type="single",
        data_sharding=True,
        pin_memory=True,
        persistent_workers=False,
        pad_to_max_length=True,
    )


def null_tokenizer(vocab_size: int):
    """Tokenizer stand-in for mock data: no files, fixed vocabulary size."""
    from megatron.bridge.training.config import TokenizerConfig

    return TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=vocab_size, use_tokenizer_vocab_size=False)


def _container(
    spec: Qwen35Spec, *, name: str, seq_length: int, gbs: int, mbs: int, iters: int, opt, dataset, vlm: bool
) -> ConfigContainer:
    from megatron.bridge.training.config import (
        CheckpointConfig,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        LoggerConfig,
        RNGConfig,
        TrainingConfig,
        ValidationConfig,
    )

    from bridge_recipes.recipe_config import RecipeConfig

    out = run_dir(name)
    optimizer, scheduler = opt
    cfg = RecipeConfig(
        model=build_provider(spec, seq_length=seq_length),
        train=TrainingConfig(
            train_iters=iters, global_batch_size=gbs, micro_batch_size=mbs, manual_gc=True, manual_gc_interval=100
        ),
        validation=ValidationConfig(eval_interval=500, eval_iters=0),
        optimizer=optimizer,
        scheduler=scheduler,
        ddp=DistributedDataParallelConfig(
            check_for_nan_in_grad=True,
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=not vlm,
            overlap_param_gather=not vlm,
            average_in_collective=True,
            use_distributed_optimizer=True,
        ),
        dataset=dataset,
        logger=LoggerConfig(log_interval=1, tensorboard_dir=os.path.join(out, "tb"), log_throughput=True),
        tokenizer=null_tokenizer(spec.vocab_size),
        checkpoint=CheckpointConfig(save=os.path.join(out, "checkpoints")),  # the rest: enable_resilience
        rng=RNGConfig(seed=1234),
        dist=DistributedInitConfig(),
        mixed_precision="bf16_mixed",
        env_vars={},
    )
    enable_resilience(cfg)
    return cfg


# --- text --------------------------------------------------------------------------------


def pretrain_config(model: Qwen35Spec | str, *, seq_length: int = PRETRAIN_SEQ_LENGTH) -> ConfigContainer:
    """Pretraining from random init on mock data."""
    spec = _spec(model)
    opt = adam_cosine(3e-4, 3e-5, 500)
    return _container(
        spec,
        name=f"{spec.name}_pretrain",
        seq_length=seq_length,
        gbs=32,
        mbs=1,
        iters=300_000,
        opt=opt,
        dataset=mock_text_dataset(seq_length),
        vlm=False,
    )


def sft_config(model: Qwen35Spec | str, *, seq_length: int = SFT_SEQ_LENGTH) -> ConfigContainer:
    """Full-parameter SFT with the OpenRecipes workload's optimizer and batch (openrecipes-35b-h200).

    ``train_iters`` 50 = the 6,400 rows of the published row set at global batch 128; the
    warm-up is 10% of that. Set ``checkpoint.pretrained_checkpoint`` to the converted
    Megatron checkpoint (Qwen3.5 or Qwen3.6 weights) to start from.
    """
    spec = _spec(model)
    return _sft_container(spec, seq_length=seq_length, dataset=mock_text_dataset(seq_length), vlm=False)


def _sft_container(spec: Qwen35Spec, *, seq_length: int, dataset, vlm: bool) -> ConfigContainer:
    """The SFT defaults of :func:`sft_config`, on the text or the VL data side."""
    # 6,400 published rows at global batch 128; warm-up 10% of the steps
    iters = SFT_ROWS // SFT_GLOBAL_BATCH
    opt = adam_cosine(1e-5, 1e-6, max(1, iters // 10), beta2=0.98, weight_decay=0.1)
    cfg = _container(
        spec,
        name=f"{spec.name}_sft",
        seq_length=seq_length,
        gbs=SFT_GLOBAL_BATCH,
        mbs=1,
        iters=iters,
        opt=opt,
        dataset=dataset,
        vlm=vlm,
    )
    # per-token loss: the loss sums in the collective, then divides by the token count
    cfg.model.calculate_per_token_loss = True
    cfg.ddp.average_in_collective = False
    cfg.checkpoint.pretrained_checkpoint = None
    return cfg


def _add_lora(cfg: ConfigContainer) -> None:
    """LoRA adapters and their learning rate, as Megatron-Bridge's PEFT recipes set them."""
    from megatron.bridge.peft.lora import LoRA

    cfg.optimizer.lr = 1e-4
    cfg.optimizer.min_lr = 1e-5
    cfg.peft = LoRA(target_modules=list(LORA_TARGETS), dim=32, alpha=32, dropout=0.0)


def use_lora(cfg: ConfigContainer) -> None:
    """Switch a built SFT config (text or VL) to LoRA with :func:`peft_config`'s settings: adapters
    on :data:`LORA_TARGETS`, rank 32, alpha 32, lr 1e-4 to 1e-5; a VL model's vision tower frozen.
    The execution layout stays the recipe's."""
    _add_lora(cfg)
    if is_vlm(cfg):
        cfg.model.freeze_vision_model = True


def peft_config(model: Qwen35Spec | str, *, seq_length: int = SFT_SEQ_LENGTH) -> ConfigContainer:
    """LoRA fine-tuning on top of :func:`sft_config`."""
    cfg = sft_config(model, seq_length=seq_length)
    _add_lora(cfg)
    return cfg


# --- vision-language -------------------------------------------------------------------------


def _vl_spec(model: Qwen35Spec | str) -> Qwen35Spec:
    spec = _spec(model)
    if not spec.is_vl:
        raise ValueError(f"{spec.name} is a text model; the VL builders take qwen35_vl_* specs")
    return spec


def vlm_pretrain_config(
    model: Qwen35Spec | str, *, seq_length: int = PRETRAIN_SEQ_LENGTH, checkpoint: str = "qwen3.5"
) -> ConfigContainer:
    """VL pretraining on Megatron-Bridge's mock image conversations (processor from ``checkpoint``)."""
    spec = _vl_spec(model)
    opt = adam_cosine(3e-4, 3e-5, 500)
    processor = spec.checkpoint(checkpoint).hf_id
    cfg = _container(
        spec,
        name=f"{spec.name}_pretrain",
        seq_length=seq_length,
        gbs=32,
        mbs=1,
        iters=300_000,
        opt=opt,
        dataset=mock_vlm_dataset(seq_length, processor),
        vlm=True,
    )
    _train_all_vl_parts(cfg)
    return cfg


def _train_all_vl_parts(cfg: ConfigContainer) -> None:
    cfg.model.freeze_language_model = False
    cfg.model.freeze_vision_model = False
    cfg.model.freeze_vision_projection = False


def vlm_sft_config(
    model: Qwen35Spec | str, *, seq_length: int = SFT_SEQ_LENGTH, checkpoint: str = "qwen3.5"
) -> ConfigContainer:
    """VL full-parameter SFT: the defaults of :func:`sft_config` (optimizer, schedule, batch,
    sequence length, per-token loss) on Megatron-Bridge's mock image conversations, every part
    of the model trained."""
    spec = _vl_spec(model)
    processor = spec.checkpoint(checkpoint).hf_id
    cfg = _sft_container(spec, seq_length=seq_length, dataset=mock_vlm_dataset(seq_length, processor), vlm=True)
    _train_all_vl_parts(cfg)
    return cfg
