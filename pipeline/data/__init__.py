"""Ray Data corpus preparation: read -> clean -> encode (SentencePiece) -> Parquet shards + manifest; batching."""
