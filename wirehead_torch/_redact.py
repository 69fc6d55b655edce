"""URI redaction: a store URI shown anywhere (logs, status, errors) with
its secrets hidden, and messages that may quote one of them cleaned."""
import contextlib
import re
from urllib.parse import unquote

from ._uri import split

# URI options that carry a secret (compared lower-case), and the words that
# mark an option name as one whatever the driver calls it.
_SECRET_OPTIONS = {
    "password", "authmechanismproperties", "tlscertificatekeyfilepassword",
    "tlscertificatekeyfile", "sslclientcertificatekeypassword", "sslclientcertificatekeyfile",
    "sslpemkeypassword", "sslpemkeyfile", "proxypassword", "proxyusername",
}
_SECRET_WORDS = re.compile(r"pass|secret|token|credential|key", re.I)
_HIDDEN = "***"


def _secret_option(name):
    n = unquote(name).lower()
    return n in _SECRET_OPTIONS or bool(_SECRET_WORDS.search(n))


def _hide_option(name, value):
    if value is None or not _secret_option(name):
        return value
    if unquote(name).lower() == "authmechanismproperties":
        # PROPERTY:value,...: keep the property names, hide every value
        props = []
        for p in unquote(value).split(","):
            pname, colon, _v = p.partition(":")
            props.append(f"{pname}:{_HIDDEN}" if colon else _HIDDEN)
        return ",".join(props)
    return _HIDDEN


def redact(uri):
    """The store URI with its secrets hidden, for logs, status and errors:
    the userinfo (``user:password@``) and the value of every URI option that
    carries a password, token or key (``authMechanismProperties`` keeps its
    property names). Option names are compared case-insensitively. Anything
    that is not a URI is returned as it is."""
    if not isinstance(uri, str):
        return uri
    parsed = split(uri)
    if parsed is None:
        return uri
    scheme, userinfo, hosts, opts = parsed
    out = f"{scheme}://" + (f"{_HIDDEN}@" if userinfo is not None else "") + hosts
    if opts:
        out += "?" + "".join(s + name + ("" if v is None else "=" + _hide_option(name, v))
                             for s, name, v in opts)
    return out


def _secrets(uri):
    """Every secret string in uri, as written and percent-decoded."""
    parsed = split(uri) if isinstance(uri, str) else None
    if parsed is None:
        return []
    _scheme, userinfo, _hosts, opts = parsed
    found = []
    if userinfo is not None:
        user, _c, password = userinfo.partition(":")
        found += [userinfo, user, password]
    for _s, name, value in opts:
        if value is None or not _secret_option(name):
            continue
        found.append(value)
        for p in unquote(value).split(","):
            found += [p, p.partition(":")[2]]
    out = set()
    for s in found:
        out.update((s, unquote(s)))
    # short strings would blank out ordinary words of a message
    return sorted((s for s in out if len(s) >= 3), key=len, reverse=True)


def scrub(text, uri):
    """text with uri shown redacted and every secret of uri hidden (for
    messages that may quote the URI or one of its values)."""
    if not isinstance(text, str) or not isinstance(uri, str):
        return text
    text = text.replace(uri, redact(uri))
    for s in _secrets(uri):
        text = text.replace(s, _HIDDEN)
    return text


@contextlib.contextmanager
def secrets_hidden(uri):
    """Re-raises an exception whose message holds a secret of uri as the
    same exception class with the secret hidden (and no chained original)."""
    try:
        yield
    except Exception as e:
        msg = str(e)
        clean = scrub(msg, uri)
        if clean == msg:
            raise
        try:
            new = type(e)(clean)
        except Exception:
            new = None
        if new is None:
            raise RuntimeError(clean) from None
        raise new from None
