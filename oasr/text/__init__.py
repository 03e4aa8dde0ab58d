"""Text, the bottom layer: token ids <-> text (`oasr.text.tokenizer`) and transcript scoring
(`oasr.text.wer`).

Pure Python over strings and files; every layer above may import it, and it imports no other
part of oasr. (`oasr.decoding` re-exports the tokenizers for the decoder's users.)
"""
