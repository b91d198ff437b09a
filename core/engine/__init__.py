"""The model: weights, loading, layout, the hooked pass, generation.

The engine: model weights found and checked, the model loaded, a prompt laid out into
segments, one hooked forward pass (the only place hooks are set) and generation."""
