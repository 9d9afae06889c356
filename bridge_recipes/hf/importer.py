"""The import: a Hugging Face folder into a Megatron checkpoint, and the runner's convert-once cache.

:func:`import_checkpoint` checks the folder against a recipe and runs Megatron-Bridge's
``AutoBridge`` (its registered Qwen3.5 bridges hold the weight mapping; a released VL folder's
language model goes through :mod:`bridge_recipes.hf.released_bridge`) into a temporary folder
next to the output, renamed into place only once the whole conversion succeeded.
:func:`cache_key` / :func:`cached_import` give the runner's convert-once cache.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge_recipes.hf.architecture import (
    _fix_hint,
    check_against,
    check_folder_for_recipe,
    found_fields,
    mismatch_error,
    spec_for_recipe,
    takes_language_model,
)
from bridge_recipes.hf.checkpoint import (
    TOKENIZER_FILES,
    HfFolder,
    _conversion_context,
    _need_gpu,
    _no_apex_fusion,
    _quiet_megatron_import,
    inspect_folder,
    is_megatron_checkpoint,
    refuse_overlap,
    staged_output,
)
from bridge_recipes.hf.files import CONFIG_FILE, INDEX_FILE, HfCheckpointError

CACHE_ENV = "QWEN35_RECIPES_CACHE"
CACHE_KEY_VERSION = "1"  # bump when the import's output changes for the same input


def convert_hf_to_megatron(src: Path, out: Path) -> None:
    """Megatron-Bridge's import (``AutoBridge.import_ckpt``'s steps, with APEX-free model building):
    the HF weights through the registered Qwen3.5 bridge into a torch_dist checkpoint at ``out``."""
    _need_gpu("the import")
    _quiet_megatron_import()
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(src))
    with _conversion_context():
        provider = bridge.to_megatron_provider(load_weights=True)
        _no_apex_fusion(provider)
        provider.finalize()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        bridge.save_megatron_model(model, str(out), hf_tokenizer_path=str(src), low_memory_save=True)


def _convert_released(src: Path, out: Path) -> None:
    _need_gpu("the import")
    _quiet_megatron_import()
    from bridge_recipes.hf import released_bridge

    released_bridge.convert_to_megatron(inspect_folder(src), out, context=_conversion_context, prepare=_no_apex_fusion)


def import_checkpoint(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    recipe: str | None = None,
    expected: dict[str, Any] | None = None,
    scaled: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    text_model: bool | None = None,
    convert: Callable[[Path, Path], None] | None = None,
) -> Path:
    """Check ``source`` against ``recipe`` (or ``expected`` fields) and convert it into ``out``.
    ``text_model`` (default: whether ``recipe`` is a text recipe): a released VL folder's
    language model and MTP layer are imported as the text model, its vision tower left out."""
    refuse_overlap(out, ("--hf", source), overwrite=overwrite)
    folder = inspect_folder(source, progress=progress)
    if text_model is None:
        text_model = recipe is not None and not spec_for_recipe(recipe).is_vl
    as_text = takes_language_model(folder, not text_model)
    if recipe is not None:
        if problems := check_folder_for_recipe(folder, recipe, scaled=scaled):
            raise mismatch_error(folder.path, problems, _fix_hint(scaled))
    elif expected is not None:
        if problems := check_against(found_fields(folder, as_text=as_text), expected, scaled=scaled):
            raise mismatch_error(folder.path, problems, _fix_hint(scaled))
    if convert is None:
        convert = _convert_released if as_text else convert_hf_to_megatron
    with staged_output(out, overwrite) as tmp:
        convert(folder.path, tmp)
        if not is_megatron_checkpoint(tmp):
            raise HfCheckpointError(f"the conversion wrote no Megatron checkpoint into {tmp}")
    return Path(out)


# --------------------------------------------------------------------------- runner cache


def cache_root() -> Path:
    """$QWEN35_RECIPES_CACHE/hf_import, else ~/.cache/qwen35_recipes/hf_import."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "qwen35_recipes") / "hf_import"


def cache_problem(folder: HfFolder | None = None, text_model: bool = False) -> str | None:
    """Why the conversion cache (:func:`cache_root`) cannot be created or written, or None: ``$QWEN35_RECIPES_CACHE``
    (or a folder on the way to it) naming a file, or a folder without write access (tried by making a
    folder there: a pseudo file system such as /proc takes none, whatever its permissions say; no matter when
    ``folder``'s conversion is there already). Checked at the dry run; otherwise the launch stops at
    the conversion, on the GPU machine."""
    root, given = cache_root(), os.environ.get(CACHE_ENV)
    key = cache_key(folder, text_model) if folder is not None else None
    if key is not None and (root / key).is_dir() and is_megatron_checkpoint(root / key):
        return None
    named = f"${CACHE_ENV}={given}" if given else f"the default cache {root.parent} (${CACHE_ENV} unset)"
    fix = f"point ${CACHE_ENV} at a folder the run can write (it creates {root.name}/ inside)"
    existing = root
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "not a folder"
        return f"{named}: {existing} is {what}, so the converted checkpoint cannot be kept in {root}; {fix}"
    if not os.access(existing, os.W_OK | os.X_OK) or not _can_make_folder(existing):
        return f"{named}: {existing} cannot be written, so the converted checkpoint cannot be kept in {root}; {fix}"
    return None


def _can_make_folder(parent: Path) -> bool:
    """Whether a folder can be made in ``parent`` (one is made and removed): file permissions alone do not
    tell, e.g. for root on a pseudo file system such as /proc, which takes no new folder."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=parent))
    except OSError:
        return False
    return True


def cache_key(folder: HfFolder, text_model: bool = False) -> str:
    """sha256 over config.json, the shard index, each shard's name, size and mtime, and the tokenizer
    files: a changed or replaced file gives a new key (a conversion is never reused for other weights).
    A released VL folder converted for a text recipe (``text_model``: its language model alone) has
    a key of its own beside its VL conversion."""
    from importlib.metadata import version

    h = hashlib.sha256()
    h.update(f"key-v{CACHE_KEY_VERSION} megatron-bridge {version('megatron-bridge')}\n".encode())
    if takes_language_model(folder, not text_model):
        h.update(b"form: language model of a released VL folder\n")
    for name in (CONFIG_FILE, INDEX_FILE, *TOKENIZER_FILES):
        file = folder.path / name
        h.update(f"{name}\n".encode())
        h.update(file.read_bytes() if file.is_file() else b"<absent>")
    for shard in folder.shards:
        st = shard.stat()
        h.update(f"{shard.name} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def cached_import(
    folder: HfFolder,
    *,
    progress: bool = True,
    text_model: bool = False,
    convert: Callable[[Path, Path], None] | None = None,
) -> tuple[Path, bool]:
    """The cache folder holding ``folder``'s Megatron conversion (for a text model: see
    :func:`import_checkpoint`), converting first when absent; (path, True when this call converted)."""
    target = cache_root() / cache_key(folder, text_model)
    if target.is_dir() and is_megatron_checkpoint(target):
        return target, False
    import_checkpoint(folder.path, target, overwrite=True, progress=progress, text_model=text_model, convert=convert)
    return target, True
