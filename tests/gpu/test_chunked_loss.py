"""The loss a chunk of tokens at a time (``bridge_recipes.features.chunked_loss``) against Transformer Engine's
fused cross entropy on one GPU, both against an FP32 reference.

The recipe's model at 4 layers (MTP head on; 32 experts for the 35B-A3B) takes the first packed row
of the real-format evidence with boundaries; its masked loss's gradient is compared per parameter
for a trained output layer (SFT) and a frozen one (LoRA's, whose hidden-state gradient is taken in
the forward). The chunked path must sit as close to the FP32 reference as TE's does.

    python3 -m pytest -q -m gpu tests/gpu/test_chunked_loss.py
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

FAMILIES = ("qwen35_35b_a3b", "qwen35_27b")


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("frozen_output", [False, True], ids=["trained_output", "frozen_output"])
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_loss_is_as_close_to_fp32_as_te_cross_entropy(family, frozen_output, row, bare_model, gradients):
    from bridge_recipes.features import chunked_loss

    batch, meta = row
    changes = {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
    model = bare_model.build(family, changes)
    reference = bare_model.build(family, changes, fp32=True)
    gradients.copy_weights(model, reference)
    for m in (model, reference):
        m.output_layer.weight.requires_grad_(not frozen_output)
    ref_loss, ref = gradients.gradient(reference, batch, meta, None)
    te_loss, te = gradients.gradient(model, batch, meta, None)
    assert chunked_loss.install_on(model)
    loss, chunked = gradients.gradient(model, batch, meta, None)
    assert set(chunked) == set(te) == set(ref)
    assert ("output_layer.weight" in chunked) is not frozen_output
    assert abs(loss - ref_loss) <= max(2 * abs(te_loss - ref_loss), 1e-3 * abs(ref_loss))
    worse = {
        n: (rel(chunked[n], ref[n]), rel(te[n], ref[n]))
        for n in ref
        if rel(chunked[n], ref[n]) > max(1.5 * rel(te[n], ref[n]), 1e-2)
    }
    assert not worse, f"parameters whose gradient the chunked loss takes further from FP32 than TE: {worse}"
