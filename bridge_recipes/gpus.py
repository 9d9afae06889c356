"""The GPUs the recipes are written for: one table of peak FLOP/s and memory.

Used by the benchmark statistics (MFU over the dense BF16 peak), the result files (datasheet
memory) and the memory planner (the memory a plan must fit). Memory in bytes; the planner
and Megatron-Bridge's memory log count GB = 1e9 bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9
MIB = 2**20
GIB = 2**30
FP8_CAPABILITY = (8, 9)  # FP8 tensor cores from Ada (8.9) on: Hopper, Blackwell


def has_fp8(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability has FP8 tensor cores."""
    return tuple(capability) >= FP8_CAPABILITY


@dataclass(frozen=True)
class Gpu:
    name: str  # datasheet name
    peak_bf16_flops: float  # dense BF16 tensor-core FLOP/s per GPU, no sparsity
    memory_gb: int  # datasheet HBM per GPU, as NVIDIA prints it
    memory_bytes: float  # what a plan must fit: the device's own figure (see GPUS)
    capability: tuple[int, int]  # CUDA compute capability
    same_class: tuple[str, ...] = ()  # other cards a recipe written for this one serves (same memory, same FP8)

    @property
    def fp8(self) -> bool:
        return has_fp8(self.capability)

    @property
    def usable_memory_gb(self) -> float:
        """Device memory in GB of 1e9 bytes, the unit of Megatron-Bridge's memory log."""
        return self.memory_bytes / GB


# Peak FLOP/s: NVIDIA datasheet figures, dense (no sparsity): the datasheets print BF16 "with
# sparsity", twice these numbers.
# Memory: the H200's is what the test host's device reports, 143,771 MiB
# = 150.76 GB = 140.4 GiB: NVIDIA's "141 GB" is a GiB-like figure, so for the GPUs not measured
# here the datasheet figure is read as GiB too (nominal, not measured), except the 48 GB cards,
# whose GDDR6 loses part of it to ECC: their datasheet figure is read as 1e9 bytes (48.0 GB), below
# what the class reports.
GPUS: dict[str, Gpu] = {
    # A100 SXM 80GB datasheet: BF16 624 TFLOPS with sparsity; 80 GB; no FP8 tensor cores (Ampere).
    "A100": Gpu("A100", 312e12, 80, 80 * GIB, (8, 0)),
    # H100 SXM datasheet: BF16 1,979 TFLOPS with sparsity (132 SMs x 1,830 MHz x 4,096 FLOP/clk); 80 GB.
    "H100": Gpu("H100", 989.4e12, 80, 80 * GIB, (9, 0)),
    # L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity); 48 GB GDDR6 with ECC; FP8 (Ada). The
    # RTX 6000 Ada (the same AD102 chip and 48 GB) is of its class.
    "L40S": Gpu("L40S", 362.05e12, 48, 48 * GB, (8, 9), same_class=("RTX6000ADA",)),
    # H200 SXM datasheet: BF16 1,979 TFLOPS with sparsity, the same GH100 compute as H100 SXM; 141 GB.
    "H200": Gpu("H200", 989.4e12, 141, 143_771 * MIB, (9, 0)),
    # HGX B200 datasheet: BF16 4.5 PFLOPS with sparsity per GPU; 1,440 GB over 8 GPUs.
    "B200": Gpu("B200", 2250e12, 180, 180 * GIB, (10, 0)),
    # GB200 NVL72 datasheet: BF16 360 PFLOPS with sparsity over 72 GPUs; 13.4 TB over 72 GPUs.
    "GB200": Gpu("GB200", 2500e12, 186, 186 * GIB, (10, 0)),
    # GB300 NVL72 datasheet: BF16 360 PFLOPS with sparsity over 72 GPUs (as GB200); 288 GB HBM3e per GPU.
    "GB300": Gpu("GB300", 2500e12, 288, 288 * GIB, (10, 3)),
}

# Names torch.cuda.get_device_name() prints that are not the SXM part of the table: refused
# rather than given the SXM peak (H100 PCIe and NVL have lower clocks and peaks).
_OTHER_FORM_FACTORS = ("PCIE", "NVL")


def gpu_type_from_name(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``; a key of
    :data:`GPUS` passes through. Unknown GPUs and other H100 form factors are an error."""
    upper = name.upper()
    match = re.search(r"\b(GB300|GB200|B200|H200|H100|A100|L40S)\b", upper)
    if not match:
        raise KeyError(f"no peak FLOP/s known for GPU {name!r}; known: {', '.join(GPUS)}")
    if match.group(1) == "H100" and any(f in upper for f in _OTHER_FORM_FACTORS):
        raise KeyError(f"{name!r} is not the H100 SXM of the table (989.4 TFLOP/s); pass peak_flops explicitly")
    return match.group(1)


def peak_bf16_flops(gpu: str) -> float:
    """Dense BF16 peak FLOP/s per GPU for a type (``"H200"``) or a device name."""
    return GPUS[gpu_type_from_name(gpu)].peak_bf16_flops


def gpu_key(gpu: str) -> str:
    """A recipe's GPU (``"h100"``, ``"nvidia-h100"``) as a key of :data:`GPUS`; KeyError naming the known ones."""
    key = gpu.upper().removeprefix("NVIDIA-")
    if key not in GPUS:
        raise KeyError(f"unknown GPU {gpu!r}; known: {', '.join(g.lower() for g in GPUS)}")
    return key


def class_names(gpu: str) -> tuple[str, ...]:
    """The cards a recipe written for ``gpu`` serves, lower case: the GPU itself, the others of its class
    and its memory class (``("l40s", "rtx6000ada", "48gb")``): what ``--list --filter`` matches."""
    g = GPUS[gpu_key(gpu)]
    return (g.name.lower(), *(c.lower() for c in g.same_class), f"{g.memory_gb}gb")


def class_memory_gb(gpu: str) -> float | None:
    """The memory, GB of 1e9 bytes, of the GPU a recipe is written for (None for one not in :data:`GPUS`)."""
    try:
        return GPUS[gpu_key(gpu)].usable_memory_gb
    except KeyError:
        return None
