"""A stand-in for llama-harness-engine in tests: the request protocol of harness/stages/outputs/engine/engine.cpp
with a four-token vocabulary. Every generation is "hello" then end of generation; teacher-forced
rows are uniform, so every KL divergence is 0. A ``bench`` request takes ``FAKE_BENCH_MS``
milliseconds per token (default 1) times ``FAKE_BENCH_SCALE`` (default 1), with a small
deterministic jitter, and reports that time. A ``probe`` request writes the record of one weight of
4096 bytes in ``CPU_Mapped`` memory backed by the model file (``CPU``, anonymous, with
``--load-mode none`` or under ``FAKE_LOSE_MMAP``; ``FAKE_PROBE_ANON`` keeps the name ``CPU_Mapped`` over
anonymous memory, as a load that copies the mapping would; ``FAKE_PROBE_COW`` keeps the map's name and
makes every page a private copy, as a load that writes a private mapping would), as the fake load log reports it.
A ``reload`` request loads and frees a small host buffer (see :func:`reload`).
``FAKE_RSS_MB`` megabytes (default 0) are held resident from the model load on, as a model's weights
would be."""

import json
import os
import struct
import sys
import time

N_VOCAB = 4
#: (id, piece) of the one token every generation gives before end of generation; a fake tree may change it
TOKEN = (2, b"hello")


def reply(obj: dict) -> None:
    sys.stdout.write("@@engine " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def note(what: str) -> None:
    """Append ``what`` to the file FAKE_REQUEST_LOG names, one line per event of any fake engine process."""
    path = os.environ.get("FAKE_REQUEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {what}\n")


#: What the fake says of its model when it loads, as the engine passes on llama_model_desc.
MODEL_DESC = "gemma3 270M F16"


def ready() -> None:
    """The reply the engine gives once its model is loaded."""
    note("ready")
    reply({"ok": True, "ready": True, "n_vocab": N_VOCAB, "n_ctx": 1024, "model_desc": MODEL_DESC, "n_threads": 2,
           "load_ms": 1.0})


def main() -> None:
    time.sleep(float(os.environ.get("FAKE_LOAD_S", "0")))  # the model load
    # written, not only allocated, so that every page is resident
    main.weights = b"\x01" * int(float(os.environ.get("FAKE_RSS_MB", "0")) * 2**20)
    ready()
    for line in sys.stdin:
        if not handle(line.rstrip("\r\n").split("\t")):
            return


def handle(parts: list) -> bool:
    """Answer one request (its tab-separated fields); False for ``quit``."""
    note(parts[0])
    if parts[0] == "quit":
        return False
    if parts[0] == "generate":
        tokens = [{"id": TOKEN[0], "piece": TOKEN[1].hex(), "eog": False, "top": [[TOKEN[0], 5.0], [5 - TOKEN[0], 1.0]],
                   "lse": 5.1},
                  {"id": 1, "piece": "", "eog": True, "top": [[1, 6.0], [2, 2.0]], "lse": 6.1}]
        reply({"ok": True, "prompt_tokens": 3, "tokens": tokens, "eog": True, "prompt_ms": 1.0, "gen_ms": 1.0})
    elif parts[0] == "score":
        n = len([t for t in parts[2].split(",") if t])
        if parts[3] != "-":
            with open(bytes.fromhex(parts[3]).decode(), "wb") as f:
                f.write(struct.pack("<2i", n, N_VOCAB) + struct.pack(f"<{n * N_VOCAB}f", *[-1.386] * (n * N_VOCAB)))
        out = {"ok": True, "positions": n, "score_ms": 1.0}
        if parts[4] != "-":
            out.update(kl=[0.0] * n, top1=[1] * n)
        reply(out)
    elif parts[0] == "probe":
        mapped = "none" not in sys.argv[1:] and not os.environ.get("FAKE_LOSE_MMAP")
        backed = 4096 if mapped and not os.environ.get("FAKE_PROBE_ANON") else 0
        # FAKE_PROBE_COW: the map names the file, the pages are private copies (a written private mapping)
        private = backed if os.environ.get("FAKE_PROBE_COW") else 0
        counts = {"page_locked": None, "file_backed": backed, "file_pages": backed - private, "private_pages": private}
        record = {"weights": [{"name": "token_embd.weight", "layer": -1, "type": "f32", "bytes": 4096, "buffer": 0,
                               **counts}],
                  "buffers": [{"name": "CPU_Mapped" if mapped else "CPU", "buffer_type": "CPU_Mapped" if mapped else "CPU",
                               "bytes": 4096, "host": True, **counts}],
                  "driver": None, "probe_ms": 1.0,
                  "file_mappings": [{"bytes": 8192, "rss": 8192, "shared_clean": 0, "private_clean": 8192 - private,
                                     "private_dirty": private, "anonymous": private}] if backed else []}
        with open(bytes.fromhex(parts[1]).decode(), "w", encoding="utf-8") as f:
            json.dump(record, f)
        reply({"ok": True, "weights": 1, "buffers": 1, "probe_ms": 1.0})
    elif parts[0] == "reload":
        reply(reload(int(parts[1]), bytes.fromhex(parts[2]).decode()))
    elif parts[0] == "bench":
        handle.benches = getattr(handle, "benches", 0) + 1
        per_token = float(os.environ.get("FAKE_BENCH_MS", "1")) * float(os.environ.get("FAKE_BENCH_SCALE", "1"))
        per_token *= 1 + 0.01 * (handle.benches % 5)
        n_prompt, n_gen = int(parts[1]), int(parts[2])
        time.sleep(per_token * (n_prompt + n_gen) / 1000 / 10)
        reply({"ok": True, "n_prompt": n_prompt, "n_gen": n_gen, "pp_ms": per_token * n_prompt / 10,
               "pp_queued_ms": per_token * n_prompt / 20, "tg_ms": per_token * n_gen, "tg_token_ms": [per_token] * n_gen})
    else:
        reply({"ok": False, "error": "bad request"})
    return True

def memory() -> dict:
    """This process's resident, locked and pinned bytes from /proc/self/status (None where it has none)."""
    out = {"rss": None, "locked": None, "pinned": None}
    names = {"VmRSS:": "rss", "VmLck:": "locked", "VmPin:": "pinned"}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, *rest = line.split()
                if key in names:
                    out[names[key]] = int(rest[0]) * 1024
    except OSError:
        pass
    return out


def reload(count: int, path: str, buffer_type: str = "CUDA_Host", driver: str | None = None) -> dict:
    """The ``reload`` request: ``count`` loads of a 4 MiB host buffer of ``buffer_type``, each written (resident)
    and freed, with the process's real memory readings.  ``driver`` (or ``cuda`` under ``FAKE_RELOAD_DRIVER``)
    reports driver counts as a build with that runtime would (the whole buffer page-locked); ``FAKE_RELOAD_LEAK``
    keeps 2 MiB of each freed buffer page-locked, so that every later load is granted 2 MiB less;
    ``FAKE_RELOAD_KEEP`` keeps each load's buffer resident after its free."""
    size = 4 * 2**20
    driver = driver or ("cuda" if os.environ.get("FAKE_RELOAD_DRIVER") else None)
    leak = 2 * 2**20 if os.environ.get("FAKE_RELOAD_LEAK") else 0
    kept = []
    record = {"count": count, "baseline": memory(), "cycles": [], "driver": driver}
    for k in range(count):
        buffer = bytearray(b"\x01" * size)
        loaded = memory()
        if os.environ.get("FAKE_RELOAD_KEEP"):
            kept.append(buffer)
        del buffer
        granted = size - leak * k
        record["cycles"].append({"load_ms": 1.0, "loaded": loaded, "freed": memory(), "buffers": [
            {"buffer_type": buffer_type, "bytes": size, "host": True, "page_locked": granted if driver else None,
             "page_locked_after_free": leak if driver else None}]})
    record["reload_ms"] = 1.0 * count
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)
    reload.kept = kept
    return {"ok": True, "loads": count, "reload_ms": record["reload_ms"]}


if __name__ == "__main__":
    main()
