"""The offline Qwen-VL processor feeds Megatron-Bridge's mock VLM data without a download."""

import pytest

from bridge_recipes.vl.offline_vl_processor import build, vision_token_overrides


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vlproc"))


def test_mock_vlm_batch_has_qwen35_patches_and_matching_image_tokens(folder):
    from megatron.bridge.data.builders.mock_vlm_sft import (
        MockVLMSFTDatasetConfig,
        build_mock_vlm_sft_split,
        make_mock_vlm_examples,
    )
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(folder))
    assert type(processor).__name__ == "Qwen3VLProcessor"  # selects Megatron-Bridge's Qwen-VL collate
    cfg = MockVLMSFTDatasetConfig(
        seq_length=1024, hf_processor_path=str(folder), pad_to_max_length=True, num_base_examples=2
    )
    ds = build_mock_vlm_sft_split(cfg, make_mock_vlm_examples(cfg), 2, processor)
    batch = ds.collate_fn([ds[0], ds[1]])
    vi = batch["visual_inputs"]
    assert batch["input_ids"].shape == (2, 1024)
    assert vi.pixel_values.shape[1] == 3 * 2 * 16 * 16  # channels x temporal patch x 16 x 16 (Qwen3.5 vision)
    patches_per_image = vi.image_grid_thw.prod(dim=1)
    tokens = (batch["input_ids"] == processor.image_token_id).sum(dim=1)
    assert tokens.tolist() == (patches_per_image // 4).tolist()  # 2x2 spatial merge
    assert int(patches_per_image.sum()) == vi.pixel_values.shape[0]


def test_overrides_point_the_model_at_the_processor_tokens(folder):
    from bridge_recipes.config.overrides import apply_all
    from bridge_recipes.recipes.base import vlm_pretrain_config

    cfg = vlm_pretrain_config("qwen35_vl_35b_a3b")
    apply_all(cfg, {}, vision_token_overrides(folder))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert cfg.model.image_token_id == tok.token_to_id("<|image_pad|>")
    assert cfg.model.vision_start_token_id == tok.token_to_id("<|vision_start|>")
    assert cfg.dataset.hf_processor_path == str(folder)
