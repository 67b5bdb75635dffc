"""A stand-in for the Hugging Face Hub's endpoints that llama-server b11434 reads for `-hf`
(common/hf-cache.cpp, common/download.cpp): `GET api/models/{repo}/refs`, `GET
api/models/{repo}/tree/{commit}?recursive=true`, and `HEAD`/`GET {repo}/resolve/{commit}/{path}`,
which redirects to the file's bytes as the Hub redirects to its CDN, with ETag, Content-Length and
byte ranges. Every request is logged (method, path, Authorization, Range) so that a test, or the
golden script that runs llama-server against it, can say what a client asked for.

Used by `tests/server/test_hf_download.py` and `tests/oracle/make_hf_golden.py`."""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_oid(data):
    """The git object id of a file's bytes (what the Hub lists as `oid` for a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    """One mock Hub on 127.0.0.1 serving `repos`: {repo id: {path: bytes}}. Files whose name ends
    in `.gguf` are listed as LFS files (their `lfs.oid` is the sha256), others as plain git files.
    `commit` is every repo's main commit; `ranges` says whether byte ranges are served; `drop_after`
    (bytes) cuts the first GET of each file short there, as a connection lost mid-download."""

    def __init__(self, repos, commit="0123456789abcdef0123456789abcdef01234567", ranges=True, drop_after=None):
        self.repos, self.commit, self.ranges, self.drop_after = repos, commit, ranges, drop_after
        self.log = []
        self.dropped = set()
        self.blobs = {}
        for files in repos.values():
            for data in files.values():
                self.blobs[hashlib.sha256(data).hexdigest()] = data
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.answer(self, head=True)

            def do_GET(self):
                hub.answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def requests(self):
        """The logged requests as (method, path) pairs, in order."""
        return [(m, p) for m, p, _, _ in self.log]

    def tree(self, repo):
        items = [{"type": "directory", "oid": "f" * 40, "size": 0, "path": "sub"}]
        for path, data in sorted(self.repos[repo].items()):
            item = {"type": "file", "oid": git_blob_oid(data), "size": len(data), "path": path}
            if path.endswith(".gguf"):
                item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            items.append(item)
        return items

    def answer(self, h, head):
        # One request a connection: each answer says `Connection: close` (a client reusing a
        # kept-alive connection raced the mock's handler threads).
        h.close_connection = True
        url = urlsplit(h.path)
        path = unquote(url.path)
        self.log.append((h.command, h.path, h.headers.get("Authorization"), h.headers.get("Range")))
        for repo, files in self.repos.items():
            if path == f"/api/models/{repo}/refs":
                return self.send_json(h, {"branches": [{"name": "main", "ref": "refs/heads/main",
                                                        "targetCommit": self.commit}],
                                          "converts": [], "tags": []})
            if path == f"/api/models/{repo}/tree/{self.commit}":
                return self.send_json(h, self.tree(repo))
            for prefix in (f"/{repo}/resolve/{self.commit}/", f"/{repo}/resolve/main/"):
                if not (path.startswith(prefix) and path[len(prefix):] in files):
                    continue
                oid = hashlib.sha256(files[path[len(prefix):]]).hexdigest()
                h.send_response(302)
                h.send_header("Location", f"/cdn/{oid}")
                h.send_header("Content-Length", "0")
                h.send_header("Connection", "close")
                h.end_headers()
                return None
        if path.startswith("/cdn/") and path[5:] in self.blobs:
            return self.send_blob(h, path[5:], head)
        return self.send_json(h, {"error": f"Repository or file not found: {path}"}, 404)

    def send_json(self, h, value, status=200):
        body = json.dumps(value).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)

    def send_blob(self, h, oid, head):
        data = self.blobs[oid]
        start = 0
        ask = h.headers.get("Range")
        if self.ranges and ask and ask.startswith("bytes=") and ask.endswith("-"):
            start = int(ask[6:-1])
        h.send_response(206 if start else 200)
        h.send_header("ETag", f'"{oid}"')
        h.send_header("Accept-Ranges", "bytes" if self.ranges else "none")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Connection", "close")
        h.end_headers()
        if head:
            return
        body = data[start:]
        if self.drop_after is not None and h.command == "GET" and oid not in self.dropped:
            self.dropped.add(oid)
            h.wfile.write(body[:self.drop_after])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.wfile.write(body)


# The repository both llama-server (tests/oracle/make_hf_golden.py) and bloomery
# (tests/server/test_hf_download.py) fetch from, and the scenarios they are run through.
REPO = "bloomery-test/tiny-GGUF"


def repo_files(models):
    """The repository's files, given `models`: {"F16"|"Q8_0"|"Q4_K_M": bytes of a loadable GGUF}.
    The projector and the split parts are not loadable (only their fetching is compared)."""
    files = {"README.md": b"# a tiny test repository\n", "mmproj-tiny-F16.gguf": b"GGUF mmproj stand-in"}
    for quant, data in models.items():
        files[f"tiny-{quant}.gguf"] = data
    for i in (1, 2):
        files[f"split/tiny-Q2_K-0000{i}-of-00002.gguf"] = b"GGUF split part %d" % i
    return files


TOKEN = "hf_" + "abcdefghij" * 4

# (name, the cache it uses, the flags after the server's own, what the hub does:
# "up" | "down" (nothing listens) | "drop" (each file's first GET cut short after 1,000 bytes)).
# Scenarios of one cache run in this order, each on what the ones before it left.
SCENARIOS = [
    ("default", "a", ["-hf", REPO, "-hft", TOKEN], "up"),
    ("tag", "a", ["-hf", REPO + ":q8_0"], "up"),
    ("file", "a", ["-hf", REPO, "-hff", "tiny-F16.gguf"], "up"),
    ("again", "a", ["-hf", REPO], "up"),
    ("offline", "a", ["-hf", REPO + ":Q8_0", "--offline"], "down"),
    ("hub-down", "a", ["-hf", REPO + ":Q8_0"], "down"),
    ("split", "b", ["-hf", REPO + ":Q2_K"], "up"),
    ("no-such-quant", "b", ["-hf", REPO + ":IQ1_S"], "up"),
    ("offline-not-cached", "b", ["-hf", REPO + ":F16", "--offline"], "down"),
    ("resume", "c", ["-hf", REPO], "drop"),
    # -mu: a plain URL ({hub} is the mock's address) fetched to -m's path ({cache}: the
    # scenario's cache folder) with its ETag beside it; the second start asks only for the ETag.
    # (Without -m, b11434 starts its model router instead of loading the file: not compared.)
    ("url", "d", ["-m", "{cache}/models/tiny.gguf", "-mu", "{hub}/" + REPO + "/resolve/main/tiny-Q8_0.gguf"],
     "up"),
    ("url-again", "d", ["-m", "{cache}/models/tiny.gguf", "-mu", "{hub}/" + REPO + "/resolve/main/tiny-Q8_0.gguf"],
     "up"),
]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot_tree(root, names):
    """The cache folder as sorted (path, what) pairs: "dir", "-> target" for a link, or the
    repository file whose bytes a file holds (`names`: sha256 -> repository path), else its text."""
    import os
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if os.path.islink(p):
                out.append((os.path.relpath(p, root), "-> " + os.readlink(p)))
            else:
                out.append((os.path.relpath(p, root), "dir"))
        for f in filenames:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out.append((rel, "-> " + os.readlink(p)))
                continue
            data = open(p, "rb").read()
            h = hashlib.sha256(data).hexdigest()
            out.append((rel, "bytes of " + names[h] if h in names else "text " + data.decode("utf-8", "replace")))
    return sorted(out)


def run_scenario(command, files, scenario, cache, timeout=120):
    """Runs `command` (a server's argv up to its own flags; `--port` and the scenario's flags are
    added) with its Hub cache in `cache` against a mock hub serving `files` as REPO, and returns
    what happened: the requests the hub got (sorted: parallel downloads come in any order; blob
    paths named by the file they hold), whether the server loaded the model and under which model
    id it lists it, and the cache folder's tree."""
    import os
    import subprocess
    import time
    import urllib.request
    name, _, flags, mode = scenario
    hub = Hub({REPO: files}, drop_after=1000 if mode == "drop" else None)
    names = {hashlib.sha256(d).hexdigest(): p for p, d in files.items()}
    endpoint = hub.url
    if mode == "down":
        hub.stop()
        endpoint = f"http://127.0.0.1:{free_port()}"
    env = dict(os.environ, HF_HOME=str(cache), HF_ENDPOINT=endpoint, XDG_CACHE_HOME=os.path.join(cache, "xdg"))
    for k in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "MODEL_ENDPOINT", "HF_TOKEN"):
        env.pop(k, None)
    port = free_port()
    flags = [f.replace("{hub}", endpoint).replace("{cache}", str(cache)) for f in flags]
    proc = subprocess.Popen([*command, "--port", str(port), "-c", "256", "--no-mmproj", *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    model_id, log = None, ""
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            try:
                # /health answers 200 once the model is loaded (503 while it loads).
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    pass
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    model_id = json.load(r)["data"][0]["id"]
                    break
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        log = proc.communicate()[1]
        if mode != "down":
            hub.stop()

    def shown(text):
        for h, path in names.items():
            text = text.replace(h, "{sha256 of " + path + "}")
        return text

    requests = sorted([m, shown(p), "auth" if a else "", r or ""] for m, p, a, r in hub.log)
    tree = sorted([shown(p), shown(what)] for p, what in snapshot_tree(str(cache), names))
    if model_id is not None:
        model_id = model_id.replace(str(cache), "{cache}")
    return {"served": model_id is not None, "model_id": model_id, "requests": requests, "tree": tree}, log


def cache_list(command, cache):
    """`-cl` run with its Hub cache in `cache`: its count line and its models (sorted: llama.cpp
    lists them in the order the folder walk finds them)."""
    import os
    import subprocess
    env = dict(os.environ, HF_HOME=str(cache))
    for k in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(k, None)
    p = subprocess.run([*command, "-cl"], env=env, capture_output=True, text=True, timeout=60)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    return {"status": p.returncode, "count_line": lines[0] if lines else None,
            "models": sorted(line.split(". ", 1)[1] for line in lines[1:])}
