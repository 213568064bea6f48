"""Raw text to prepared shards: sources (+ wiki), tokenizer, examples, masking, dedup (pure functions); arrow, pool,
passes (engine-free pass bodies), executors (local processes, Ray actors), prepare (planner + driver), stages,
progress; dataset (a prepared dataset, validated)."""
