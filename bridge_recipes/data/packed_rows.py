"""Megatron-Bridge dataset over packed SFT rows (``scripts/build_sft_rows.py`` output).

Each row of ``rows.parquet`` is exactly ``row_tokens`` token ids with a per-token loss mask
(1 = a supervised target: what the assistant writes). A training sample is one whole row, or with
``dataset.rows_per_sample`` k, k consecutive rows with boundaries joined into one packed sequence
(:func:`row_sample`):

- ``tokens`` = the row; ``labels[j]`` = ``row[j + 1]``;
- ``loss_mask[j]`` = ``mask[j + 1]``: position j is trained when the token it predicts is
  supervised, so system, user and tool tokens are never targets; the last position of the row
  and of each conversation predicts nothing (mask 0).

Rows built with ``--packing boundaries`` also carry their conversation boundaries, and a sample
then holds Megatron-Bridge's packed-sequence (THD) keys: ``cu_seqlens_q`` / ``cu_seqlens_kv``
(int32, 0 ... row_tokens) and ``max_seqlen_q`` / ``max_seqlen_kv``; ``position_ids`` restart
at 0 at each conversation. Megatron-Bridge's ``gpt_step`` turns these keys into
``PackedSeqParams(qkv_format="thd")`` for the model, so that attention (causal within each
conversation, ``bridge_recipes.features.packed_attention``), the Gated DeltaNet convolution and recurrence, rotary
positions and the MTP label shift all restart at each conversation (docs/sft_data.md). The config
then reports itself as an offline-packed dataset (``enable_offline_packing``), so Megatron-Bridge
takes one packed sequence per micro batch and hands the boundaries to middle pipeline stages too. A
recipe that trains k rows per micro batch says so (:data:`RECIPE_ROWS`, set by
``bridge_recipes.recipes.qwen.policy.rows_per_micro_batch``); on these rows the build makes them one packed
sequence of the k joined (:func:`join_recipe_rows`), and the dry run refuses any other micro batch
above 1.
``eos_joined`` rows (the benchmark workload) and ``one_per_row`` rows (one conversation, then padding) carry no
boundaries; positions run 0..L-1 over the row.

Rows are read in file order; the builder already permuted the conversations with its seed, and
epochs repeat that order, so runs are reproducible and resumable by sample index. A ``val/``
rows folder inside the dataset becomes the validation split.

Every open checks the folder (``integrity.check_rows``, which reads and hashes a folder once per process);
errors name the file and the fix.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bridge_recipes.data.integrity import VAL_DIR, RowsIntegrityError, check_rows, read_manifest  # noqa: F401

try:  # the Megatron-Bridge base class, when the stack is importable
    from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
except ImportError:  # pragma: no cover - the package requires Megatron-Bridge
    DatasetProvider, DatasetBuildContext = object, Any

log = logging.getLogger(__name__)
PackedRowsError = RowsIntegrityError


class PackedRowsDataset:
    """``num_samples`` samples cycling over the rows in file order; with ``rows_per_sample`` k > 1
    (rows with boundaries only) a sample is k consecutive rows joined into one packed sequence."""

    def __init__(
        self,
        folder: str | Path,
        seq_length: int,
        num_samples: int,
        vocab_size: int | None = None,
        tokenizer: str | None = None,
        rows_per_sample: int = 1,
    ):
        rows = check_rows(folder, seq_length=seq_length, vocab_size=vocab_size, tokenizer=tokenizer)
        self.manifest = rows.manifest
        self.ids, self.mask, self.cu = rows.ids, rows.mask, rows.cu
        self.boundaries = rows.cu is not None
        if rows_per_sample < 1 or (rows_per_sample > 1 and not self.boundaries):
            raise ValueError(
                f"rows_per_sample {rows_per_sample}: joining rows needs rows with boundaries (and at least 1)"
            )
        self.rows_per_sample = rows_per_sample
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    @property
    def epochs(self) -> float:
        """How many times ``num_samples`` passes over the rows."""
        return self.num_samples * self.rows_per_sample / len(self.ids)

    def __getitem__(self, index: int) -> dict:
        k = self.rows_per_sample
        rows = [(index * k + j) % len(self.ids) for j in range(k)]
        if not self.boundaries:
            return row_sample(self.ids[rows[0]], self.mask[rows[0]])
        return row_sample(
            *joined_rows([self.ids[r] for r in rows], [self.mask[r] for r in rows], [self.cu[r] for r in rows])
        )


def joined_rows(ids: list, masks: list, cus: list) -> tuple[Any, Any, Any]:
    """Rows with boundaries joined into one packed sequence: their tokens and masks end to end, each
    row's boundaries shifted by the tokens before it."""
    starts = np.cumsum([0] + [len(x) for x in ids[:-1]])
    cu = np.concatenate([[0]] + [np.asarray(c[1:]) + s for c, s in zip(cus, starts)])
    return np.concatenate(ids), np.concatenate(masks), cu


def row_sample(ids: Any, mask: Any, cu: Any = None) -> dict:
    """The training sample of one row: token ids, the per-token supervision mask, and the row's
    conversation boundaries ``cu`` (0, ..., row length; None for rows without them)."""
    import torch

    ids = np.asarray(ids).astype(np.int64)
    mask = np.asarray(mask).astype(np.float32)
    labels = np.empty_like(ids)
    labels[:-1], labels[-1] = ids[1:], 0
    loss_mask = np.zeros_like(mask)
    loss_mask[:-1] = mask[1:]
    sample = {"tokens": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
    if cu is None:
        sample["position_ids"] = torch.arange(len(ids), dtype=torch.int64)
        sample["loss_mask"] = torch.from_numpy(loss_mask)
        return sample
    cu = np.asarray(cu)
    loss_mask[cu[1:] - 1] = 0  # the last token of a conversation predicts nothing
    positions = np.arange(len(ids), dtype=np.int64) - np.repeat(cu[:-1], np.diff(cu))
    sample.update(
        loss_mask=torch.from_numpy(loss_mask),
        position_ids=torch.from_numpy(positions),
        **packed_seq_keys(cu),
    )
    return sample


def packed_seq_keys(cu: Any) -> dict[str, Any]:
    """Megatron-Bridge's packed-sequence (THD) keys of one row whose conversations end at ``cu``
    (0, ..., row length): ``cu_seqlens_q`` / ``cu_seqlens_kv`` (int32) and ``max_seqlen_q`` /
    ``max_seqlen_kv`` (the longest segment), unbatched."""
    import torch

    cu = np.asarray(cu)
    cu_t = torch.from_numpy(cu.astype(np.int32))
    longest = torch.tensor(int(np.diff(cu).max()), dtype=torch.int32)
    return {
        "cu_seqlens_q": cu_t,
        "cu_seqlens_kv": cu_t.clone(),
        "max_seqlen_q": longest,
        "max_seqlen_kv": longest.clone(),
    }


def _packing_of(path: str | None) -> str | None:
    """The packing mode of a rows folder, or None when it cannot be read (the checks say why)."""
    if not path:
        return None
    try:
        return read_manifest(path).get("packing")
    except RowsIntegrityError:
        return None


@dataclass(kw_only=True)
class PackedSFTRowsConfig(DatasetProvider):
    """Dataset config of the SFT recipes on built rows: ``--dataset sft-rows dataset.path=DIR``.

    ``vocab_size`` bounds the token ids (the model's vocabulary); ``tokenizer_path`` (a tokenizer
    folder or ``tokenizer.json``), when set, must be the one the rows were built with. (Not named
    ``tokenizer``: Megatron-Bridge's setup puts its built tokenizer object into a dataset config's
    ``tokenizer`` field when there is one.)
    """

    path: str | None = None
    seq_length: int
    vocab_size: int | None = None
    tokenizer_path: str | None = None
    # rows per sequence: k consecutive rows with boundaries joined into one packed sequence a sample
    # (model.seq_length k x the row): fewer, longer micro batches for the same rows
    rows_per_sample: int = 1
    dataloader_type: str | None = "single"
    skip_getting_attention_mask_from_dataset: bool = True
    pad_to_max_length: bool = True  # every row is exactly seq_length tokens

    @property
    def enable_offline_packing(self) -> bool:
        """True for rows with conversation boundaries: Megatron-Bridge then runs the THD path."""
        return _packing_of(self.path) == "boundaries"

    @property
    def offline_packing_specs(self):
        if not self.enable_offline_packing:
            return None
        from megatron.bridge.data.packing.config import PackedSequenceSpecs

        return PackedSequenceSpecs(packed_sequence_size=self.seq_length * self.rows_per_sample)

    def build_datasets(self, context: DatasetBuildContext):
        if not self.path:
            raise PackedRowsError("dataset.path is not set: point it at a folder built by scripts/build_sft_rows.py")
        train = PackedRowsDataset(
            self.path,
            self.seq_length,
            context.train_samples,
            self.vocab_size,
            self.tokenizer_path,
            self.rows_per_sample,
        )
        if warning := epochs_warning(self.path, len(train.ids), context.train_samples * self.rows_per_sample):
            log.warning(warning)
        valid = None
        val_dir = Path(self.path) / VAL_DIR
        if context.valid_samples and train.manifest.get("validation"):
            valid = PackedRowsDataset(
                val_dir,
                self.seq_length,
                context.valid_samples,
                self.vocab_size,
                self.tokenizer_path,
                self.rows_per_sample,
            )
        return train, valid, None


# More passes over the rows than this, or rows that do not fill one step, is warned of before launch:
# a tiny dataset read many times is learnt by heart.
MANY_EPOCHS = 10


def epochs_warning(path: str, rows: int, samples: int, rows_per_step: int | None = None) -> str | None:
    """The warning for a run that reads its ``rows`` more than :data:`MANY_EPOCHS` times (``samples`` rows
    read in all) or whose rows do not fill one step of ``rows_per_step``; None for other runs."""
    epochs = samples / rows
    small = rows_per_step is not None and rows < rows_per_step
    if epochs <= MANY_EPOCHS and not small:
        return None
    step = f"; one step takes {rows_per_step} rows, more than the folder holds" if small else ""
    return (
        f"the run reads {samples} training samples from {rows} rows in {path}: "
        f"{epochs:.2f} epochs ({math.ceil(epochs)} passes, each row seen up to that many times){step}; add data "
        "(scripts/build_sft_rows.py), or set the run's length in passes over the rows with --epochs N instead of "
        "train.train_iters x train.global_batch_size"
    )


# A recipe's rows per micro batch (``bridge_recipes.recipes.qwen.policy.rows_per_micro_batch``): an attribute of
# the config's ``train`` beside ``micro_batch_size``, outside its fields, so a saved config holds what
# the build made of it. Unset: one row a micro batch, or rows side by side that boundaries rows refuse.
RECIPE_ROWS = "recipe_rows_per_micro_batch"


def recipe_rows(cfg: Any) -> int:
    """The rows per micro batch the recipe declares (1 when it declares none)."""
    return getattr(cfg.train, RECIPE_ROWS, None) or 1


def join_recipe_rows(cfg: Any) -> list[str]:
    """The recipe's k rows per micro batch on rows with conversation boundaries: one packed sequence of
    the k rows joined, since Megatron-Bridge takes one packed (THD) sequence per micro batch, and one
    sequence of k rows costs the host a k-th of the launches of k sequences of one row. Sets
    ``train.micro_batch_size`` 1, ``dataset.rows_per_sample`` k, ``model.seq_length`` k x the row and
    ``train.global_batch_size`` (the recipe's rows per step) / k sequences. Returns the changes, one per
    line, or none: other data, no such declaration, or a micro batch, row count or length the
    overrides changed (the dry run names what does not fit)."""
    d, t, m = cfg.dataset, cfg.train, cfg.model
    k = recipe_rows(cfg)
    if k <= 1 or not isinstance(d, PackedSFTRowsConfig) or _packing_of(d.path) != "boundaries":
        return []
    changed = t.micro_batch_size != k or (d.rows_per_sample or 1) != 1 or m.seq_length != d.seq_length
    if changed or t.global_batch_size % k:
        return []
    rows = t.global_batch_size
    changes = [
        f"the recipe's {k} rows per micro batch joined into one packed sequence ({rows} rows per step, as before)",
        f"train.micro_batch_size: {k} -> 1",
        f"dataset.rows_per_sample: 1 -> {k}",
        f"model.seq_length: {m.seq_length} -> {m.seq_length * k}",
        f"train.global_batch_size: {rows} -> {rows // k} sequences",
    ]
    t.micro_batch_size, d.rows_per_sample = 1, k
    t.global_batch_size, m.seq_length = rows // k, m.seq_length * k
    return changes


def dry_run_problems(cfg: Any) -> tuple[list[str], list[str]]:
    """Errors and warnings of ``--dataset sft-rows`` for a built config (the runner's dry run)."""
    d = cfg.dataset
    if not d.path:
        return [
            "dataset='sft-rows' needs the rows folder: add dataset.path=/path/to/rows "
            "(scripts/build_sft_rows.py --out)"
        ], []
    tokenizer = d.tokenizer_path or _local_tokenizer(cfg)
    # the token ids must fit the model's embedding and the dataset's own bound (checked again at launch)
    bounds = [(v, f) for f, v in (("model.vocab_size", cfg.model.vocab_size), ("dataset.vocab_size", d.vocab_size))]
    vocab_size, vocab_field = min(((v, f) for v, f in bounds if v is not None), default=(None, None))
    try:
        rows = check_rows(
            d.path, seq_length=d.seq_length, vocab_size=vocab_size, tokenizer=tokenizer, vocab_field=vocab_field
        )
    except RowsIntegrityError as exc:
        return [str(exc)], []
    if problem := checkpoint_tokenizer_problem(cfg, rows.manifest, tokenizer):
        return [problem], []
    errors, warnings = [], []
    n_rows = len(rows.ids)
    k = getattr(d, "rows_per_sample", 1)
    per_step = cfg.train.global_batch_size * k
    if warning := epochs_warning(d.path, n_rows, cfg.train.train_iters * per_step, per_step):
        warnings.append(warning)
    packing = rows.manifest.get("packing")
    if packing == "eos_joined":
        warnings.append(
            f"rows in {d.path} are eos_joined (the benchmark workload): a conversation attends to the ones before it "
            "in its row; for fine-tuning build the default rows (--packing boundaries)"
        )
    if rows.cu is None:
        if k != 1:
            errors.append(
                f"dataset.rows_per_sample {k}: rows in {d.path} carry no conversation boundaries ({packing}); "
                "set dataset.rows_per_sample=1"
            )
        return errors, warnings
    m = cfg.model
    if m.seq_length != d.seq_length * k:
        errors.append(
            f"model.seq_length {m.seq_length} is not dataset.seq_length {d.seq_length} x dataset.rows_per_sample {k}: "
            f"a packed sample of {k} rows holds {d.seq_length * k} tokens; set model.seq_length={d.seq_length * k}"
        )
    errors += _micro_batch_problems(cfg)
    if (m.context_parallel_size or 1) > 1:
        errors.append(
            f"rows in {d.path} carry conversation boundaries; their attention (features.packed_attention) "
            "does not split a conversation across context-parallel ranks: set -cp 1, or build "
            "--packing one_per_row rows (long conversations, one per row)"
        )
    if getattr(m, "cuda_graph_impl", "none") not in (None, "none"):
        errors.append(
            f"rows in {d.path} carry conversation boundaries, whose cu_seqlens change shape from row to row; "
            "CUDA graphs need fixed shapes: set model.cuda_graph_impl=none or build --packing one_per_row rows"
        )
    if getattr(m, "deterministic_mode", False):
        errors.append(
            "Megatron-Core's Gated DeltaNet refuses packed sequences in deterministic mode "
            "(its torch fallback takes no cu_seqlens): set model.deterministic_mode=false or build "
            "--packing one_per_row rows"
        )
    return errors, warnings


def _micro_batch_problems(cfg: Any) -> list[str]:
    """A micro batch above one sequence on rows with boundaries: Megatron-Bridge takes one packed
    sequence per micro batch, so k rows per micro batch are one sequence of the k joined."""
    d, t = cfg.dataset, cfg.train
    mb, gb, per_seq = t.micro_batch_size, t.global_batch_size, d.rows_per_sample or 1
    if mb == 1:
        return []
    if mb == recipe_rows(cfg) and per_seq == 1 and gb % mb:
        return [
            f"train.global_batch_size {gb}: the recipe joins its {mb} rows per micro batch into one packed "
            f"sequence on rows with conversation boundaries ({d.path}), and {gb} rows per step do not make whole "
            f"sequences of {mb}; set -gb to a multiple of {mb}"
        ]
    k = mb * per_seq
    same_rows = f" -gb {gb // mb}" if gb % mb == 0 else ""
    return [
        f"train.micro_batch_size {mb}: rows in {d.path} carry conversation boundaries, and Megatron-Bridge takes "
        f"one packed sequence per micro batch; join the rows into one sequence instead: -mb 1 "
        f"dataset.rows_per_sample={k} model.seq_length={d.seq_length * k}{same_rows} "
        f"({gb * per_seq} rows per step, {k} per micro batch), or set -mb 1, or build --packing one_per_row rows"
    ]


def checkpoint_tokenizer_problem(cfg: Any, manifest: dict, checked: str | None) -> str | None:
    """The rows against the starting checkpoint's own tokenizer (``checkpoint.hf_source_path``, the
    ``--hf-checkpoint`` folder) when they were checked against another (``checked``: a tokenizer
    override): the checkpoint's weights know its ids and chat template, whatever the run's tokenizer."""
    from bridge_recipes.data.integrity import check_tokenizer, tokenizer_json

    own = getattr(getattr(cfg, "checkpoint", None), "hf_source_path", None)
    if not isinstance(own, str) or not tokenizer_json(own).is_file():
        return None
    if checked is not None and tokenizer_json(checked).resolve() == tokenizer_json(own).resolve():
        return None
    try:
        check_tokenizer(Path(cfg.dataset.path), manifest, own)
    except RowsIntegrityError as exc:
        return f"{exc} (checked against the --hf-checkpoint folder {own}, whose weights the run trains)"
    return None


def _local_tokenizer(cfg: Any) -> str | None:
    """The recipe tokenizer's folder or file, when it is a local path (Hub ids are not checked)."""
    model = getattr(getattr(cfg, "tokenizer", None), "tokenizer_model", None)
    if isinstance(model, (str, Path)) and Path(model).expanduser().exists():
        return str(model)
    return None
