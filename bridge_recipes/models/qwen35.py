"""Offline architecture catalog of the Qwen3.5 / Qwen3.6 / Qwen3.8 family.

One frozen :class:`Qwen35Spec` per size holds the numbers of the models' Hugging Face
``config.json`` (``text_config``; the vision tower for the VL variants), so that building a
recipe never touches the network. Qwen3.6 checkpoints and Qwen3.8-27B share the Qwen3.5 architecture
and tokenizer (Qwen3.8-27B's ``config.json`` gives every text and vision field of the 27B's, the same
``Qwen3_5ForConditionalGeneration`` released form): the checkpoint is metadata on the spec
(``checkpoints``), not a separate size.

:func:`build_provider` turns a spec into the Megatron-Bridge provider by handing an
in-memory ``transformers`` config to Megatron-Bridge's own Qwen3.5 bridge
(``provider_bridge``), so the mapping to Megatron-Core fields (GDN hybrid layer spec, gated
attention, MoE with a gated shared expert, MTP) is exactly the one Megatron-Bridge uses when
it reads the config from the Hub, without the Hub.

Sources of the numbers (keys of docs/sources.md): ``hf-configs`` (the HF ``config.json`` of each
size, slime's ``scripts/models/qwen3.5-*.sh``; ``hf-config-qwen38-27b``); the pinned Qwen3.6 revisions are the ones the
OpenRecipes H200 entries cite (``openrecipes-35b-h200``, ``openrecipes-27b-h200``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

VOCAB_SIZE = 248_320
BOS_TOKEN_ID = 248_045
EOS_TOKEN_ID = 248_046  # Megatron-Bridge text bridge default
VL_EOS_TOKEN_ID = 248_044  # Megatron-Bridge VL provider default
IMAGE_TOKEN_ID = 248_056
VIDEO_TOKEN_ID = 248_057
VISION_START_TOKEN_ID = 248_053
VISION_END_TOKEN_ID = 248_054


@dataclass(frozen=True)
class Checkpoint:
    """A Hugging Face checkpoint with this architecture (tokenizer and weight conversion)."""

    hf_id: str
    revision: str | None = None  # None: no revision pinned by a source we rely on


@dataclass(frozen=True)
class VisionSpec:
    """Vision tower of the VL checkpoints (HF ``vision_config``), identical across sizes."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    mrope_section: tuple[int, int, int] = (11, 11, 10)


@dataclass(frozen=True)
class Qwen35Spec:
    """Architecture of one Qwen3.5 size (text model; ``vision`` set for the VL variant)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    linear_num_value_heads: int
    checkpoints: dict[str, Checkpoint]
    ffn_hidden_size: int | None = None  # dense models only
    num_experts: int | None = None
    moe_router_topk: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_ffn_hidden_size: int | None = None
    head_dim: int = 256
    linear_num_key_heads: int = 16
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    mtp_num_layers: int = 1
    max_position_embeddings: int = 262_144
    vision: VisionSpec | None = field(default=None, compare=True)

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def is_vl(self) -> bool:
        return self.vision is not None

    @property
    def layer_pattern(self) -> list[int]:
        """Per decoder layer: 1 = Gated DeltaNet, 0 = full (gated) attention, as Megatron-Core's
        ``linear_attention_freq`` list; every ``full_attention_interval``-th layer is attention."""
        k = self.full_attention_interval
        return [0 if (i + 1) % k == 0 else 1 for i in range(self.num_layers)]

    @property
    def num_attention_layers(self) -> int:
        return self.layer_pattern.count(0)

    @property
    def num_gdn_layers(self) -> int:
        return self.layer_pattern.count(1)

    def checkpoint(self, family: str = "qwen3.5") -> Checkpoint:
        try:
            return self.checkpoints[family]
        except KeyError:
            raise KeyError(
                f"{self.name} has no {family!r} checkpoint in the catalog; known: {sorted(self.checkpoints)}"
            ) from None


def _ckpts(
    size: str, qwen36_revision: str | None = None, with_qwen36: bool = True, with_qwen38: bool = False
) -> dict[str, Checkpoint]:
    out = {"qwen3.5": Checkpoint(f"Qwen/Qwen3.5-{size}")}
    if with_qwen36:
        out["qwen3.6"] = Checkpoint(f"Qwen/Qwen3.6-{size}", qwen36_revision)
    if with_qwen38:
        out["qwen3.8"] = Checkpoint(f"Qwen/Qwen3.8-{size}")
    return out


QWEN35_27B = Qwen35Spec(
    name="qwen35_27b",
    num_layers=64,
    hidden_size=5120,
    ffn_hidden_size=17408,
    num_attention_heads=24,
    num_query_groups=4,
    linear_num_value_heads=48,
    # Revision cited by the OpenRecipes 27B H200 entry (openrecipes-27b-h200). Qwen3.8-27B: the same
    # config fields (hf-config-qwen38-27b), so the same spec; no revision pinned by a source.
    checkpoints=_ckpts("27B", "6a9e13bd6fc8f0983b9b99948120bc37f49c13e9", with_qwen38=True),
)

QWEN35_35B_A3B = Qwen35Spec(
    name="qwen35_35b_a3b",
    num_layers=40,
    hidden_size=2048,
    num_attention_heads=16,
    num_query_groups=2,
    linear_num_value_heads=32,
    num_experts=256,
    moe_router_topk=8,
    moe_ffn_hidden_size=512,
    moe_shared_expert_ffn_hidden_size=512,
    # Revision cited by the OpenRecipes 35B-A3B H200 entries (openrecipes-35b-h200).
    checkpoints=_ckpts("35B-A3B", "995ad96eacd98c81ed38be0c5b274b04031597b0"),
)

QWEN35_122B_A10B = Qwen35Spec(
    name="qwen35_122b_a10b",
    num_layers=48,
    hidden_size=3072,
    num_attention_heads=32,
    num_query_groups=2,
    linear_num_value_heads=64,
    num_experts=256,
    moe_router_topk=8,
    moe_ffn_hidden_size=1024,
    moe_shared_expert_ffn_hidden_size=1024,
    checkpoints=_ckpts("122B-A10B", with_qwen36=False),
)

QWEN35_397B_A17B = Qwen35Spec(
    name="qwen35_397b_a17b",
    num_layers=60,
    hidden_size=4096,
    num_attention_heads=32,
    num_query_groups=2,
    linear_num_value_heads=64,
    num_experts=512,
    moe_router_topk=10,
    moe_ffn_hidden_size=1024,
    moe_shared_expert_ffn_hidden_size=1024,
    checkpoints=_ckpts("397B-A17B", with_qwen36=False),
)

TEXT_SPECS: tuple[Qwen35Spec, ...] = (QWEN35_27B, QWEN35_35B_A3B, QWEN35_122B_A10B, QWEN35_397B_A17B)


def vl_variant(spec: Qwen35Spec) -> Qwen35Spec:
    """The VL form of a text spec: same language model plus the vision tower."""
    return replace(spec, name=spec.name.replace("qwen35_", "qwen35_vl_", 1), vision=VisionSpec())


SPECS: dict[str, Qwen35Spec] = {s.name: s for s in TEXT_SPECS}
SPECS.update({v.name: v for v in map(vl_variant, TEXT_SPECS)})


def get_spec(name: str) -> Qwen35Spec:
    """Look a spec up by name (``qwen35_35b_a3b``, ``qwen35_vl_35b_a3b``, ...)."""
    try:
        return SPECS[name]
    except KeyError:
        import difflib

        near = difflib.get_close_matches(name, SPECS, n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise KeyError(f"unknown model {name!r}{hint} Known: {', '.join(sorted(SPECS))}") from None


# --------------------------------------------------------------------------------------------
# transformers configs and Megatron-Bridge providers (imports deferred: the catalog itself is
# plain data, usable by --list without importing torch or Megatron).
# --------------------------------------------------------------------------------------------


def hf_text_config(spec: Qwen35Spec):
    """The ``text_config`` a checkpoint of this size carries, built in memory."""
    if spec.is_moe:
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig as cls

        extra = dict(
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.moe_router_topk,
            moe_intermediate_size=spec.moe_ffn_hidden_size,
            shared_expert_intermediate_size=spec.moe_shared_expert_ffn_hidden_size,
        )
    else:
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as cls

        extra = dict(intermediate_size=spec.ffn_hidden_size)
    layer_types = ["linear_attention" if t else "full_attention" for t in spec.layer_pattern]
    return cls(
        num_hidden_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_query_groups,
        head_dim=spec.head_dim,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        full_attention_interval=spec.full_attention_interval,
        layer_types=layer_types,
        vocab_size=spec.vocab_size,
        rms_norm_eps=spec.rms_norm_eps,
        max_position_embeddings=spec.max_position_embeddings,
        mtp_num_hidden_layers=spec.mtp_num_layers,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "partial_rotary_factor": spec.partial_rotary_factor,
            **({"mrope_section": list(spec.vision.mrope_section), "mrope_interleaved": True} if spec.is_vl else {}),
        },
        tie_word_embeddings=False,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=VL_EOS_TOKEN_ID if spec.is_vl else EOS_TOKEN_ID,
        dtype="bfloat16",
        **extra,
    )


def hf_config(spec: Qwen35Spec):
    """The full config: the text config for text specs, text + vision for VL specs."""
    text = hf_text_config(spec)
    if not spec.is_vl:
        return text
    v = spec.vision
    if spec.is_moe:
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig as cls
    else:
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config as cls
    vision = dict(
        depth=v.depth,
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_heads=v.num_heads,
        in_channels=v.in_channels,
        patch_size=v.patch_size,
        temporal_patch_size=v.temporal_patch_size,
        spatial_merge_size=v.spatial_merge_size,
        num_position_embeddings=v.num_position_embeddings,
        out_hidden_size=spec.hidden_size,
    )
    return cls(
        text_config=text.to_dict(),
        vision_config=vision,
        tie_word_embeddings=False,
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_TOKEN_ID,
        vision_end_token_id=VISION_END_TOKEN_ID,
        dtype="bfloat16",
    )


def _bridge_for(spec: Qwen35Spec):
    if spec.is_vl:
        from megatron.bridge.models.qwen_vl.qwen35_vl_bridge import Qwen35VLBridge, Qwen35VLMoEBridge

        return Qwen35VLMoEBridge() if spec.is_moe else Qwen35VLBridge()
    from megatron.bridge.models.qwen.qwen35_bridge import Qwen35Bridge, Qwen35MoEBridge

    return Qwen35MoEBridge() if spec.is_moe else Qwen35Bridge()


def build_provider(spec: Qwen35Spec | str, **overrides: Any):
    """Megatron-Bridge model provider for ``spec``, built offline.

    Megatron-Bridge's Qwen3.5 bridge maps the in-memory HF config exactly as it would a
    downloaded one; ``overrides`` then set provider fields (parallelism, recompute, ...).
    An unknown field name is an error, never silently added.
    """
    spec = get_spec(spec) if isinstance(spec, str) else spec
    bridge = _bridge_for(spec)
    provider = bridge.provider_bridge(SimpleNamespace(config=hf_config(spec)))
    # The text-only form of a VL checkpoint keeps the mrope-free "rope" embedding; the VL
    # provider already uses "mrope". Sequence length is a recipe choice, not an architecture one.
    provider.seq_length = 4096
    for key, value in overrides.items():
        if not hasattr(provider, key):
            raise AttributeError(f"{type(provider).__name__} has no field {key!r}")
        setattr(provider, key, value)
    return provider


def is_vlm(cfg: Any) -> bool:
    """Whether a built config is a vision-language one (its provider carries a vision tower)."""
    return hasattr(cfg.model, "vision_config")


def use_checkpoint_family(cfg: Any, model: Qwen35Spec | str, family: str) -> None:
    """Record the ``family`` checkpoint of ``model`` (``qwen3.6``, ``qwen3.8``: same architecture and tokenizer)
    on a built config: the model's Hugging Face id (Megatron-Bridge's ``hf_model_id``, the template
    of HF exports) and, for VL data, the processor read by the training process. Only the
    checkpoint's id is recorded; nothing is downloaded."""
    spec = get_spec(model) if isinstance(model, str) else model
    new, old = spec.checkpoint(family).hf_id, spec.checkpoint("qwen3.5").hf_id
    cfg.model.hf_model_id = new
    for holder in (cfg.dataset, getattr(cfg.dataset, "task_encoder", None)):
        if getattr(holder, "hf_processor_path", None) == old:
            holder.hf_processor_path = new
