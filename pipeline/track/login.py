"""MLflow logins: taken out of a tracking URI (any character in a password) and hidden wherever text shows one."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

# MLflow's login variables, read by every MLflow client (a login is a user and password, or a token).
USERNAME, PASSWORD, TOKEN = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"
LOGIN_VARIABLES = (USERNAME, PASSWORD, TOKEN)
# A host after the userinfo's last @: a name or an IPv6 literal, an optional port, then the path or the end.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(?::\d*)?(?=[/?#]|$)")
# Characters a userinfo may hold unencoded (RFC 3986); a password with any other is taken as typed.
_ENCODED_USERINFO = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*")
# In free text: scheme://userinfo@, the userinfo running to the last @ before whitespace or a quote.
_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s\"'<>\\]*)@")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class Login:
    """A tracking server login: a user and password, or a token. Never shown in a repr."""

    username: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)

    def variables(self) -> dict[str, str | None]:
        """MLflow's login variables for it, the unused ones None (unset: no other login may take precedence)."""
        return {USERNAME: self.username or None, PASSWORD: self.password or None, TOKEN: self.token or None}

    def secrets(self) -> tuple[str, ...]:
        """The values that must never be shown."""
        return tuple(value for value in (self.password, self.token) if value)


def from_variables(values: dict[str, str]) -> Login | None:
    """The login MLflow's variables hold, or None."""
    login = Login(values.get(USERNAME, ""), values.get(PASSWORD, ""), values.get(TOKEN, ""))
    return login if login.username or login.token else None


def _userinfo_end(uri: str, start: int) -> int:
    """Where a URI's userinfo ends: its last @ that a host follows (a password may hold / ? # @ :), or -1."""
    at = uri.rfind("@", start)
    while at >= start and not _HOST.match(uri, at + 1):
        at = uri.rfind("@", start, at)
    return at


def _login_of(userinfo: str) -> Login | None:
    """user:password (the user ends at the first colon) or a token; None when it cannot be a login."""
    user, colon, password = userinfo.partition(":")
    if not colon:
        return Login(token=_decoded(user)) if user and not set(user) & set("/?#") else None
    if not user or set(user) & set("/?#"):
        return None
    return Login(_decoded(user), _decoded(password))


def _decoded(value: str) -> str:
    """Percent-decoded when the value is validly encoded (`p%40ss`), else as typed (`pa/ss`, `100%`)."""
    return urllib.parse.unquote(value) if _ENCODED_USERINFO.fullmatch(value) else value


def split_login(uri: str) -> tuple[str, Login | None]:
    """(the URI without its login, the login): http(s)://user:password@host or http(s)://token@host."""
    scheme = _SCHEME.match(uri)
    if not scheme or scheme[0].lower() not in ("http://", "https://"):
        return uri, None
    end = _userinfo_end(uri, scheme.end())
    login = _login_of(uri[scheme.end(): end]) if end >= 0 else None
    return (uri[: scheme.end()] + uri[end + 1:], login) if login else (uri, None)


def _hidden(scheme: str, userinfo: str) -> str | None:
    login = _login_of(userinfo)
    if login is None:
        return None
    return f"{scheme}{userinfo.partition(':')[0]}:***@" if login.username else f"{scheme}***@"


def redact_uri(value: str) -> str:
    """A config value that is one URI with its login hidden, whatever characters its password holds."""
    scheme = _SCHEME.match(value)
    if scheme and "\n" not in value:
        end = _userinfo_end(value, scheme.end())
        hidden = _hidden(scheme[0], value[scheme.end(): end]) if end >= 0 else None
        if hidden:
            return hidden + value[end + 1:]
    return _IN_TEXT.sub(lambda m: _hidden(m[1], m[2]) or m[0], value)


def redact(text: str) -> str:
    """text with every URI's login hidden (user:***@, or ***@ for a token): for messages, logs and files.

    In text a password ends at whitespace or a quote; a value that is one URI (redact_uri) has no such limit.
    """
    if not any(c.isspace() for c in text):
        return redact_uri(text)
    return _IN_TEXT.sub(lambda m: _hidden(m[1], m[2]) or m[0], text)


def redacted(tree: Any) -> Any:
    """A config tree (dicts, lists, strings) with redact() applied to every string: what Ray may show or store."""
    if isinstance(tree, dict):
        return {key: redacted(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(redacted(value) for value in tree)
    return redact_uri(tree) if isinstance(tree, str) else tree


def redact_yaml(text: str) -> str:
    """A YAML file's text with the login of every URI it holds as a value hidden, comments and layout kept.

    A value written with escapes or quotes that change it is not found as typed: then the file is
    rewritten from its data, redacted (its comments lost rather than a password kept).
    """
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return redact(text)
    for value in sorted({v for v in _strings(data) if redact_uri(v) != v}, key=len, reverse=True):
        if value not in text:
            return yaml.safe_dump(redacted(data), sort_keys=False)
        text = text.replace(value, redact_uri(value))
    return redact(text)


def _strings(tree: Any):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _strings(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _strings(value)
    elif isinstance(tree, str):
        yield tree
