"""The GPU a process trains on, and a cap that makes a larger GPU behave as a smaller card.

``cap(gb)`` limits PyTorch's caching allocator so that what the process holds on the device (the
allocator's reserved memory plus what lives outside it: the CUDA context, library handles) stays
within ``gb`` GB of 1e9 bytes: the memory of an 80 GB or 48 GB card, measured on a larger GPU. An
allocation past the cap fails with torch's out-of-memory error, as it would on the card; it never
spills into the rest of the device. ``summary()`` states the peak the process reached against the
cap, so a result can show it stayed within it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge_recipes.hardware.gpus import GB, has_fp8, has_mxfp8

# device memory a process takes outside the caching allocator after the cap is set (cuBLAS and
# Transformer Engine handles, NCCL's communicators of a one-GPU run): kept free under the cap
OUTSIDE_HEADROOM_GB = 0.5


@dataclass(frozen=True)
class Device:
    name: str
    memory_gb: float  # what the device reports, GB of 1e9 bytes
    capability: tuple[int, int]

    @property
    def fp8(self) -> bool:
        return has_fp8(self.capability)

    @property
    def mxfp8(self) -> bool:
        return has_mxfp8(self.capability)


def current_device() -> Device | None:
    """The GPU torch trains on, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return Device(props.name, props.total_memory / GB, (props.major, props.minor))


def cap_value_problem(gb: float) -> str | None:
    """Why ``--gpu-memory-gb gb`` is no GPU's memory (not a positive finite number, or more than the
    largest card of :data:`~bridge_recipes.hardware.gpus.GPUS` holds), or None."""
    import math

    from bridge_recipes.hardware.gpus import GPUS

    largest = max(GPUS.values(), key=lambda g: g.memory_bytes)
    if not math.isfinite(gb) or gb <= 0:
        return f"--gpu-memory-gb {gb:g}: a positive, finite number of GB (1e9 bytes), or name the card with --gpu"
    if gb > largest.usable_memory_gb:
        return (
            f"--gpu-memory-gb {gb:g}: more than any GPU holds (the largest known, {largest.name}, has "
            f"{largest.usable_memory_gb:.1f} GB); give the card's memory, or name the card with --gpu"
        )
    return None


def nominal_note(gb: float, prefer: str | None = None) -> str | None:
    """A note when ``--gpu-memory-gb`` is the size printed on cards of :data:`~bridge_recipes.hardware.gpus.GPUS`
    (80 for an H100): such a card holds more (GB of 1e9 bytes: an H100 has 85.0), and the cap keeps the
    figure as given; ``--gpu NAME`` plans for the whole card."""
    from bridge_recipes.hardware.gpus import GPUS, gpu_names

    cards = [g for g in GPUS.values() if g.memory_gb == gb and g.usable_memory_gb > gb]
    if not cards:
        return None
    cards.sort(key=lambda g: g.name.lower() != (prefer or "").lower())  # ``prefer`` (the recipe's GPU) first
    names = ", ".join(f"{gpu_names(g)[0]} {g.usable_memory_gb:.1f} GB" for g in cards)
    return (
        f"--gpu-memory-gb {gb:g} is the size printed on cards sold as {gb:g} GB, which hold more ({names}); the "
        f"cap stays at {gb:g} GB as given: to plan and train for the whole card, name it instead, "
        f"--gpu {gpu_names(cards[0])[0]}"
    )


def cap_problem(gb: float, device: Device | None) -> str | None:
    """Why ``--gpu-memory-gb gb`` cannot be honoured on ``device``, or None."""
    if problem := cap_value_problem(gb):
        return problem
    if device is None:
        return f"--gpu-memory-gb {gb:g}: torch sees no CUDA GPU to cap"
    if gb > device.memory_gb:
        return (
            f"--gpu-memory-gb {gb:g}: more than the {device.memory_gb:.1f} GB this {device.name} has; "
            "give at most its memory, or drop the option"
        )
    return None


def outside_allocator_bytes() -> int:
    """Device memory in use that the caching allocator does not hold (context, libraries, other processes)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def cap(gb: float) -> str:
    """Limit this process to ``gb`` GB of the current GPU (module docstring); returns the line to log."""
    import torch

    torch.cuda.init()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    outside = outside_allocator_bytes()
    allowed = gb * GB - outside - OUTSIDE_HEADROOM_GB * GB
    if allowed <= 0:
        raise ValueError(
            f"--gpu-memory-gb {gb:g}: {outside / GB:.1f} GB of the device are already in use outside this "
            "process's allocator; nothing is left under the cap"
        )
    torch.cuda.set_per_process_memory_fraction(allowed / total)
    return (
        f"GPU memory capped at {gb:g} GB: the allocator may reserve {allowed / GB:.2f} GB of the "
        f"{total / GB:.1f} GB device ({outside / GB:.2f} GB in use outside it, {OUTSIDE_HEADROOM_GB:g} GB kept "
        "for libraries)"
    )


def summary(gb: float | None) -> str:
    """The process's peak on the device: the allocator's peak reserved plus what is in use outside it now,
    against the cap ``gb`` when there is one."""
    import torch

    reserved = torch.cuda.max_memory_reserved()
    outside = outside_allocator_bytes()
    line = (
        f"GPU memory peak: {torch.cuda.max_memory_allocated() / GB:.2f} GB allocated, {reserved / GB:.2f} GB "
        f"reserved + {outside / GB:.2f} GB outside the allocator = {(reserved + outside) / GB:.2f} GB"
    )
    if gb is not None:
        line += f" of the {gb:g} GB cap ({'within' if reserved + outside <= gb * GB else 'OVER'})"
    return line
