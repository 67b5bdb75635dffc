"""The page at `/` (`--ui`/`--no-ui`, `--path`), CORS as llama-server b11434 answers it
(`tools/server/server-http.cpp`: the Origin echoed back with credentials allowed by default,
every OPTIONS a preflight answered before the API key) and HTTPS with
`--ssl-key-file`/`--ssl-cert-file`, called with the official openai SDK. The page's behaviour in
a browser is in test_chat_page.py."""
import shutil
import ssl
import subprocess

import openai
import pytest
import requests

from conftest import QWEN3_TEMPLATE, Server, free_port, run_cli

ORIGIN = "http://example.test:3000"


def test_the_built_in_page_is_served_at_the_root(tiny):
    r = tiny.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    assert '<script src="chat.js">' in r.text and 'href="chat.css"' in r.text
    assert r.text == tiny.get("/index.html").text
    js = tiny.get("/chat.js")
    assert js.headers["content-type"].startswith("text/javascript") and "/v1/chat/completions" in js.text
    assert tiny.get("/chat.css").headers["content-type"].startswith("text/css")
    # API routes are untouched, and other paths still get llama-server's 404.
    assert tiny.get("/props").json()["total_slots"] == 4
    assert tiny.get("/nothing.js").json()["error"]["code"] == 404


def test_cors_echoes_the_origin_and_answers_preflights(tiny):
    r = tiny.get("/props", headers={"Origin": ORIGIN})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert r.headers["Access-Control-Allow-Credentials"] == "true"
    pre = requests.options(tiny.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    })
    assert pre.status_code == 200 and pre.content == b""
    assert pre.headers["Access-Control-Allow-Origin"] == ORIGIN
    methods = {m.strip() for m in pre.headers["Access-Control-Allow-Methods"].split(",")}
    assert methods == {"GET", "POST", "DELETE", "OPTIONS"}, methods
    allowed = {h.strip().lower() for h in pre.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed, allowed
    # A streamed answer carries the header too.
    s = requests.post(tiny.url + "/v1/chat/completions", timeout=120, stream=True, headers={"Origin": ORIGIN},
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True})
    assert s.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert b"[DONE]" in s.content


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    d = tmp_path_factory.mktemp("site")
    (d / "index.html").write_text("<p>another page</p>")
    (d / "note.txt").write_text("a file")
    return d


def test_path_key_and_localhost_origins(tiny_path, site):
    s = Server(tiny_path, "-c", "1024", "--api-key", "k1", "--path", str(site),
               "--cors-origins", "localhost", "--no-cors-credentials")
    try:
        # --path serves the folder without a key; the API still wants one.
        assert s.get("/").text == "<p>another page</p>"
        assert s.get("/note.txt").text == "a file"
        assert s.get("/chat.js").json()["error"]["code"] == 404
        assert s.get("/props").status_code == 401
        assert s.get("/props", headers={"Authorization": "Bearer k1"}).status_code == 200
        # A preflight needs no key (browsers send none); only local origins are allowed.
        pre = requests.options(s.url + "/props", timeout=30, headers={
            "Origin": "http://localhost:5173", "Access-Control-Request-Method": "GET"})
        assert pre.status_code == 200
        assert pre.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
        assert "Access-Control-Allow-Credentials" not in pre.headers
        r = s.get("/props", headers={"Origin": ORIGIN, "Authorization": "Bearer k1"})
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
        # The refusal itself is readable by an allowed page.
        r = s.get("/props", headers={"Origin": "http://127.0.0.1:8000"})
        assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8000"
    finally:
        s.stop()


def test_no_ui_and_any_origin_without_credentials(tiny_path):
    s = Server(tiny_path, "-c", "1024", "--no-webui", "--no-cors-credentials")
    try:
        e = s.get("/").json()["error"]
        assert e["code"] == 404 and e["type"] == "not_found_error"
        assert s.get("/chat.js").status_code == 404
        assert s.get("/health", headers={"Origin": ORIGIN}).headers["Access-Control-Allow-Origin"] == "*"
    finally:
        s.stop()


def test_bad_page_and_cors_flags_are_named(tiny_path, tmp_path):
    port = str(free_port())
    rc, out = run_cli("serve", "-m", str(tiny_path), "--port", port, "--path", str(tmp_path / "missing"))
    assert rc != 0 and "--path" in out and "not a folder" in out, out
    rc, out = run_cli("serve", "-m", str(tiny_path), "--port", port, "--cors-methods", "GET, P OST")
    assert rc != 0 and "--cors-methods" in out, out
    rc, out = run_cli("serve", "-m", str(tiny_path), "--port", port, "--api-prefix", "api/")
    assert rc != 0 and "--api-prefix" in out, out
    rc, out = run_cli("serve", "-m", str(tiny_path), "--port", port, "--grammar", "root ::= [a")
    assert rc != 0 and "line 1, column" in out, out


def test_several_host_addresses_each_serve(tiny_path):
    # --host takes a comma-separated list, as llama-server b11434 reads it (common/arg.cpp).
    s = Server(tiny_path, "--host", " 127.0.0.1, ::1 ")
    try:
        for host in ("127.0.0.1", "[::1]"):
            r = requests.post(f"http://{host}:{s.port}/completion", json={"prompt": "x", "n_predict": 1}, timeout=60)
            assert r.status_code == 200 and r.json()["tokens_predicted"] == 1
    finally:
        s.stop()
    port = str(free_port())
    for value, says in ((" , ", "at least one address"), ("127.0.0.1,/tmp/b.sock", "UNIX socket")):
        rc, out = run_cli("serve", "-m", str(tiny_path), "--port", port, "--host", value)
        assert rc != 0 and says in out, out


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and its key (openssl's command line)."""
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test makes its certificate with the openssl command (Debian's openssl)"
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return key, cert


def test_https_with_the_openai_sdk(tiny_path, certificate):
    key, cert = certificate
    s = Server(tiny_path, "-c", "1024", "--chat-template-file", str(QWEN3_TEMPLATE),
               "--ssl-key-file", str(key), "--ssl-cert-file", str(cert), ca=cert)
    try:
        assert "listening on https://" in s.output()
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0,
                               http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(cert))))
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == r.choices[0].message.content
        # The certificate is what the client checks: one that does not trust it is refused.
        untrusting = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIConnectionError):
            untrusting.models.list()
        # Plain HTTP on the TLS port gets no answer, and the server keeps serving.
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{s.port}/health", timeout=10)
        assert s.get("/health").json() == {"status": "ok"}
        assert s.get("/").status_code == 200
    finally:
        s.stop()


def test_bad_tls_files_are_named(tiny_path, certificate, tmp_path):
    key, cert = certificate
    port = str(free_port())
    serve = ["serve", "-m", str(tiny_path), "--port", port]
    rc, out = run_cli(*serve, "--ssl-key-file", str(key))
    assert rc != 0 and "--ssl-key-file needs --ssl-cert-file" in out, out
    rc, out = run_cli(*serve, "--ssl-key-file", str(tmp_path / "none.pem"), "--ssl-cert-file", str(cert))
    assert rc != 0 and "--ssl-key-file" in out and "none.pem" in out, out
    rc, out = run_cli(*serve, "--ssl-key-file", str(key), "--ssl-cert-file", str(key))
    assert rc != 0 and "--ssl-cert-file" in out and "no PEM certificate" in out, out


def test_api_prefix_serves_every_route_and_the_page_under_it(tiny_path):
    """`--api-prefix /api` as llama-server b11434 registers it (server-http.cpp: every route and
    the page at the prefix + its path); the key stays off /health and the page's files."""
    s = Server(tiny_path, "-c", "1024", "--api-prefix", "/api", "--api-key", "k1",
               "--chat-template-file", str(QWEN3_TEMPLATE), prefix="/api")
    try:
        key = {"Authorization": "Bearer k1"}
        assert s.get("/health").status_code == 200
        assert requests.get(s.root + "/health", timeout=30).status_code == 404
        assert requests.get(s.root + "/v1/models", headers=key, timeout=30).status_code == 404
        assert s.get("/props").status_code == 401
        assert s.get("/props", headers=key).json()["total_slots"] == 1
        page = requests.get(s.url, timeout=30)  # /api redirects to /api/, which the page's links need
        assert page.status_code == 200 and page.url == s.url + "/" and '<script src="chat.js">' in page.text
        assert "BASE + path" in s.get("/chat.js").text
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="k1")
        r = client.chat.completions.create(model="any", max_tokens=3, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
        assert r.usage.completion_tokens == 3
    finally:
        s.stop()


def test_post_props_needs_the_flag_and_changes_nothing(tiny, tiny_path):
    r = tiny.post("/props", {})
    assert r.status_code == 501 and "--props" in r.json()["error"]["message"], r.text
    s = Server(tiny_path, "-c", "1024", "--props")
    try:
        assert s.post("/props", {}).json() == {"success": True}
        assert requests.post(s.url + "/props", timeout=30).json() == {"success": True}
        r = s.post("/props", {"n_ctx": 4096})
        assert r.status_code == 400 and '"n_ctx"' in r.json()["error"]["message"], r.text
        assert s.post("/props", [1]).status_code == 400
        assert s.get("/props").json()["default_generation_settings"]["n_ctx"] == 1024
    finally:
        s.stop()
