"""Raw text to prepared shards: sources, tokenizer, examples, masking, prepare (passes + Ray), dataset."""
