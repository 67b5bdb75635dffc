"""Hostile clients and files on the real binary: big bodies, slow and silent connections, a
whole-vocabulary probability request beside a normal one, shutdown signals in the middle of
streams, and model files whose layer count their tensors contradict."""
import json
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest
import requests

from conftest import TALLY, Server, free_port, run_cli


def raw_request(port, head, body=b"", timeout=30):
    """Sends `head` (request line and headers, without the blank line) and `body` on a fresh
    connection and returns (status, JSON body or None); sending stops quietly when the server
    answers and closes first."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        try:
            c.sendall(head.encode() + b"\r\n\r\n")
            for at in range(0, len(body), 1 << 20):
                c.sendall(body[at:at + (1 << 20)])
        except OSError:
            pass
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + length_of(data):
                chunk = c.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    if not data.startswith(b"HTTP/1.1 "):
        return None, None
    status = int(data[9:12])
    payload = data.split(b"\r\n\r\n", 1)[1]
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, None


def length_of(data):
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            return int(line.split(":")[1])
    return 0


def closed_within(sock, seconds):
    """Whether the server closes `sock` within `seconds` (what it sent first is read and
    dropped)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        sock.settimeout(max(0.05, deadline - time.time()))
        try:
            if not sock.recv(1 << 16):
                return True
        except socket.timeout:
            return False
        except OSError:
            return True
    return False


def test_two_big_prompts_leave_health_responsive(tiny_path):
    """Two 20 MB prompts: refused by their size (413) as soon as their headers arrive, never
    tokenized on the threads that answer /health."""
    s = Server(tiny_path, "-c", "4096", "-np", "4")
    try:
        body = json.dumps({"prompt": "hello world " * ((20 << 20) // 12), "n_predict": 1}).encode()
        head = f"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        answers = []

        def big():
            started = time.time()
            answers.append(raw_request(s.port, head, body, timeout=120))
            TALLY.note(s, None, time.time() - started, 60)

        threads = [threading.Thread(target=big) for _ in range(2)]
        for t in threads:
            t.start()
        worst = 0.0
        while any(t.is_alive() for t in threads):
            started = time.time()
            assert s.get("/health").status_code == 200
            worst = max(worst, time.time() - started)
            time.sleep(0.05)
        for t in threads:
            t.join()
        assert worst < 2.0, f"/health took {worst:.1f} s while two big prompts were read"
        for status, e in answers:
            assert status == 413 and e["error"]["code"] == 413, (status, e)
            TALLY.named += 1
    finally:
        s.stop()


def test_whole_vocabulary_probabilities_do_not_stall_others(gemma3_path):
    """n_probs of the whole 262,144-token vocabulary: the scheduler selects in one pass, the
    table is built off the HTTP threads; a normal request beside it and /health keep pace."""
    s = Server(gemma3_path, "-c", "1024", "-np", "2")
    try:
        normal = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0, "cache_prompt": False}
        want = s.post("/completion", normal).json()["content"]
        started = time.time()
        assert s.post("/completion", normal).json()["content"] == want
        alone = time.time() - started
        got = {}

        def everything():
            r = s.post("/completion", {"prompt": "Hello", "n_predict": 1, "n_probs": 10**9, "temperature": 0})
            got["status"] = r.status_code
            got["n"] = len(r.json()["completion_probabilities"][0]["top_logprobs"])

        hostile = threading.Thread(target=everything, daemon=True)
        hostile.start()
        time.sleep(0.3)
        started = time.time()
        r = s.post("/completion", normal)
        beside = time.time() - started
        # A selection over the vocabulary costs the shared pass milliseconds; the insertion sort
        # it replaced held every slot for seconds.
        TALLY.note(s, r, beside, 2 * alone + 1, normal=True)
        assert r.json()["content"] == want
        assert beside < 2 * alone + 1, f"alone {alone:.2f} s, beside the hostile request {beside:.2f} s"
        started = time.time()
        assert s.get("/health").status_code == 200 and time.time() - started < 2
        hostile.join(300)
        TALLY.note(s)
        assert got == {"status": 200, "n": 262144}
    finally:
        s.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_then_cuts_each_stream_with_a_final_frame(tiny_path, sig):
    s = Server(tiny_path, "-c", "16384", "-np", "2", "--shutdown-timeout", "2")
    long_lines, short = [], {}

    def long_stream():
        body = {"prompt": "hi", "n_predict": 6000, "ignore_eos": True, "stream": True}
        try:
            with requests.post(s.url + "/completion", json=body, stream=True, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        long_lines.append(line)
        except requests.RequestException as e:
            long_lines.append(repr(e).encode())

    def short_one():
        r = requests.post(s.url + "/completion", json={"prompt": "hey", "n_predict": 40, "ignore_eos": True,
                                                        "temperature": 0}, timeout=60)
        short["status"], short["n"] = r.status_code, r.json().get("tokens_predicted")

    try:
        t_long = threading.Thread(target=long_stream)
        t_long.start()
        while len(long_lines) < 3:
            time.sleep(0.01)
        t_short = threading.Thread(target=short_one)
        t_short.start()
        time.sleep(0.05)
        sent = time.time()
        s.proc.send_signal(sig)
        t_short.join(30)
        t_long.join(30)
        rc = s.proc.wait(15)
        took = time.time() - sent
        TALLY.note(None)
        TALLY.note(None)
        assert rc == 0 and took < 8, (rc, took)
        # The request that could finish within the drain did.
        assert short == {"status": 200, "n": 40}
        # The long stream: whole frames only, the last an error saying why.
        frames = [json.loads(line[len(b"data: "):]) for line in long_lines]
        assert all("content" in f for f in frames[:-1])
        assert frames[-1]["error"]["code"] == 503, frames[-1]
        assert "shutting down" in frames[-1]["error"]["message"]
        TALLY.named += 1
        log = s.output()
        assert "cut at its deadline" in log and "generated" in log, log[-2000:]
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        s.log.close()


def test_slow_and_silent_clients_are_cut_off(tiny_path):
    s = Server(tiny_path, "-c", "8192", "-np", "2", "--timeout", "2", "--idle-timeout", "1")
    try:
        # Headers that never end: closed after --idle-timeout.
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n")
            assert closed_within(c, 5), "a connection sending half its headers stayed open"
            TALLY.note(s)
        # A kept-alive connection that goes quiet: closed after --idle-timeout.
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.recv(1 << 16).startswith(b"HTTP/1.1 200")
            assert closed_within(c, 5), "an idle kept-alive connection stayed open"
            TALLY.note(s)
        # A body that stops arriving: 408 after --timeout.
        started = time.time()
        status, e = raw_request(s.port, "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100",
                                b'{"prompt": ', timeout=20)
        TALLY.note(s, None, time.time() - started, 10)
        assert status == 408 and e["error"]["code"] == 408 and time.time() - started < 10
        TALLY.named += 1
        # A stream nobody reads: closed once a write has stalled for --timeout, which frees its slot.
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "hi", "n_predict": 3000, "ignore_eos": True, "n_probs": 512,
                           "stream": True}).encode()
        c.sendall(f"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(8)
        assert closed_within(c, 20), "a stream nobody read stayed open"
        c.close()
        TALLY.note(s)
        assert not any(v["is_processing"] for v in s.get("/slots").json())
        assert s.post("/completion", {"prompt": "still here", "n_predict": 2}).status_code == 200
    finally:
        s.stop()


def with_u32(src, key, value, dst):
    """A copy of GGUF `src` with the u32 metadata `key` set to `value`."""
    data = bytearray(src.read_bytes())
    named = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(named) + len(named)
    assert struct.unpack_from("<I", data, at)[0] == 4, f"{key} is a u32"
    struct.pack_into("<I", data, at + 4, value)
    dst.write_bytes(data)


@pytest.mark.parametrize("arch", ["gemma3", "qwen3moe"])
def test_a_layer_count_the_tensors_contradict_is_a_named_error(tmp_path, arch):
    good = tmp_path / f"{arch}.gguf"
    rc, out = run_cli("synth", "--arch", arch, "--preset", "tiny", "--seed", "7", "-o", str(good))
    assert rc == 0, out
    bad = tmp_path / f"{arch}-bad.gguf"
    with_u32(good, f"{arch}.block_count", 2**31 - 1, bad)
    named = f"`{arch}.block_count` is 2147483647, but the file's tensors name"
    rc, out = run_cli("info", "-m", str(bad))
    assert rc == 0 and named in out, out
    rc, out = run_cli("run", "-m", str(bad), "-p", "hi", "-n", "1")
    assert rc == 1 and named in out, out
    rc, out = run_cli("serve", "-m", str(bad), "--port", str(free_port()))
    assert rc == 1 and named in out, out
    for _ in range(3):
        TALLY.note(None)
        TALLY.named += 1
