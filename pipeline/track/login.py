"""MLflow logins: taken out of a tracking URI (any character in a password) and hidden wherever text shows one;
where the credentials of any other URI belong instead of in it (the parsing itself is common/userinfo.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.userinfo import SCHEME, parts, redact, redact_uri, redacted, strings, userinfo_end

__all__ = ["Login", "from_variables", "split_login", "redact", "redact_uri", "redacted", "redact_yaml",
           "credential_home"]

# MLflow's login variables, read by every MLflow client (a login is a user and password, or a token).
USERNAME, PASSWORD, TOKEN = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"
LOGIN_VARIABLES = (USERNAME, PASSWORD, TOKEN)
# Where a URI's credentials belong instead, by scheme: (what to say, the variables that carry them).
_HOMES = (
    (("http", "https"), f"the MLflow login in {USERNAME} and {PASSWORD} (or {TOKEN})", (USERNAME, PASSWORD)),
    (("postgres",), "PGPASSWORD or ~/.pgpass (user@host stays in the URI)", ("PGPASSWORD",)),
    (("mysql", "mariadb", "mssql", "oracle"), "the database's own password variable or file (user@host stays in "
                                              "the URI)", ()),
    (("s3",), "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or the nodes' own role",
     ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
    (("gs", "gcs"), "GOOGLE_APPLICATION_CREDENTIALS (a key file) or the nodes' own service account", ()),
)


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


def _login_of(userinfo: str) -> Login | None:
    """user:password (the user ends at the first colon) or a token; None when it cannot be a login."""
    found = parts(userinfo)
    if found is None:
        return None
    user, password, colon = found
    return Login(user, password) if colon else Login(token=user)


def split_login(uri: str) -> tuple[str, Login | None]:
    """(the URI without its login, the login): http(s)://user:password@host or http(s)://token@host."""
    scheme = SCHEME.match(uri)
    if not scheme or scheme[0].lower() not in ("http://", "https://"):
        return uri, None
    end = userinfo_end(uri, scheme.end())
    login = _login_of(uri[scheme.end(): end]) if end >= 0 else None
    return (uri[: scheme.end()] + uri[end + 1:], login) if login else (uri, None)


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
    for value in sorted({v for _, v in strings(data) if redact_uri(v) != v}, key=len, reverse=True):
        if value not in text:
            return yaml.safe_dump(redacted(data), sort_keys=False)
        text = text.replace(value, redact_uri(value))
    return redact(text)


def credential_home(uri: str) -> tuple[str, tuple[str, ...]]:
    """(where the credentials of a URI of this scheme belong instead of in it, the variables that carry them)."""
    scheme = uri.partition("://")[0].lower()
    for prefixes, text, names in _HOMES:
        if scheme.startswith(prefixes):
            return text, names
    return f"the variables or files {scheme}:// storage reads its credentials from", ()
