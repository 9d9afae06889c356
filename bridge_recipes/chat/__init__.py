"""Chat rendering: conversation records in their formats, read, checked and rendered with a
tokenizer's chat template into token ids and the spans the assistant writes."""
