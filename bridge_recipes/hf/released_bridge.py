"""Megatron-Bridge's Qwen3.5 text bridges over a released (vision-language form) folder.

A text recipe trains the language model of a released folder as Megatron-Bridge's text model
(``GPTModel`` with its MTP layer); the folder's tensors are named as the VL model names them
(``model.language_model.*``; ``lm_head.*`` and ``mtp.*`` as in the text form). The bridges here
are Megatron-Bridge's own Qwen3.5 text bridges (provider settings, weight mappings, MTP mappings)
with the language model's Hugging Face prefix that of the VL form, as its VL bridges build them,
and the vision mappings left out: the vision tower is never built, read or trained.
:class:`ReleasedTextBridge` is ``AutoBridge`` over such a folder, its config the folder's
``text_config`` (:func:`bridge_recipes.hf.released.text_config`), so import, provider and export
run through Megatron-Bridge's own code (the conversions of :mod:`bridge_recipes.hf.importer` and
:mod:`bridge_recipes.hf.exporter` call these with their distributed context and LoRA loading).
Not registered with Megatron-Bridge's dispatch: the VL recipes keep its VL bridges for the same
architecture.

Importing this module imports Megatron-Bridge; the runner imports it only to convert.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from megatron.bridge import AutoBridge
from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry
from megatron.bridge.models.conversion.utils import moe_experts_stored_packed
from megatron.bridge.models.qwen.qwen35_bridge import Qwen35Bridge, Qwen35MoEBridge

from bridge_recipes.hf.released import VL_LANGUAGE_PREFIX, text_config, write_export, write_lora_exports

# The MTP layer's experts stored stacked (Qwen3.6) rather than one by one (Qwen3.5).
PACKED_MTP_EXPERTS_KEY = "mtp.layers.0.mlp.experts.gate_up_proj"


def _source_keys(hf_pretrained: Any) -> set[str]:
    state = getattr(hf_pretrained, "state", None)
    source = getattr(state, "source", None)
    return set(source.get_all_keys()) if source is not None else set()


class ReleasedMoETextBridge(Qwen35MoEBridge):
    """Qwen3.5 MoE text bridge reading the language model under the VL form's prefix."""

    def mapping_registry(self) -> MegatronMappingRegistry:
        hf = getattr(self, "hf_pretrained", None)
        mtp_packed = PACKED_MTP_EXPERTS_KEY in _source_keys(hf)
        packed = moe_experts_stored_packed(hf, VL_LANGUAGE_PREFIX + "layers.")
        return MegatronMappingRegistry(
            *self._get_moe_lm_mappings(hf_prefix=VL_LANGUAGE_PREFIX, megatron_prefix="", experts_packed=packed),
            *self._get_moe_mtp_mappings(megatron_prefix="", mtp_experts_packed=mtp_packed),
        )


class ReleasedDenseTextBridge(Qwen35Bridge):
    """Qwen3.5 dense text bridge reading the language model under the VL form's prefix."""

    def mapping_registry(self) -> MegatronMappingRegistry:
        return MegatronMappingRegistry(
            *self._get_dense_lm_mappings(hf_prefix=VL_LANGUAGE_PREFIX, megatron_prefix=""),
            *self._get_dense_mtp_mappings(megatron_prefix=""),
        )


class ReleasedTextBridge(AutoBridge):
    """``AutoBridge`` over a released folder whose language model trains as a text model."""

    @property
    def _model_bridge(self) -> Any:
        config = self.hf_pretrained.config
        moe = bool(getattr(config, "num_experts", None))
        bridge = (ReleasedMoETextBridge if moe else ReleasedDenseTextBridge)()
        bridge.hf_pretrained = self.hf_pretrained
        bridge.hf_config = config
        bridge.export_weight_dtype = self.export_weight_dtype
        return bridge


def released_text_bridge(folder: Any) -> ReleasedTextBridge:
    """The bridge of the checked released folder ``folder`` (weights read lazily, shard by shard)."""
    from transformers import AutoConfig

    text = text_config(folder)
    config = AutoConfig.for_model(text["model_type"], **{k: v for k, v in text.items() if k != "model_type"})
    hf_pretrained = AutoBridge.from_hf_pretrained(str(folder.path)).hf_pretrained
    hf_pretrained.config = config
    return ReleasedTextBridge(hf_pretrained)


def provider(folder: Any) -> Any:
    """Megatron-Bridge's text model provider for the released folder ``folder`` (no weights loaded)."""
    return released_text_bridge(folder).to_megatron_provider(load_weights=False)


def convert_to_megatron(folder: Any, out: Path, *, context: Callable[[], Any], prepare: Callable[[Any], None]) -> None:
    """The language model and MTP layer of the released folder ``folder`` into a Megatron checkpoint at
    ``out`` (``AutoBridge.import_ckpt``'s steps; ``context``: the distributed context to build in,
    ``prepare``: called on the provider before it is finalized)."""
    bridge = released_text_bridge(folder)
    with context():
        prov = bridge.to_megatron_provider(load_weights=True)
        prepare(prov)
        prov.finalize()
        model = prov.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        bridge.save_megatron_model(model, str(out), hf_tokenizer_path=str(folder.path), low_memory_save=True)


def export(
    folder: Any,
    megatron: Path,
    out: Path,
    *,
    context: Callable[[], Any],
    lora_model: Callable[[Any], tuple[list[Any], Any]] | None = None,
    text_only: bool = False,
    adapter_out: Path | None = None,
) -> None:
    """The newest checkpoint of ``megatron`` (a text model trained from the released folder
    ``folder``) back into the released form at ``out`` (:func:`released.write_export`; the text
    form for ``text_only``). A LoRA run (``lora_model``: builds the base with its adapters from a
    bridge) is merged into the folder's base weights, and then its adapters written as a PEFT folder
    to ``adapter_out`` (:func:`released.write_lora_exports`)."""
    bridge = released_text_bridge(folder)
    with context():
        if lora_model is None:
            model = bridge.load_megatron_model(
                str(megatron), mp_overrides={"gradient_accumulation_fusion": False}, wrap_with_ddp=False
            )
            write_export(
                bridge.export_hf_weights(model, cpu=True, show_progress=True), folder, out, text_only=text_only
            )
            return
        model, lora = lora_model(bridge)
        write_lora_exports(
            bridge.export_hf_weights(model, cpu=True, show_progress=True, merge_adapter_weights=True),
            lambda: bridge.export_adapter_weights(model, cpu=True, show_progress=False),
            folder,
            out,
            adapter_out,
            rank=lora.dim,
            alpha=lora.alpha,
            text_only=text_only,
        )
