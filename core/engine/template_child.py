"""The child process that renders a chat template under limits
(:func:`core.engine.chat_template._render_bounded` starts it as
``python -m core.engine.template_child``).

It reads one job as JSON on stdin (the template, the messages, the special tokens, the
limits), caps its own address space, arms a timer, renders with transformers' renderer
(Jinja's immutable sandbox) and writes ``{"ok": text}`` or ``{"error": why}`` as JSON on
stdout. Nothing from the template reaches the parent but that one string.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from core.base.errors import brief


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


def render(job: dict[str, Any]) -> dict[str, str]:
    """Render ``job`` under its limits; the reply to write."""
    seconds, memory, chars = float(job["seconds"]), int(job["memory"]), int(job["chars"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        kwargs: dict[str, Any] = {str(k): str(v) for k, v in job["special"].items()}
        result: Any = render_jinja_template(
            conversations=[list(job["messages"])],
            chat_template=str(job["template"]),
            add_generation_prompt=bool(job["add_generation_prompt"]),
            **kwargs,
        )
        text = str(result[0][0])
    except _Timeout:
        return {"error": f"it ran over {seconds:g} s"}
    except MemoryError:
        return {"error": f"it needs over {memory // 1024**2} MiB of memory"}
    except Exception as e:  # noqa: BLE001 - anything the template raises is reported
        return {"error": brief(e)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if len(text) > chars:
        return {"error": f"it renders {len(text):,} characters, over {chars:,}"}
    return {"ok": text}


def main() -> None:  # pragma: no cover - runs in the child process
    job = json.loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
    reply = render(job)
    sys.stdout.buffer.write(json.dumps(reply).encode("utf-8", "surrogatepass"))


if __name__ == "__main__":  # pragma: no cover
    main()
