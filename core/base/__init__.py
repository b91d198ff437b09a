"""Errors, outside files, paths, the example record, the chat client.

The base every layer stands on: located errors, bounded reading of outside files, paths,
the RAG example record and the OpenAI-compatible chat client. Imports nothing of ragscope."""
