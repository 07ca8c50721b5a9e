"""Text <-> ids and scores: the SentencePiece tokenizer, the Translator (beam search), sacreBLEU metrics."""
