"""A local OpenAI-compatible chat endpoint backed by a loaded model (``ragscope serve-llm``).

The Feature explanations page and the LLM judge talk to any OpenAI-compatible server.
Offline, the only LLM at hand is the analysing model itself; this serves it, so the
whole explanation pipeline runs for real (explanations by a 135M model are weak, but
they are its own). Routes:

- ``POST /v1/chat/completions``: ``messages`` through the model's chat template,
  greedy (``temperature`` 0, default) or sampled, at most ``max_tokens`` (default 256)
  new tokens; the usual ``choices[0].message.content`` reply with token usage.
- ``GET /v1/models``: the one model, by the name the server was started with, with its
  context as ``max_model_len`` (as vLLM lists it; the explainer reads it to fit prompts).

Bad requests get HTTP 400 with ``{"error": {"message": ...}}``.
"""

from __future__ import annotations

import http.server
import json
import time
from typing import TYPE_CHECKING, Any

from core.errors import DataError

if TYPE_CHECKING:
    from core.model import LoadedModel

DEFAULT_MAX_TOKENS = 256


def _prompt_ids(model: LoadedModel, messages: Any) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise DataError("messages must be a non-empty list of {role, content}")
    clean = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DataError("each message needs a string content")
        if m.get("role") not in ("system", "user", "assistant"):
            raise DataError(f"unknown role {m.get('role')!r}")
        clean.append({"role": m["role"], "content": m["content"]})
    tok = model.tokenizer
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(clean, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n\n".join(f"{m['role']}: {m['content']}" for m in clean) + "\n\nassistant: "
    return list(tok(text, add_special_tokens=False)["input_ids"])


def complete(model: LoadedModel, body: dict[str, Any], name: str) -> dict[str, Any]:
    """One chat completion in the OpenAI response format.

    Raises:
        DataError: Malformed messages, options, or a prompt longer than the context.
    """
    from core.generate import AnswerStream, GenerationConfig

    ids = _prompt_ids(model, body.get("messages"))
    try:
        cfg = GenerationConfig(
            max_new_tokens=int(body.get("max_tokens") or DEFAULT_MAX_TOKENS),
            temperature=float(body.get("temperature") or 0.0),
            seed=int(body["seed"]) if body.get("seed") is not None else 0,
        )
    except (TypeError, ValueError) as e:
        raise DataError(f"bad generation options: {e}") from e
    if len(ids) + cfg.max_new_tokens > model.info.n_ctx:
        raise DataError(
            f"the prompt has {len(ids)} tokens and asks for {cfg.max_new_tokens} more, over the "
            f"served model's context of {model.info.n_ctx} tokens; send a shorter prompt (fewer "
            "or shorter examples) or a smaller max_tokens"
        )
    stream = AnswerStream.from_ids(model, ids, cfg)
    for _ in stream:
        pass
    out = stream.result()
    return {
        "id": f"chatcmpl-ragscope-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": out.text.strip()},
                "finish_reason": "stop" if out.stop == "eos" else "length",
            }
        ],
        "usage": {
            "prompt_tokens": len(ids),
            "completion_tokens": len(out.token_ids),
            "total_tokens": len(ids) + len(out.token_ids),
        },
    }


def make_server(
    model: LoadedModel, host: str = "127.0.0.1", port: int = 8000, *, name: str | None = None
) -> http.server.ThreadingHTTPServer:
    """An HTTP server (not yet serving) answering the routes in the module docstring."""
    served = name or model.info.display_name

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the handler's API)
            if self.path.rstrip("/").endswith("/models"):
                entry = {"id": served, "object": "model", "max_model_len": model.info.n_ctx}
                self._send(200, {"object": "list", "data": [entry]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(body, dict):
                    raise DataError("the request body must be a JSON object")
                self._send(200, complete(model, body, served))
            except (DataError, json.JSONDecodeError) as e:
                self._send(400, {"error": {"message": str(e), "type": "invalid_request_error"}})

        def log_message(self, *args: object) -> None:
            pass

    return http.server.ThreadingHTTPServer((host, port), Handler)
