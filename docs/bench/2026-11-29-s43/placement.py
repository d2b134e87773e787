#!/usr/bin/env python3
"""The speed of patch 0017's KV placement against upstream's, on llama-server's default slot layout (4 slots in
one shared KV cache, no -np), plain and with the plugin: the same request stream, 16 clients, JSON extraction and
MT-Bench prose in turn, libllama swapped by LD_LIBRARY_PATH (the server's RUNPATH yields to it), rounds in ABBA
order. Prints aggregate tok/s per round and the ratio pages/upstream per configuration.

usage: placement.py MODEL UPSTREAM_LIB_DIR [ROUNDS] [N_PREDICT] [PER_CLIENT]
"""
import json, os, subprocess, sys, threading, time, urllib.request

ROOT = os.path.dirname(os.path.abspath(__file__)) + "/../../.."
BIN = f"{ROOT}/target/llama.cpp/bin/llama-server"
KOLM = f"{ROOT}/target/release/kolm-rsd"
PLUGIN = f"{ROOT}/target/release/libkolm_rsd.so"
model, upstream = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
n_predict = int(sys.argv[4]) if len(sys.argv) > 4 else 64
per_client = int(sys.argv[5]) if len(sys.argv) > 5 else 4
PORT = 8731


def workload(name):
    out = subprocess.run([KOLM, "workload", name], capture_output=True, text=True, check=True).stdout
    return [json.loads(l)["prompt"] for l in out.splitlines() if l.strip()]


json_p, prose_p = workload("json-extraction"), workload("mt-bench")
mixed = [p for pair in zip(json_p, prose_p) for p in pair]
streams = [[mixed[(c * per_client + i) % len(mixed)] for i in range(per_client)] for c in range(16)]


def post(body):
    r = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=1200).read())


def serve(lib, plugin):
    env = dict(os.environ)
    if lib:
        env["LD_LIBRARY_PATH"] = lib
    args = [BIN, "-m", model, "--host", "127.0.0.1", "--port", str(PORT), "-t", "2"]
    if plugin:
        args += ["--spec-plugin", PLUGIN]
    p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health").read()
            return p
        except Exception:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def run(lib, plugin):
    p = serve(lib, plugin)
    tokens, texts, lock = [0], {}, threading.Lock()

    def client(c):
        for i, prompt in enumerate(streams[c]):
            r = post({"messages": [{"role": "user", "content": prompt}], "max_tokens": n_predict, "temperature": 0,
                      "cache_prompt": False})
            with lock:
                tokens[0] += r["usage"]["completion_tokens"]
                texts[(c, i)] = r["choices"][0]["message"]["content"]

    t0 = time.time()
    ts = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    p.terminate()
    p.wait()
    return tokens[0] / wall, texts


res = {}
for r in range(rounds):
    order = [("pages", None), ("upstream", upstream)]
    if r % 2:
        order.reverse()
    for config, plugin in (("plain", False), ("plugin", True)):
        for name, lib in order:
            tps, texts = run(lib, plugin)
            res.setdefault((config, name), []).append(tps)
            print(f"round {r} {config:6} {name:8} {tps:6.2f} tok/s", flush=True)
for config in ("plain", "plugin"):
    a, b = sum(res[(config, "pages")]), sum(res[(config, "upstream")])
    print(f"{config}: pages {a / rounds:.2f} tok/s, upstream {b / rounds:.2f} tok/s, pages/upstream {a / b:.3f}")
