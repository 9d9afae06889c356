"""A folder's weights held against the model its ``config.json`` declares, and quantized releases named.

:func:`weights_problem` compares the tensors :func:`bridge_recipes.hf.declared.declared` derives
with the shard headers, never a tensor's data: tensors the index omits, declared tensors missing,
an embedding of another vocabulary, shapes the config does not give, weights that are not
floating point, layers or experts beyond the config's counts, a tokenizer whose ids the embedding
has no rows for. Quantized releases (``-FP8`` folders: ``quantization_config``, F8_E4M3 weights
with ``*.weight_scale_inv`` block scales) are named by :func:`quantized_problem`, with the BF16
release to download instead.

Standard library only (the catalog of models aside).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_recipes.hf.declared import (
    LANGUAGE,
    MTP,
    VISION,
    Dim,
    Tensor,
    declared,
    declared_count,
    layer_types,
    sections,
)
from bridge_recipes.hf.files import CONFIG_FILE, INDEX_FILE
from bridge_recipes.hf.released import MTP_PREFIX, VISION_PREFIX

FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
# The names only a quantized release holds beside its weights (block scales, packed integers).
QUANTIZED_SUFFIXES = ("_scale_inv", ".weight_scale", ".input_scale", ".qweight", ".qzeros", ".g_idx")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
_LAYER = re.compile(r"^(?P<head>.*?(?:layers|blocks|experts))\.(?P<n>\d+)\.")


# --------------------------------------------------------------------------- quantized releases


def hub_name(path: Path) -> str:
    """The folder's name as the hub knows it: ``Org/Name`` for a snapshot in the Hugging Face cache
    (``models--Org--Name/snapshots/REV``), else the folder's own name."""
    for part in reversed(path.parts):
        if part.startswith("models--") and part.count("--") >= 2:
            return part.removeprefix("models--").replace("--", "/", 1)
    return path.name


_QUANTIZED_NAME = re.compile(r"^(?P<base>.+?)[-_.](?:fp8|awq|gptq[-_\w]*|int4|int8|w4a16|w8a8)$", re.I)
EXAMPLE_RELEASE = ("Qwen/Qwen3.6-35B-A3B", "Qwen/Qwen3.6-35B-A3B-FP8")


def bf16_release(path: Path, text: Mapping[str, Any]) -> str:
    """The BF16 release to download instead of the quantized folder ``path``: its name without the
    quantization suffix (the catalog's hub id when it names one), else the catalog's checkpoints of
    its size, else an example."""
    from bridge_recipes.models.qwen35 import TEXT_SPECS

    catalog = [(s, c.hf_id) for s in TEXT_SPECS for c in s.checkpoints.values()]
    name = hub_name(path)
    if m := _QUANTIZED_NAME.match(name):
        base = next((i for _, i in catalog if i.lower().endswith("/" + m["base"].lower().split("/")[-1])), m["base"])
        return f"{base} instead of {name}"
    sizes = (text.get("hidden_size"), text.get("num_hidden_layers"), text.get("num_experts"))
    ids = [i for s, i in catalog if (s.hidden_size, s.num_layers, s.num_experts) == sizes]
    return " or ".join(ids) if ids else f"e.g. {EXAMPLE_RELEASE[0]} instead of {EXAMPLE_RELEASE[1]}"


def quantized_problem(
    path: Path, config: Mapping[str, Any], text: Mapping[str, Any], names: Iterable[str], dtypes: Mapping[str, int]
) -> str | None:
    """Why ``path`` is a quantized release these recipes cannot start from (its config's
    ``quantization_config``, scale tensors beside the weights, FP8 weights), or None. ``dtypes``:
    tensors per dtype of the shard headers read so far."""
    settings = config.get("quantization_config") or text.get("quantization_config")
    scales = sorted(n for n in names if n.endswith(QUANTIZED_SUFFIXES))
    fp8 = {d: n for d, n in sorted(dtypes.items()) if d in FP8_DTYPES}
    if not (settings or scales or fp8):
        return None
    found, method = [], None
    if isinstance(settings, Mapping):
        method = settings.get("quant_method")
        block = settings.get("weight_block_size")
        found.append(
            f"{CONFIG_FILE} quantization_config quant_method {method!r}"
            + (f", weight_block_size {block}" if block else "")
        )
    elif settings:
        found.append(f"{CONFIG_FILE} quantization_config {settings!r}")
    if scales:
        found.append(f"{len(scales)} scale tensor(s) beside the weights, e.g. {scales[0]}")
    found += [f"{n} weight(s) stored as {d}" for d, n in fp8.items()]
    fp8_release = fp8 or str(method).lower() == "fp8" or any(s.endswith("_scale_inv") for s in scales)
    return (
        f"{path} is {'an FP8' if fp8_release else 'a quantized'} release ({'; '.join(found)}): these recipes "
        "start from the BF16 weights (the FP8-base recipes make their FP8 copy from them) and would take the "
        f"quantized values and their scales for weights; download the BF16 release ({bf16_release(path, text)}) "
        "and pass that folder"
    )


# --------------------------------------------------------------------------- the weights against the config


def _groups(names: Iterable[str], limit: int = 3) -> str:
    """Names summarized by layer (``model.language_model.layers.3.* (61)``), the first ``limit`` groups."""
    counts: dict[str, int] = {}
    for n in sorted(names, key=_natural):
        m = _LAYER.match(n)
        key = f"{m['head']}.{m['n']}.*" if m else n
        counts[key] = counts.get(key, 0) + 1
    shown = [k if c == 1 and "*" not in k else f"{k} ({c})" for k, c in list(counts.items())[:limit]]
    more = len(counts) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _show(shape: Iterable[Dim]) -> str:
    return "[" + ", ".join(f"{v if v is not None else '?'} ({label})" for v, label in shape) + "]"


def _fits(found: list[int], tensor: Tensor) -> bool:
    want = [v for v, _ in tensor.shape]
    if found == want:
        return True
    if len(found) != len(want):
        return False
    if tensor.any_order:  # stacked experts: the expert count first, then the two widths in either order
        rest = want[1:]
        return _same(found[:1], want[:1]) and (
            None in rest or sorted(found[1:]) == sorted(v for v in rest if v is not None)
        )
    return _same(found, want)


def _same(found: list[int], want: list[int | None]) -> bool:
    return all(w is None or f == w for f, w in zip(found, want))


def largest_token_id(file: Path) -> int | None:
    """The largest id a ``tokenizer.json`` gives a token (its model's vocabulary and its added
    tokens), or None when the file cannot tell (unreadable, another layout)."""
    try:
        st = file.stat()
    except OSError:
        return None
    return _largest_token_id(str(file), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _largest_token_id(file: str, size: int, mtime_ns: int) -> int | None:
    """:func:`largest_token_id` of one version of the file (a released tokenizer.json is read once)."""
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids: list[Any] = []
    if isinstance(vocab, dict):
        ids = list(vocab.values())
    elif isinstance(vocab, list) and vocab:
        ids = [len(vocab) - 1]  # a Unigram vocabulary: the id is the position
    added = data.get("added_tokens")
    ids += [t.get("id") for t in added if isinstance(t, dict)] if isinstance(added, list) else []
    ints = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
    return max(ints) if ints else None


@dataclass(frozen=True)
class Folder:
    """What the weights check reads of a folder: its config and the shard headers (tensor name ->
    header entry, and -> shard file), the index's names when it has one."""

    path: Path
    config: Mapping[str, Any]
    vl: bool
    moe: bool
    entries: Mapping[str, Mapping[str, Any]]
    files: Mapping[str, str]
    indexed: Mapping[str, str] | None


def weights_problem(folder: Folder) -> str | None:
    """Why the folder's weights are not the model its config declares, or None: tensors the shards
    hold and the index omits, quantized weights, declared tensors missing, an embedding of another
    vocabulary, shapes the config does not give, weights that are not floating point, layers or
    experts beyond the config's counts, a tokenizer whose ids the embedding has no rows for."""
    held = folder.entries
    if folder.indexed is not None and (unlisted := [n for n in held if n not in folder.indexed]):
        files = sorted({folder.files[n] for n in unlisted})
        return (
            f"{folder.path / INDEX_FILE} does not list {len(unlisted)} tensor(s) its shards hold "
            f"({_groups(unlisted)}; in {', '.join(files[:3])}): the model would load without them; the index is "
            f"damaged or from another download: download {INDEX_FILE} again"
        )
    text, where, prefix = sections(folder.config, folder.vl)
    dtypes: dict[str, int] = {}
    for entry in held.values():
        dtypes[str(entry.get("dtype"))] = dtypes.get(str(entry.get("dtype")), 0) + 1
    if problem := quantized_problem(folder.path, folder.config, text, held, dtypes):
        return problem
    if (count := declared_count(folder.config, folder.vl, folder.moe)) > 4 * len(held) + 10_000:
        return (
            f"{folder.path}: its {CONFIG_FILE} declares about {count:,} tensors ({where}num_hidden_layers "
            f"{text.get('num_hidden_layers')}, {where}num_experts {text.get('num_experts')}), its weights hold "
            f"{len(held):,}: the config is not these weights' (edited, or of another model); download {CONFIG_FILE} "
            "again with the weights"
        )
    unknown: set[str] = set()
    want = declared(folder.config, folder.vl, folder.moe, held, unknown)
    if unknown:
        return (
            f"{folder.path / CONFIG_FILE}: {', '.join(sorted(unknown))} missing or not a whole number; the shapes of "
            "the weights follow it (a converter would take a default of another model): download config.json again "
            "with the weights"
        )
    for check in (_missing, _vocabulary, _shapes, _dtypes, _beyond, _tokenizer):
        if problem := check(folder, want, text, where, prefix):
            return problem
    return None


def _declares(part: str, text: Mapping[str, Any], where: str, config: Mapping[str, Any]) -> str:
    """The config field that declares ``part``'s tensors, with its value."""
    if part == VISION:
        vision = config.get("vision_config")
        return f"vision_config.depth {vision.get('depth') if isinstance(vision, Mapping) else None}"
    name = "mtp_num_hidden_layers" if part == MTP else "num_hidden_layers"
    return f"{where}{name} {text.get(name)}"


def _missing(
    folder: Folder, want: Mapping[str, Tensor], text: Mapping[str, Any], where: str, prefix: str
) -> str | None:
    lines = []
    for part in (LANGUAGE, MTP, VISION):
        declared_here = [n for n, t in want.items() if t.part == part and not t.optional]
        missing = [n for n in declared_here if n not in folder.entries]
        if not missing:
            continue
        declares = _declares(part, text, where, folder.config)
        if part == VISION and len(missing) == len(declared_here):
            lines.append(
                f"{folder.path} holds no vision tower weights ({VISION_PREFIX}*), though its {CONFIG_FILE} has a "
                f"vision_config ({declares}, {len(declared_here)} tensors): a released folder has them and the "
                "conversion and the export need them; download the folder again whole, or pass a text-form folder "
                "(architectures Qwen3_5(Moe)ForCausalLM, no vision_config; scripts/convert_checkpoint.py toy "
                "--text-only makes a toy of that form)"
            )
        elif part == MTP and len(missing) == len(declared_here):
            depth = text.get("mtp_num_hidden_layers")
            lines.append(
                f"{folder.path}: {where}mtp_num_hidden_layers is {depth} but the weights lack MTP layer(s) "
                f"{list(range(depth if isinstance(depth, int) else 0))} ({MTP_PREFIX}layers.N.*, {len(missing)} "
                "tensors): a released folder has its MTP layer, which the conversion and serving with speculative "
                "decoding need; download the folder again whole"
            )
        else:
            lines.append(
                f"{folder.path} lacks {len(missing)} of the {len(declared_here)} {part} tensors its {CONFIG_FILE} "
                f"declares ({declares}): {_groups(missing)}; the download is incomplete or the folder was edited: "
                "download it again whole"
            )
    return "\n  ".join(lines) or None


def _vocabulary(
    folder: Folder, want: Mapping[str, Tensor], text: Mapping[str, Any], where: str, prefix: str
) -> str | None:
    embed = f"{prefix}embed_tokens.weight"
    rows = folder.entries[embed]["shape"][0] if folder.entries[embed]["shape"] else None
    vocab = want[embed].shape[0][0]
    if vocab is None or rows is None or vocab == rows:
        return None
    largest = largest_token_id(folder.path / "tokenizer.json")
    tokens = f", and tokenizer.json's largest token id is {largest}" if largest is not None else ""
    fix = f"set {where}vocab_size to {rows} in {folder.path / CONFIG_FILE} (the embedding's rows)"
    if largest is not None and largest >= rows:
        fix += " and copy the tokenizer files of the model's own release into the folder"
    return (
        f"{folder.path}: {CONFIG_FILE} {where}vocab_size is {vocab}, but the embedding {embed} has {rows} rows"
        f"{tokens}: the config does not describe these weights; {fix}, or download {CONFIG_FILE} again"
    )


def _shapes(
    folder: Folder, want: Mapping[str, Tensor], text: Mapping[str, Any], where: str, prefix: str
) -> str | None:
    wrong = [n for n, t in want.items() if n in folder.entries and not _fits(folder.entries[n]["shape"], t)]
    if not wrong:
        return None
    shown = "; ".join(
        f"{folder.files[n]}: {n} has shape {folder.entries[n]['shape']}, {CONFIG_FILE} declares {_show(want[n].shape)}"
        for n in wrong[:3]
    )
    more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
    return (
        f"{folder.path}: {len(wrong)} tensor(s) of another shape than its {CONFIG_FILE} declares: {shown}{more}; "
        f"the config and the weights are of different models, or the shard is damaged: download the folder again "
        "whole (config.json with its weights)"
    )


def _dtypes(
    folder: Folder, want: Mapping[str, Tensor], text: Mapping[str, Any], where: str, prefix: str
) -> str | None:
    wrong = [n for n in want if n in folder.entries and folder.entries[n].get("dtype") not in FLOAT_DTYPES]
    if not wrong:
        return None
    n = wrong[0]
    return (
        f"{folder.files[n]} in {folder.path}: {n} is stored as {folder.entries[n].get('dtype')}"
        f"{f' (and {len(wrong) - 1} more tensors)' if len(wrong) > 1 else ''}; model weights are floating point "
        f"({', '.join(FLOAT_DTYPES)}): the shard is damaged or of another format; download it again"
    )


def _beyond(
    folder: Folder, want: Mapping[str, Tensor], text: Mapping[str, Any], where: str, prefix: str
) -> str | None:
    """Layers, MTP layers, vision blocks or experts the weights hold beyond the config's counts."""
    vision = folder.config.get("vision_config") if folder.vl else None
    counts = [
        (re.compile(rf"^{re.escape(prefix)}layers\.(\d+)\."), len(layer_types(text)), f"{where}num_hidden_layers"),
        (
            re.compile(rf"^{re.escape(MTP_PREFIX)}layers\.(\d+)\."),
            text.get("mtp_num_hidden_layers"),
            f"{where}mtp_num_hidden_layers",
        ),
        (
            re.compile(r"\.mlp\.experts\.(\d+)\."),
            text.get("num_experts") if folder.moe else None,
            f"{where}num_experts",
        ),
    ]
    if isinstance(vision, Mapping):
        counts.append(
            (re.compile(rf"^{re.escape(VISION_PREFIX)}blocks\.(\d+)\."), vision.get("depth"), "vision_config.depth")
        )
    undeclared = [n for n in folder.entries if n not in want]  # what lies beyond a count is among these
    for pattern, count, field in counts:
        if not isinstance(count, int):
            continue
        extra = [n for n in undeclared if (m := pattern.search(n)) and int(m[1]) >= count]
        if extra:
            return (
                f"{folder.path}: the weights hold {_groups(extra)} beyond the {count} its {CONFIG_FILE} declares "
                f"({field}): the config is not these weights' (edited, or of another model); download "
                f"{CONFIG_FILE} again with the weights"
            )
    return None


def _tokenizer(
    folder: Folder, want: Mapping[str, Tensor], text: Mapping[str, Any], where: str, prefix: str
) -> str | None:
    embed = f"{prefix}embed_tokens.weight"
    rows = folder.entries[embed]["shape"][0]
    largest = largest_token_id(folder.path / "tokenizer.json")
    if largest is None or largest < rows:
        return None
    return (
        f"{folder.path}: tokenizer.json gives token ids up to {largest}, but the embedding {embed} has {rows} rows "
        f"({where}vocab_size {text.get('vocab_size')}): the tokenizer is not this model's; copy tokenizer.json and "
        "tokenizer_config.json of the model's own release into the folder"
    )
