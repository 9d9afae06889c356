"""The GPUs the recipes are written for, and the other cards ``--gpu`` plans for: one table of peak
FLOP/s, memory, memory bandwidth and compute capability.

Used by the benchmark statistics (MFU over the dense BF16 peak), the result files (datasheet
memory), the memory planner (the memory a plan must fit) and the rate of a recipe on a card it was
not measured on (:func:`speed_ratio`). Memory in bytes; the planner and Megatron-Bridge's memory log
count GB = 1e9 bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9
MIB = 2**20
GIB = 2**30
FP8_CAPABILITY = (8, 9)  # FP8 tensor cores from Ada (8.9) on: Hopper, Blackwell
# MXFP8 (block-scaled FP8) on data-center Blackwell (10.x), as Transformer Engine checks it: none on 12.x
# (the GeForce and workstation Blackwell cards)
MXFP8_CAPABILITY, MXFP8_BEFORE = (10, 0), (12, 0)


def has_fp8(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability has FP8 tensor cores."""
    return tuple(capability) >= FP8_CAPABILITY


def has_mxfp8(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability multiplies MXFP8 (block-scaled FP8)."""
    return MXFP8_CAPABILITY <= tuple(capability) < MXFP8_BEFORE


@dataclass(frozen=True)
class Gpu:
    name: str  # datasheet name
    peak_bf16_flops: float  # dense BF16 tensor-core FLOP/s per GPU, no sparsity
    memory_gb: int  # datasheet HBM per GPU, as NVIDIA prints it
    memory_bytes: float  # what a plan must fit: the device's own figure (see GPUS)
    capability: tuple[int, int]  # CUDA compute capability
    peak_fp8_flops: float | None  # dense FP8 tensor-core FLOP/s per GPU, no sparsity; None: no FP8 tensor cores
    memory_bandwidth: float  # datasheet memory bandwidth, bytes/s
    same_class: tuple[str, ...] = ()  # other cards a recipe written for this one serves (same memory, same FP8)
    aliases: tuple[str, ...] = ()  # other names ``--gpu`` takes for it (as users type them, as torch prints them)

    @property
    def fp8(self) -> bool:
        return has_fp8(self.capability)

    @property
    def usable_memory_gb(self) -> float:
        """Device memory in GB of 1e9 bytes, the unit of Megatron-Bridge's memory log."""
        return self.memory_bytes / GB


def reported(gib: float) -> float:
    """Bytes of a device whose total torch prints as ``gib`` GiB (``total capacity of 79.18 GiB``, rounded
    to 0.01): one step below the printed figure, so that a plan or cap of this size is within the card."""
    return (gib - 0.01) * GIB


# Peak FLOP/s: NVIDIA datasheet figures, dense (no sparsity): the datasheets print BF16 and FP8 "with
# sparsity", twice these numbers. Memory bandwidth: the datasheet's, bytes/s.
# Memory: what a plan must fit is the device's total as the CUDA runtime reports it
# (torch.cuda.get_device_properties().total_memory, the figure torch's out-of-memory message prints),
# below both the datasheet and nvidia-smi (the driver keeps part of it: the H200 here lists 143,771 MiB
# in nvidia-smi and reports 139.80 GiB to torch). The H200 and H100 figures were read on the test
# hosts; the A100, L40S and the cards --gpu plans for (H100 NVL, L40, RTX 4090, RTX 5090; the RTX 6000 Ada,
# of the L40S's class, reports 44.43) are what their owners' out-of-memory reports print (the 48 GB cards
# with ECC on, the smaller of the figures seen). Cards not seen: the H100 PCIe takes the smallest figure an
# 80 GB H100 was seen to report, the A6000 that of its 48 GB GDDR6 peers with ECC on (the L40's: ECC keeps
# the same 1/16 of each); the others, the datasheet figure read as GiB. The GeForce cards' BF16 peak is
# the one with FP32 accumulation (training's), half of their FP16-accumulate figure.
GPUS: dict[str, Gpu] = {
    # A100 SXM 80GB datasheet: BF16 624 TFLOPS with sparsity; 80 GB HBM2e at 2,039 GB/s; no FP8 tensor
    # cores (Ampere).
    "A100": Gpu("A100", 312e12, 80, reported(79.15), (8, 0), None, 2039e9),
    # H100 SXM datasheet: BF16 1,979 TFLOPS with sparsity (132 SMs x 1,830 MHz x 4,096 FLOP/clk), FP8 3,958
    # with sparsity; 80 GB HBM3 at 3.35 TB/s.
    "H100": Gpu("H100", 989.4e12, 80, reported(79.18), (9, 0), 1978.9e12, 3.35e12),
    # L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity), FP8 733 dense (1,466 with sparsity);
    # 48 GB GDDR6 at 864 GB/s, part of it taken by ECC. The RTX 6000 Ada (the same AD102 chip and 48 GB) is
    # of its class.
    "L40S": Gpu(
        "L40S",
        362.05e12,
        48,
        reported(44.42),
        (8, 9),
        733e12,
        864e9,
        same_class=("RTX6000ADA",),
        aliases=("RTX 6000 Ada Generation",),
    ),
    # H200 SXM datasheet: BF16 1,979 TFLOPS with sparsity and FP8 3,958, the same GH100 compute as H100 SXM;
    # 141 GB HBM3e at 4.8 TB/s.
    "H200": Gpu("H200", 989.4e12, 141, reported(139.80), (9, 0), 1978.9e12, 4.8e12),
    # HGX B200 datasheet: BF16 4.5 PFLOPS and FP8 9 PFLOPS with sparsity per GPU; 1,440 GB over 8 GPUs;
    # HBM3e at 8 TB/s per GPU.
    "B200": Gpu("B200", 2250e12, 180, 180 * GIB, (10, 0), 4500e12, 8e12),
    # GB200 NVL72 datasheet: BF16 360 PFLOPS and FP8 720 PFLOPS with sparsity over 72 GPUs; 13.4 TB of
    # HBM3e at 576 TB/s over 72 GPUs.
    "GB200": Gpu("GB200", 2500e12, 186, 186 * GIB, (10, 0), 5000e12, 8e12),
    # GB300 NVL72 datasheet: BF16 360 PFLOPS and FP8 720 PFLOPS with sparsity over 72 GPUs (as GB200);
    # 288 GB HBM3e per GPU, 576 TB/s over 72 GPUs.
    "GB300": Gpu("GB300", 2500e12, 288, 288 * GIB, (10, 3), 5000e12, 8e12),
    # Cards no recipe is written for, which --gpu plans for.
    # H100 PCIe datasheet: BF16 1,513 TFLOPS and FP8 3,026 with sparsity (114 SMs); 80 GB HBM2e at 2 TB/s.
    "H100-PCIE": Gpu("H100-PCIe", 756.5e12, 80, reported(79.11), (9, 0), 1513e12, 2.0e12, aliases=("H100 PCIe",)),
    # H100 NVL datasheet: BF16 1,671 TFLOPS and FP8 3,341 with sparsity per GPU; 94 GB HBM3 at 3.9 TB/s.
    "H100-NVL": Gpu("H100-NVL", 835.5e12, 94, reported(93.00), (9, 0), 1670.5e12, 3.9e12, aliases=("H100 NVL",)),
    # L40 datasheet: BF16 181.05 TFLOPS dense (362.1 with sparsity), FP8 362.1 dense; 48 GB GDDR6 with ECC at
    # 864 GB/s.
    "L40": Gpu("L40", 181.05e12, 48, reported(44.40), (8, 9), 362.1e12, 864e9),
    # RTX A6000 datasheet: BF16 154.8 TFLOPS dense (309.7 with sparsity); 48 GB GDDR6 with ECC at 768 GB/s;
    # Ampere: no FP8.
    "A6000": Gpu("A6000", 154.8e12, 48, reported(44.40), (8, 6), None, 768e9, aliases=("RTX A6000",)),
    # RTX 4090 (Ada whitepaper): BF16 with FP32 accumulate 165.2 TFLOPS dense, FP8 with FP32 accumulate 330.3;
    # 24 GB GDDR6X at 1,008 GB/s.
    "RTX4090": Gpu(
        "RTX4090", 165.2e12, 24, reported(23.61), (8, 9), 330.3e12, 1008e9, aliases=("4090", "GeForce RTX 4090")
    ),
    # RTX 5090 (Blackwell whitepaper): BF16 with FP32 accumulate 209.5 TFLOPS dense, FP8 with FP32 accumulate
    # 419; 32 GB GDDR7 at 1,792 GB/s; Blackwell 12.0.
    "RTX5090": Gpu(
        "RTX5090", 209.5e12, 32, reported(31.37), (12, 0), 419e12, 1792e9, aliases=("5090", "GeForce RTX 5090")
    ),
}

# Names torch.cuda.get_device_name() prints that are not the SXM part of the table: refused
# rather than given the SXM peak (H100 PCIe and NVL have lower clocks and peaks).
_OTHER_FORM_FACTORS = ("PCIE", "NVL")
# The types a device name is read as (the GPUs the recipes are written for; longest names first)
DEVICE_TYPES = ("GB300", "GB200", "B200", "H200", "H100", "A100", "L40S")


def gpu_type_from_name(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"H200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``; one of
    :data:`DEVICE_TYPES` passes through. Other GPUs and other H100 form factors are an error (the
    benchmark statistics take no card the recipes are not written for)."""
    upper = name.upper()
    match = re.search(rf"\b({'|'.join(DEVICE_TYPES)})\b", upper)
    if not match:
        raise KeyError(f"no peak FLOP/s known for GPU {name!r}; known: {', '.join(DEVICE_TYPES)}")
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


def gpu_names(gpu: Gpu) -> tuple[str, ...]:
    """What ``--gpu`` takes for a card of :data:`GPUS`: its name, with its memory (``a100-80``), the
    cards of its class (``rtx6000ada``) and its other names (``rtx a6000``), lower case."""
    return (
        gpu.name.lower(),
        f"{gpu.name.lower()}-{gpu.memory_gb}",
        *(c.lower() for c in gpu.same_class),
        *(a.lower() for a in gpu.aliases),
    )


def _spelled(name: str) -> str:
    """A card's name as compared: lower case, without ``nvidia``, spaces, hyphens or underscores
    (``NVIDIA GeForce RTX 4090``, ``geforce-rtx-4090`` and ``GeForceRTX4090`` read alike)."""
    return re.sub(r"[\s_-]+", "", name.lower().strip()).removeprefix("nvidia")


def card_by_name(name: str) -> Gpu:
    """The card ``--gpu NAME`` names (:func:`gpu_names`; ``nvidia``, case, spaces, hyphens and underscores
    ignored); KeyError naming the known names."""
    wanted = _spelled(name)
    for gpu in GPUS.values():
        if wanted in map(_spelled, gpu_names(gpu)):
            return gpu
    known = ", ".join(n for g in GPUS.values() for n in (g.name.lower(), *(c.lower() for c in g.same_class)))
    raise KeyError(
        f"--gpu {name}: not a card of the GPU table ({known}; case, spaces and hyphens ignored, a memory suffix "
        "such as a100-80 taken); for another card give its memory with "
        "--gpu-memory-gb GB (what torch reports as its total, in GB of 1e9 bytes)"
    )


def speed_ratio(card: str, measured_on: str, fp8_gemms: bool) -> tuple[float, str]:
    """How fast ``card`` runs a step measured on ``measured_on`` (keys of :data:`GPUS`), as a fraction of
    that GPU's speed, and what limits it: the smallest of the two cards' ratios in dense BF16 tensor
    FLOP/s, in dense FP8 tensor FLOP/s when the step multiplies in FP8 (``fp8_gemms``), and in memory
    bandwidth. A step's time is its compute time plus its memory time, at most; each part scales by its
    own ratio, so the smallest ratio is the slowest the step can become: the conservative estimate.
    KeyError when the step multiplies in FP8 and ``card`` has no FP8 tensor cores."""
    to, of = GPUS[card], GPUS[measured_on]
    ratios = {"BF16 compute": to.peak_bf16_flops / of.peak_bf16_flops}
    if fp8_gemms:
        if to.peak_fp8_flops is None or of.peak_fp8_flops is None:
            lacking = card if to.peak_fp8_flops is None else measured_on
            raise KeyError(f"the run multiplies in FP8 and the {lacking} has no FP8 tensor cores")
        ratios["FP8 compute"] = to.peak_fp8_flops / of.peak_fp8_flops
    ratios["memory bandwidth"] = to.memory_bandwidth / of.memory_bandwidth
    limit = min(ratios, key=lambda k: ratios[k])
    *others, last = ratios
    return ratios[limit], f"{card} / {measured_on} {limit}, the smallest of the {', '.join(others)} and {last} ratios"
