"""Work that runs beside the app.

Work that runs beside the app: background training jobs, the benchmarks, Ray
extraction and a guarded local OpenAI-compatible endpoint."""
