"""/slots/:id?action=save|restore|erase with --slot-save-path."""
from conftest import Server


def test_save_erase_restore_round_trip_into_another_slot(tiny_path, tmp_path):
    s = Server(tiny_path, "-c", "1024", "-np", "2", "--slot-save-path", str(tmp_path))
    try:
        prompt = list(range(20, 80))
        first = s.post("/completion", {"prompt": prompt, "n_predict": 5, "temperature": 0, "id_slot": 0}).json()
        held = len(prompt) + 5 - 1  # the last sampled token is not evaluated
        saved = s.post("/slots/0?action=save", {"filename": "a.bin"}).json()
        assert saved["id_slot"] == 0 and saved["n_saved"] == held and saved["n_written"] > 0
        assert (tmp_path / "a.bin").stat().st_size == saved["n_written"]
        assert s.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": held}
        restored = s.post("/slots/1?action=restore", {"filename": "a.bin"}).json()
        assert restored["n_restored"] == held and restored["n_read"] == saved["n_written"]
        follow = prompt + first["tokens"][:0] + [7, 8, 9]
        warm = s.post("/completion", {"prompt": follow, "n_predict": 6, "temperature": 0, "id_slot": 1}).json()
        cold = s.post("/completion", {"prompt": follow, "n_predict": 6, "temperature": 0, "id_slot": 0, "cache_prompt": False}).json()
        assert warm["timings"]["cache_n"] == len(prompt)
        assert warm["content"] == cold["content"]
    finally:
        s.stop()


def test_restore_refuses_corrupt_files_other_models_and_bad_names(tiny_path, gemma3_path, tmp_path):
    g = Server(gemma3_path, "-c", "512", "--slot-save-path", str(tmp_path))
    try:
        g.post("/completion", {"prompt": "Hello", "n_predict": 2})
        assert g.post("/slots/0?action=save", {"filename": "gemma.bin"}).status_code == 200
    finally:
        g.stop()
    s = Server(tiny_path, "-c", "512", "--slot-save-path", str(tmp_path))
    try:
        r = s.post("/slots/0?action=restore", {"filename": "gemma.bin"})
        assert r.status_code == 400 and "saved from another model" in r.json()["error"]["message"]
        (tmp_path / "junk.bin").write_bytes(b"BLOOMSLT\x01\x00\x00\x00garbage")
        r = s.post("/slots/0?action=restore", {"filename": "junk.bin"})
        assert r.status_code == 400 and "not a valid bloomery slot file" in r.json()["error"]["message"]
        r = s.post("/slots/0?action=restore", {"filename": "missing.bin"})
        assert r.status_code == 400 and "missing.bin" in r.json()["error"]["message"]
        for bad in ["../escape.bin", "", "a/b"]:
            assert s.post("/slots/0?action=save", {"filename": bad}).status_code == 400
        assert s.post("/slots/0?action=save", {}).status_code == 400
        assert s.post("/completion", {"prompt": "still fine", "n_predict": 2}).status_code == 200
    finally:
        s.stop()


def test_restore_refuses_a_flipped_bit_a_link_and_weights_of_the_same_shape(tiny_path, tmp_path):
    from conftest import TALLY, run_cli
    slots = tmp_path / "slots"
    slots.mkdir()
    s = Server(tiny_path, "-c", "1024", "-np", "2", "--slot-save-path", str(slots))

    def ask(server, path, body):
        r = server.post(path, body)
        TALLY.note(server, r)
        return r

    try:
        s.post("/completion", {"prompt": list(range(20, 60)), "n_predict": 3, "temperature": 0, "id_slot": 0})
        assert s.post("/slots/0?action=save", {"filename": "a.bin"}).status_code == 200
        data = bytearray((slots / "a.bin").read_bytes())
        data[len(data) // 2] ^= 0x04  # one bit of the saved state
        (slots / "flipped.bin").write_bytes(data)
        r = ask(s, "/slots/1?action=restore", {"filename": "flipped.bin"})
        assert r.status_code == 400 and "SHA-256" in r.json()["error"]["message"], r.text
        (slots / "link.bin").symlink_to(slots / "a.bin")
        r = ask(s, "/slots/1?action=restore", {"filename": "link.bin"})
        assert r.status_code == 400 and "symbolic link" in r.json()["error"]["message"], r.text
        outside = tmp_path / "outside.txt"
        outside.write_text("keep me")
        (slots / "out.bin").symlink_to(outside)
        r = ask(s, "/slots/0?action=save", {"filename": "out.bin"})
        assert r.status_code == 400 and outside.read_text() == "keep me", r.text
        assert s.post("/slots/1?action=restore", {"filename": "a.bin"}).status_code == 200
    finally:
        s.stop()
    # The same shapes, other weights: a fine-tune's slot file is not this model's.
    other = tmp_path / "seed8.gguf"
    rc, out = run_cli("synth", "--arch", "qwen3moe", "--preset", "tiny", "--seed", "8", "-o", str(other))
    assert rc == 0, out
    o = Server(other, "-c", "512", "--slot-save-path", str(slots))
    try:
        r = ask(o, "/slots/0?action=restore", {"filename": "a.bin"})
        assert r.status_code == 400 and "saved from another model" in r.json()["error"]["message"], r.text
        assert o.post("/completion", {"prompt": "still fine", "n_predict": 2}).status_code == 200
    finally:
        o.stop()


def test_slot_prompt_similarity_chooses_as_llama_server(tiny_path):
    """`-sps` as llama-server b11434's get_available_slot: the free slot whose cache shares more than
    that fraction of the prompt (the most), else the least recently used; 0 always the latter."""
    from conftest import Server
    base, other = list(range(10, 50)), list(range(100, 140))

    def slot_of(s, prompt):
        r = s.post("/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["id_slot"]

    s = Server(tiny_path, "-c", "2048", "-np", "2", "-sps", "0.5")
    try:
        a = slot_of(s, other)
        b = slot_of(s, base)
        assert a != b
        # 80% of base: its slot, though the other is the least recently used.
        assert slot_of(s, base[:32] + [7] * 8) == b
        # 30% of base is not above 0.5: the least recently used slot, a's.
        assert slot_of(s, base[:12] + [9] * 28) == a
    finally:
        s.stop()
    s = Server(tiny_path, "-c", "2048", "-np", "2", "-sps", "0")
    try:
        a = slot_of(s, other)
        b = slot_of(s, base)
        assert slot_of(s, base) == a  # the same prompt again, yet the least recently used slot
    finally:
        s.stop()
