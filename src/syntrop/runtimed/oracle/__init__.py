"""A differential oracle for llama.cpp: the llama architecture's forward pass
in numpy, from the GGUF file's own tensors, to check llama.cpp's logits.

- `weights`: the file read with the gguf package (GGUFReader) and every
  tensor dequantized with gguf.quants (F32, F16, Q8_0, Q4_0, Q4_1, Q4_K and
  the other types it knows), to float64.
- `forward`: token embedding, per layer RMSNorm, grouped-query attention
  with rotary position embeddings (llama.cpp's "normal" pairing of adjacent
  dimensions), a causal mask and a SwiGLU feed-forward, a final RMSNorm and
  the output matrix (the embedding when the file ties them). Float64, no
  cache, one pass over the whole sequence.
- `compare`: the same tokens through llama.cpp (llama-cpp-python with
  logits_all), then per position the largest absolute difference relative to
  the spread (standard deviation) of the oracle's logits, and whether both
  pick the same top token where the oracle's top two are not a near tie.

`runtimed verify MODEL_PATH` runs it (syntrop.runtimed.oracle.cli). numpy
and gguf are imported when it runs, never when runtimed starts.
"""
