"""A model's chat template, rendered under limits: a template is code from a model file.

A GGUF's ``tokenizer.chat_template`` or a model folder's template is a Jinja program that
the model's maker wrote. Transformers renders it in Jinja's sandbox, which stops it from
reaching Python but not from looping for minutes (two nested ``range(100000)``) or
building a string of gigabytes (``'x' * 1500000000``). ragscope therefore never renders
a template in its own process:

- The template is rendered once per *shape* of conversation (the roles in order, and
  whether the assistant header is added), with a stand-in mark for each message's content,
  in a child process under :data:`RENDER_SECONDS` of time, :data:`RENDER_MEMORY` bytes of
  address space and :data:`RENDER_CHARS` characters of output; past any of them the
  child is stopped and the template refused with a :class:`ModelError` naming the limit.
- The rendered frame is kept (per template, shape and special tokens), and each
  conversation of that shape is the frame with the contents put in place of the
  stand-in marks. A template must therefore place every message's content verbatim, once
  and in order (what every chat model's template does); one that rewrites or repeats a
  content is refused, as :func:`core.engine.layout.chat_frame` always required for the
  user message.

So a model's template costs one bounded child process per conversation shape (about a
second, mostly importing Jinja and transformers' renderer), and no content a user or a
client sends is ever interpreted by it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from core.base.errors import ModelError

RENDER_SECONDS = 20.0
"""Longest a template may take to render one conversation shape (a real one takes
milliseconds; the child's start, importing the renderer, is not counted against it)."""
RENDER_MEMORY = 2 * 1024**3
"""Address space the rendering child may use (bytes)."""
RENDER_CHARS = 1_000_000
"""Longest rendered frame accepted (characters)."""
STARTUP_SECONDS = 60.0
"""Allowance for the child's own start (Python and the renderer's imports) on a busy
machine, beside :data:`RENDER_SECONDS`, which the child enforces on the template."""
MAX_MESSAGES = 64
"""Most messages of one conversation rendered (a longer one is refused)."""
_CACHED = 256
_MARK = "\ue000ragscope-content-{}\ue001"
"""A message's content while the template renders (private-use characters: no real
content or template holds them)."""

_frames: OrderedDict[tuple[str, ...], str] = OrderedDict()
_lock = threading.Lock()


def template_of(tokenizer: object) -> str | None:
    """The tokenizer's chat template (a string), or ``None`` when it has none."""
    t = getattr(tokenizer, "chat_template", None)
    return t if isinstance(t, str) and t.strip() else None


def content_mark(i: int) -> str:
    """What stands for message ``i``'s content in a rendered frame."""
    return _MARK.format(i)


def special_tokens(tokenizer: object) -> dict[str, str]:
    """The tokenizer's special tokens as the template sees them (``bos_token``, ...)."""
    m = getattr(tokenizer, "special_tokens_map", None) or {}
    return {str(k): str(v) for k, v in m.items() if isinstance(v, str)}


def render_chat(
    tokenizer: object,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool = True,
    source: str | None = None,
) -> str:
    """``messages`` (``{"role", "content"}``) through the tokenizer's chat template,
    rendered under limits (see the module docstring).

    Args:
        tokenizer: A tokenizer with a ``chat_template`` (see :func:`template_of`).
        messages: The conversation.
        add_generation_prompt: Whether the assistant's header ends the text.
        source: The model file or name, for the errors.

    Raises:
        ModelError: No template, a conversation over :data:`MAX_MESSAGES`, a template
            over a limit, failing, or not placing every content verbatim once.
    """
    template = template_of(tokenizer)
    if template is None:
        raise _refused(source, "the tokenizer has no chat template")
    if len(messages) > MAX_MESSAGES:
        raise _refused(
            source,
            f"a conversation of {len(messages)} messages is over the {MAX_MESSAGES} rendered",
        )
    roles = tuple(str(m["role"]) for m in messages)
    special = special_tokens(tokenizer)
    frame = chat_frame_text(template, roles, special, add_generation_prompt, source=source)
    out, at = [], 0
    for i, m in enumerate(messages):
        mark = _MARK.format(i)
        k = frame.index(mark, at)
        out += [frame[at:k], str(m["content"])]
        at = k + len(mark)
    out.append(frame[at:])
    return "".join(out)


def chat_frame_text(
    template: str,
    roles: tuple[str, ...],
    special: Mapping[str, str],
    add_generation_prompt: bool,
    *,
    source: str | None = None,
) -> str:
    """The template rendered for a conversation of ``roles`` with a stand-in mark for each
    content (cached; rendered in a bounded child the first time).

    Raises:
        ModelError: Over a limit, failing, or not placing each stand-in mark once in order.
    """
    digest = hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()
    key = (digest, str(add_generation_prompt), *sorted(f"{k}={v}" for k, v in special.items()))
    key += ("|", *roles)
    with _lock:
        if key in _frames:
            _frames.move_to_end(key)
            return _frames[key]
    messages = [{"role": r, "content": _MARK.format(i)} for i, r in enumerate(roles)]
    frame = _render_bounded(template, messages, dict(special), add_generation_prompt, source)
    at = 0
    for i in range(len(roles)):
        mark = _MARK.format(i)
        if frame.count(mark) != 1 or frame.find(mark) < at:
            raise _refused(
                source,
                "the chat template does not place each message's content verbatim, once and "
                "in order; ragscope lays out prompts only with templates that do",
            )
        at = frame.find(mark)
    with _lock:
        _frames[key] = frame
        while len(_frames) > _CACHED:
            _frames.popitem(last=False)
    return frame


def _render_bounded(
    template: str,
    messages: list[dict[str, str]],
    special: dict[str, str],
    add_generation_prompt: bool,
    source: str | None,
) -> str:
    """The template rendered in a child process (:mod:`core.engine.template_child`) under
    the limits (see the module docstring); the child reads its job as JSON on stdin and
    writes the result as JSON on stdout, so nothing is pickled either way."""
    job = {
        "template": template,
        "messages": messages,
        "special": special,
        "add_generation_prompt": add_generation_prompt,
        "seconds": RENDER_SECONDS,
        "memory": RENDER_MEMORY,
        "chars": RENDER_CHARS,
    }
    try:
        done = subprocess.run(  # noqa: S603 - our own module, argv fixed, input as data
            [sys.executable, "-m", "core.engine.template_child"],
            input=json.dumps(job).encode("utf-8", "surrogatepass"),
            capture_output=True,
            timeout=RENDER_SECONDS + STARTUP_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise _refused(
            source,
            f"the chat template did not render within {RENDER_SECONDS:g} s; a template is "
            "code from the model file, and ragscope bounds it",
        ) from None
    try:
        reply = json.loads(done.stdout.decode("utf-8", "surrogatepass") or "{}")
    except (ValueError, UnicodeDecodeError):
        reply = {}
    if isinstance(reply, dict) and isinstance(reply.get("ok"), str):
        return reply["ok"]
    why = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(why, str):
        why = (
            f"its renderer stopped (exit {done.returncode}; over the memory limit of "
            f"{RENDER_MEMORY // 1024**2} MiB?)"
        )
    raise _refused(source, f"the chat template was refused: {why}")


def _refused(source: str | None, message: str) -> ModelError:
    """A refusal naming the model file (or name) it is about."""
    return ModelError(f"{source}: {message}" if source else message)
