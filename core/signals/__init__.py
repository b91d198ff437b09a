"""Signals read off one traced pass, numbers only.

Signals read off one traced pass: the logit lens, embeddings, chunks, parts of speech,
ECS, SPAD's seven-source attribution, copying heads, the SAE and label-persistence
smoothing. Numbers only; no detector, no fitting."""
