"""Credentials inside URIs (scheme://user:secret@host/...): found, taken out, or hidden wherever text shows one.

One reading for every scheme: a password may hold any character (the userinfo runs to the last @
that a host follows). A user name is shown beside a hidden password only where it is a login name
(MLflow servers, SQL databases); elsewhere (s3://KEY_ID:SECRET@bucket) the whole userinfo is hidden.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# A host after the userinfo's last @: a name or an IPv6 literal, an optional port, then the path or the end.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(?::\d*)?(?=[/?#]|$)")
# Characters a userinfo may hold unencoded (RFC 3986); a password with any other is taken as typed.
_ENCODED_USERINFO = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*")
# In free text: scheme://userinfo@, the userinfo running to the last @ before whitespace or a quote.
_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s\"'<>\\]*)@")
# Schemes whose user is a login name (shown beside a hidden password): MLflow servers, SQLAlchemy's databases.
_NAMED_USERS = re.compile(r"(?:https?|postgres(?:ql)?|mysql|mariadb|mssql|oracle)(?:\+[\w.-]+)?://", re.I)
_TOKEN_SCHEMES = ("http://", "https://")  # where a bare userinfo is a token (MLflow's), not a user name


def userinfo_end(uri: str, start: int) -> int:
    """Where a URI's userinfo ends: its last @ that a host follows (a password may hold / ? # @ :), or -1."""
    at = uri.rfind("@", start)
    while at >= start and not _HOST.match(uri, at + 1):
        at = uri.rfind("@", start, at)
    return at


def decoded(value: str) -> str:
    """Percent-decoded when the value is validly encoded (`p%40ss`), else as typed (`pa/ss`, `100%`)."""
    return urllib.parse.unquote(value) if _ENCODED_USERINFO.fullmatch(value) else value


def parts(userinfo: str) -> tuple[str, str, bool] | None:
    """(user, password, has a colon) of a userinfo, decoded; None when it cannot be one (a path's @)."""
    user, colon, password = userinfo.partition(":")
    if not user or set(user) & set("/?#"):
        return None
    return decoded(user), decoded(password), bool(colon)


def split(uri: str) -> tuple[str, str, str] | None:
    """(scheme://, userinfo, the rest after its @) of a URI with a userinfo, else None."""
    scheme = SCHEME.match(uri)
    end = userinfo_end(uri, scheme.end()) if scheme else -1
    if end < 0 or parts(uri[scheme.end(): end]) is None:
        return None
    return scheme[0], uri[scheme.end(): end], uri[end + 1:]


def secret_in(uri: str) -> bool:
    """Whether a URI carries a secret: a password (user:password@), or an http(s) token (token@)."""
    found = split(uri)
    if found is None:
        return False
    user, password, colon = parts(found[1])
    return bool(password) or (not colon and found[0].lower() in _TOKEN_SCHEMES)


def without_secret(uri: str) -> str:
    """The URI with its secret taken out, still usable: a login name kept (postgresql://mlflow@db), else no
    userinfo at all (s3://bucket/...: the keys come from the storage's own variables)."""
    if not secret_in(uri):
        return uri
    scheme, userinfo, rest = split(uri)
    keep = _NAMED_USERS.fullmatch(scheme) and ":" in userinfo
    return f"{scheme}{userinfo.partition(':')[0]}@{rest}" if keep else f"{scheme}{rest}"


def _hidden(scheme: str, userinfo: str) -> str | None:
    if parts(userinfo) is None:
        return None
    named = _NAMED_USERS.fullmatch(scheme) and ":" in userinfo
    return f"{scheme}{userinfo.partition(':')[0]}:***@" if named else f"{scheme}***@"


def redact_uri(value: str) -> str:
    """A config value that is one URI with its userinfo hidden, whatever characters its password holds."""
    scheme = SCHEME.match(value)
    if scheme and "\n" not in value:
        end = userinfo_end(value, scheme.end())
        hidden = _hidden(scheme[0], value[scheme.end(): end]) if end >= 0 else None
        if hidden:
            return hidden + value[end + 1:]
    return _IN_TEXT.sub(lambda m: _hidden(m[1], m[2]) or m[0], value)


def redact(text: str) -> str:
    """text with every URI's userinfo hidden (user:***@ for a login, else ***@): for messages, logs and tags.

    In text a password ends at whitespace or a quote; a value that is one URI (redact_uri) has no such limit.
    """
    if not any(c.isspace() for c in text):
        return redact_uri(text)
    return _IN_TEXT.sub(lambda m: _hidden(m[1], m[2]) or m[0], text)


def redacted(tree: Any) -> Any:
    """A config tree (dicts, lists, strings) with redact_uri() applied to every string: what Ray may show or store."""
    if isinstance(tree, dict):
        return {key: redacted(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(redacted(value) for value in tree)
    return redact_uri(tree) if isinstance(tree, str) else tree


def strings(tree: Any, prefix: str = ""):
    """(dotted key, string) for every string of a config tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from strings(value, f"{prefix}{key}.")
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from strings(value, prefix)
    elif isinstance(tree, str):
        yield prefix.rstrip("."), tree
