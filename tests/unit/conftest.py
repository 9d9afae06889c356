"""Fixtures shared by the unit tests of one subject: the tiny VL toy checkpoint; a LoRA run's export
streams as Megatron-Bridge produced them on a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES
from bridge_recipes.models.qwen35 import VisionSpec

# A VL MoE toy small enough for the CPU: its language model and vision tower a few thousand
# parameters wide, its processor the offline Qwen-VL one (Qwen3.5's patch geometry).
TINY_VL_SIZES = dict(
    **CPU_SIZES,
    **CPU_MOE_SIZES,
    vision=VisionSpec(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=64),
)


@pytest.fixture(scope="session")
def tiny_vl_toy(tmp_path_factory):
    """(folder, spec) of a tiny FP32 VL toy: weights, the offline Qwen-VL processor, its vision token
    ids in config.json. Read-only for the tests that share it."""
    from bridge_recipes.hf.toy import make_toy

    folder = tmp_path_factory.mktemp("tiny_vl_toy") / "vl"
    spec = make_toy(folder, "moe", vl=True, dtype="float32", max_shard_size="300KB", **TINY_VL_SIZES)
    return folder, spec


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_TOKENIZER = FIXTURES / "qwen35_chat_tokenizer" / "tokenizer.json"


class LoraStreams:
    """tests/fixtures/lora_export_structure.json (recorded on a GPU by ``python -m lab.lora_export_structure``):
    for each one-GPU LoRA recipe, the adapter and merged streams of its export on a CPU-sized toy, by name,
    shape and memory sharing; rebuilt here as tensors with that sharing, and written as the two folders."""

    file = FIXTURES / "lora_export_structure.json"
    cases: list[dict] = json.loads(file.read_text())["cases"]

    @classmethod
    def case(cls, family: str) -> dict:
        return next(c for c in cls.cases if c["family"] == family)

    @staticmethod
    def make_toy(case: dict, folder: Path) -> Path:
        """The toy ``case`` was recorded on."""
        from bridge_recipes.hf.toy import make_toy

        make_toy(folder, case["family"], **{**case["toy"], "tokenizer_json": FIXTURE_TOKENIZER})
        return folder

    @staticmethod
    def rebuild(stream: list[dict], seed: int) -> list[tuple[str, Any]]:
        """The stream's (name, tensor) pairs, random, each group one buffer that its names view."""
        import torch

        g = torch.Generator().manual_seed(seed)
        buffers: dict[int, torch.Tensor] = {}
        out = []
        for e in stream:
            if e["group"] not in buffers:
                buffers[e["group"]] = (torch.randn(e["storage"], generator=g) * 0.1).to(getattr(torch, e["dtype"]))
            out.append((e["name"], buffers[e["group"]].as_strided(e["shape"], e["stride"], e["offset"])))
        return out

    @staticmethod
    def base_tensors(folder: Path) -> dict[str, Any]:
        from safetensors import safe_open

        out = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    out[name] = f.get_tensor(name)
        return out

    @staticmethod
    def merged_of(case: dict, base: dict, adapters: list) -> list[tuple[str, Any]]:
        """The merged stream of ``case``, in its order: each base weight plus alpha/r * B @ A."""
        scale = case["lora"]["alpha"] / case["lora"]["dim"]
        a = {n.removesuffix(".lora_A.weight"): t for n, t in adapters if n.endswith(".lora_A.weight")}
        b = {n.removesuffix(".lora_B.weight"): t for n, t in adapters if n.endswith(".lora_B.weight")}
        out = []
        for e in case["merged_stream"]:
            name = e["name"]
            tensor = base[name].clone()
            assert list(tensor.shape) == e["shape"], name  # the fixture was recorded on this toy
            module = name.removesuffix(".weight")
            if module in a:
                tensor += scale * b[module] @ a[module]
            out.append((name, tensor))
        return out

    def write_exports(self, case: dict, toy: Path, export: Path, seed: int) -> list[tuple[str, Any]]:
        """Both folders of an export of ``toy`` (the merged one at ``export``), through the writers the export
        runs after training; the adapter stream written."""
        from bridge_recipes.hf import checkpoint as ck
        from bridge_recipes.hf import released

        adapters = self.rebuild(case["adapter_stream"], seed)
        merged = self.merged_of(case, self.base_tensors(toy), adapters)
        lora = case["lora"]
        released.write_lora_exports(
            iter(merged), lambda: iter(adapters), ck.inspect_folder(toy), export, released.adapter_folder(export),
            rank=lora["dim"], alpha=lora["alpha"],
        )  # fmt: skip
        return adapters


@pytest.fixture(scope="session")
def lora_streams() -> LoraStreams:
    return LoraStreams()
