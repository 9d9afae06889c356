"""LoRA runs' checkpoints (the adapter weights alone, as Megatron-Bridge saves PEFT runs).

:func:`lora_settings` tells a LoRA run's checkpoint by the run config saved with it;
:func:`build_lora_model` builds the base model with the run's LoRA around it and loads the
adapters; :func:`convert_lora_to_hf` merges them into the template's base weights and can write
them alone as a PEFT folder. The plain and the released-form export both build the LoRA model
here, as do the lab's tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge_recipes.hf.checkpoint import _conversion_context, _need_gpu, _no_apex_fusion, _quiet_megatron_import
from bridge_recipes.hf.files import AdapterExportError, HfCheckpointError


def lora_settings(megatron: Path) -> dict[str, Any] | None:
    """The ``peft`` section of the run config saved with ``megatron``'s newest checkpoint when that
    run trained LoRA adapters, else None (a full-parameter checkpoint)."""
    from bridge_recipes.training.saved_runs import CheckpointMetadataError, latest_run_config

    try:
        found = latest_run_config(megatron)
    except CheckpointMetadataError as e:
        raise HfCheckpointError(str(e)) from None
    peft = (found[1].get("peft") if found else None) or {}
    return peft if "LoRA" in str(peft.get("_target_", "")) else None


def lora_from_settings(settings: dict[str, Any]) -> Any:
    """Megatron-Bridge's ``LoRA`` with the saved run's fields (those its constructor takes)."""
    import dataclasses

    from megatron.bridge.peft.lora import LoRA

    names = {f.name for f in dataclasses.fields(LoRA) if f.init}
    return LoRA(**{k: v for k, v in settings.items() if k in names and v is not None})


def convert_lora_to_hf(megatron: Path, template: Path, out: Path, adapter_out: Path | None = None) -> None:
    """A LoRA run's newest checkpoint (adapter weights only, as Megatron-Bridge saves PEFT runs)
    merged into the base weights of ``template`` (the HF folder the run started from), saved as a
    plain HF folder: the base model built through the registered bridge with the run's LoRA
    wrapped around it, the adapters loaded from the checkpoint, then ``save_hf_pretrained``, which
    merges each adapter into its base weight. ``adapter_out``: then the adapters alone as a PEFT
    folder there (:func:`bridge_recipes.hf.released.write_adapter`); its failure is an
    :class:`AdapterExportError`."""
    _need_gpu("the export")
    _quiet_megatron_import()
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(template))
    with _conversion_context():
        model, lora = build_lora_model(bridge, megatron, lora_settings(megatron) or {})
        bridge.save_hf_pretrained(model, str(out), source_path=str(template), merge_adapter_weights=True)
        if adapter_out is not None:
            from bridge_recipes.hf.released import write_adapter

            try:
                write_adapter(
                    bridge.export_adapter_weights(model, cpu=True, show_progress=False),
                    adapter_out,
                    rank=lora.dim,
                    alpha=lora.alpha,
                    base_model=str(template),
                )
            except Exception as e:
                raise AdapterExportError(f"{type(e).__name__}: {e}") from e


def build_lora_model(
    bridge: Any, megatron: Path, settings: dict[str, Any], overrides: dict[str, Any] | None = None
) -> tuple[list[Any], Any]:
    """The base model of ``bridge`` (its Hugging Face weights loaded) with the LoRA of ``settings``
    wrapped around it and the adapters of ``megatron``'s newest checkpoint loaded; (model, lora).
    ``overrides``: model config fields set before it is built. Runs inside a distributed context."""
    from megatron.bridge.training.checkpointing import (
        _generate_model_state_dict,
        apply_peft_adapter_filter_to_state_dict,
    )
    from megatron.core import dist_checkpointing

    from bridge_recipes.training.saved_runs import iteration_folder, latest_iteration

    iteration = latest_iteration(megatron)
    if iteration is None:
        raise HfCheckpointError(f"{megatron} has no latest_checkpointed_iteration.txt naming its newest save")
    lora = lora_from_settings(settings)
    provider = bridge.to_megatron_provider(load_weights=True)
    _no_apex_fusion(provider)
    for name, value in (overrides or {}).items():
        setattr(provider, name, value)
    provider.finalize()
    provider.register_pre_wrap_hook(lambda chunks: lora(chunks, training=False))
    model = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True, init_model_with_meta_device=False
    )
    wanted = apply_peft_adapter_filter_to_state_dict(_generate_model_state_dict(model, {}), lora)
    loaded = dist_checkpointing.load(wanted, str(iteration_folder(megatron, iteration)))
    key = "model" if "model" in loaded else next(k for k in loaded if k.startswith("model"))
    if not loaded[key]:
        raise HfCheckpointError(f"{megatron} holds no LoRA adapter weights for this model")
    load_adapters(model[0], loaded[key])
    return model, lora


def load_adapters(module: Any, adapters: dict[str, Any]) -> None:
    """Load a LoRA run's adapter weights into ``module`` (the model, or Megatron's Float16Module
    around it, whose ``load_state_dict`` returns nothing): every saved weight must land in a
    parameter of the model; the base weights it does not carry stay as they are."""
    import torch

    while isinstance(getattr(module, "module", None), torch.nn.Module):
        module = module.module
    result = module.load_state_dict(adapters, strict=False)
    if result.unexpected_keys:
        raise HfCheckpointError(f"adapter weights with no place in the model: {sorted(result.unexpected_keys)[:5]}")
