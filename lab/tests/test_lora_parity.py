"""The figures a LoRA parity case records against FP32 (lab.lora_parity), on CPU tensors."""

import pytest
import torch

from lab.lora_parity import against_fp32


def test_a_path_is_measured_beside_the_bf16_floor():
    ref = (2.0, {"a.adapter.w": torch.tensor([3.0, 4.0]), "b.adapter.w": torch.tensor([0.0])})
    exact = (2.0, {k: v.clone() for k, v in ref[1].items()})
    floor = (2.02, {"a.adapter.w": torch.tensor([3.0, 4.5]), "b.adapter.w": torch.tensor([0.0])})
    case = against_fp32(ref, exact, floor, "bf16_base")
    assert case["loss_rel_err"] == 0.0 and case["adapter_grad_err"] == 0.0
    assert case["adapter_grad_cosine"] == pytest.approx(1.0)
    assert case["loss_rel_err_bf16_base"] == pytest.approx(0.01)
    assert case["noise_floor"] == pytest.approx(0.1)  # |(0, 0.5, 0)| / |(3, 4, 0)|
    flipped = (2.0, {k: -v for k, v in ref[1].items()})
    assert against_fp32(ref, flipped, floor, "x")["adapter_grad_cosine"] == pytest.approx(-1.0)
