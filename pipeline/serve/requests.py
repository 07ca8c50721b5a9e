"""The translation service's HTTP surface: what a /translate request may hold, and how a failure is answered.

Every bad request gets its own JSON 4xx naming what was wrong; a sentence the model cannot take is a 422;
anything else is a 500 that names a reference to the replica's log line, never the internal error text.
"""

import json
import logging
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ..text.translator import SourceTooLong

MAX_BEAM_SIZE = 16  # beam search cost grows with the beam; larger beams are for offline `nmt evaluate`
FIELDS = ("texts", "beam_size")


class BadRequest(Exception):
    """A request the service refuses: HTTP status and the message of its JSON error body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def body_limit(max_texts: int, max_chars: int) -> int:
    """The largest /translate body worth parsing: every text at its longest, each character escaped."""
    return max_texts * (max_chars + 8) * 12 + 4096  # \ud83d\ude00: 12 bytes of JSON for one character


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 from its Content-Length, or as it arrives, once it passes limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"request body of {int(declared)} bytes is too large; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no Content-Length: count what arrives
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"request body is too large; at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(body: bytes, max_texts: int, max_chars: int) -> tuple[list[str], int | None]:
    """(texts, beam_size or None) of a /translate body, or BadRequest saying what is wrong with it."""
    if len(body) > body_limit(max_texts, max_chars):
        raise BadRequest(413, f"request body of {len(body)} bytes is too large")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: nesting thousands deep
        reason = err if not isinstance(err, RecursionError) else "nested too deeply"
        raise BadRequest(400, f"request body is not valid JSON: {reason}") from None
    if not isinstance(payload, dict):
        raise BadRequest(400, 'request body must be a JSON object like {"texts": ["..."], "beam_size": 4}')
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r}; known fields: {', '.join(FIELDS)}")
    if "texts" not in payload:
        raise BadRequest(400, '"texts" is required: a list of strings to translate')
    texts = payload["texts"]
    if not isinstance(texts, list):
        raise BadRequest(400, f'"texts" must be a list of strings, got {type(texts).__name__}')
    if not texts:
        raise BadRequest(400, '"texts" is empty: give at least one sentence')
    if len(texts) > max_texts:
        raise BadRequest(413, f'"texts" has {len(texts)} items; at most {max_texts} per request')
    for i, text in enumerate(texts):
        _check_text(i, text, max_chars)
    if "beam_size" not in payload:  # the model's own, stored with it at registration
        return texts, None
    beam_size = payload["beam_size"]
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise BadRequest(400, f'"beam_size" must be an integer from 1 to {MAX_BEAM_SIZE}, got {beam_size!r}')
    return texts, beam_size


def _check_text(i: int, text: Any, max_chars: int) -> None:
    if not isinstance(text, str):
        raise BadRequest(400, f'"texts"[{i}] must be a string, got {type(text).__name__}')
    if len(text) > max_chars:
        raise BadRequest(413, f'"texts"[{i}] has {len(text)} characters; at most {max_chars}')
    try:
        text.encode("utf-8")  # JSON's \ud800 escape decodes to a lone surrogate, which no tokenizer takes
    except UnicodeEncodeError as err:
        raise BadRequest(400, f'"texts"[{i}] is not valid Unicode text: a lone surrogate '
                              f'(\\u{ord(text[err.start]):04x}) at character {err.start}') from None


def first_line(err: Exception) -> str:
    """An error's type and the first line of its message, for one log line."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"


def failure_response(i: int, err: Exception) -> JSONResponse:
    """The answer to a request whose sentence i failed: 422 with the reason when the model cannot take it (longer
    than its positions), else 500 naming a reference to the replica's log line: internal errors stay there."""
    if isinstance(err, SourceTooLong):
        return JSONResponse({"error": f'"texts"[{i}] cannot be translated: {err}'}, status_code=422)
    reference = uuid.uuid4().hex[:12]
    logging.getLogger("ray.serve").error(f"translation failed (reference {reference}): {first_line(err)}")
    return JSONResponse({"error": f'translation of "texts"[{i}] failed; the service logged the cause under reference '
                                  f'{reference}'}, status_code=500)
