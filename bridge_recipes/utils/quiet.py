"""Other libraries' start-up notices, kept off the commands' output.

Importing Megatron-Bridge prints about 17 lines that concern neither the run nor anything a user can
change (a deprecated package name inside torch, Apex and Triton absent on a CPU machine, experimental
classes of models the recipes do not use). :func:`install` filters exactly those, by library and
message, before they are imported; every other warning still shows. ``--verbose`` (or
``BRIDGE_RECIPES_VERBOSE=1``) shows them all.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

VERBOSE_ENV = "BRIDGE_RECIPES_VERBOSE"

# (module the warning is issued from, message start): Python warnings
WARNINGS = (
    ("torch.cuda", "The pynvml package is deprecated"),
    ("megatron.core", "Apex is not installed"),
    ("fla", "Triton is not supported on current platform"),
    ("megatron.core.models.mimo", "MimoModelConfig is experimental"),
    ("megatron.core", "Could not determine rank from torch.distributed"),
)
# (logger that emits it, message pattern): log records (a logger's filter sees only its own records)
FAST_PATH = r"The fast path is not available because one of the required library is not installed"
LOG_RECORDS = (
    ("torch.utils.cpp_extension", r"No CUDA runtime is found"),
    ("megatron.bridge.models.gemma.gemma2_provider", r"Gemma2: PyTorch FlexAttention available"),
    ("transformers.configuration_utils", r"`torch_dtype` is deprecated"),
    ("transformers", r"PyTorch was not found\. Models won't be available"),  # the light install's
    ("transformers.models.qwen3_5.modeling_qwen3_5", FAST_PATH),
    ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", FAST_PATH),
)


class _Drop(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def verbose(argv: list[str] | None = None) -> bool:
    """Whether the command asked for every library's notices."""
    return "--verbose" in (sys.argv if argv is None else argv) or os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def install(argv: list[str] | None = None) -> bool:
    """Filter the known notices unless verbose; returns whether they are filtered. Idempotent."""
    if verbose(argv):
        return False
    for module, message in WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), module=re.escape(module) + r"(\.|$)")
    for name, pattern in LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_Drop(pattern))
    return True


def add_flag(parser) -> None:
    """The ``--verbose`` option of a command: every library's notices (read by :func:`install`)."""
    parser.add_argument("--verbose", action="store_true", help="also show other libraries' start-up notices")
