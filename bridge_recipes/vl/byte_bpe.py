"""A small byte-level BPE tokenizer trained offline, for synthetic data and offline processors
that must not download a real tokenizer. Every byte stays encodable (the byte alphabet seeds
the vocabulary), and the special tokens come first, in the order given."""

from __future__ import annotations

from collections.abc import Iterable


def train_byte_bpe(texts: Iterable[str], special_tokens: list[str], vocab_size: int):
    """A ``tokenizers.Tokenizer`` trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special_tokens,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok
