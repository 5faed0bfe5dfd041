"""servescope/contracts/urls.py: which engine URLs are usable, and credentials redacted wherever a URL is shown or stored."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.contracts.urls import parse_http_url, redact


@pytest.mark.parametrize(
    ("url", "port", "host"),
    [("http://127.0.0.1:8009", 8009, "127.0.0.1"), ("http://[::1]:8009/v1", 8009, "::1"), ("https://h", None, "h")],
)
def test_usable_urls(url, port, host):
    parts = parse_http_url(url)
    assert (parts.port, parts.hostname) == (port, host)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:99999", "from 1 to 65535, got '99999'"),
        ("http://127.0.0.1:0", "from 1 to 65535, got 0"),
        ("http://127.0.0.1:abc", "got 'abc'"),
        ("http://::1:8009", "IPv6 address needs brackets"),
        ("ftp://h:1", "expected http://HOST:PORT"),
        ("http://:80", "no host"),
    ],
)
def test_unusable_urls_say_why_in_one_line(url, why):
    with pytest.raises(ValueError, match="^[^\n]*$") as caught:
        parse_http_url(url)
    assert why in str(caught.value)


def test_redaction_keeps_everything_but_the_credentials():
    assert redact("http://u:p@h:1/v1") == "http://***@h:1/v1"
    assert redact("http://u:p@ss@h:1") == "http://***@h:1"  # an unescaped @ in the password
    assert redact("http://h:1/v1") == "http://h:1/v1"
    assert redact("--engine vllm=http://u:p@h:1 --grafana-url https://a:b@g/ x") == (
        "--engine vllm=http://***@h:1 --grafana-url https://***@g/ x"
    )


SECRET = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
# Pasted unquoted, a secret still cannot hold what ends a URL's authority (/ ? #) or a word of text (spaces).
RAW_SECRET = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc"), exclude_characters="/?#\\"),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(quoted=st.tuples(SECRET, SECRET), raw=st.tuples(RAW_SECRET, RAW_SECRET), pasted_raw=st.booleans())
def test_no_password_survives_redaction(quoted, raw, pasted_raw):
    # Quoted as a URL should be, or pasted raw (an "@" or ":" in it): either way nothing of it is left.
    user, password = raw if pasted_raw else quoted
    userinfo = f"{user}:{password}" if pasted_raw else f"{quote(user, safe='')}:{quote(password, safe='')}"
    url = f"http://{userinfo}@engine.example:8009/v1"
    for shown in (redact(url), redact(f"--engine vllm={url} next")):
        assert "@engine.example:8009/v1" in shown and "***@" in shown
        assert userinfo not in shown
