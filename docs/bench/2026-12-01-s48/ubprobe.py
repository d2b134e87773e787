# Session 48: llama-server's prompt speed by -ub (strict batching, -np 1). From the repository root: python3 docs/bench/2026-12-01-s48/ubprobe.py MODEL
import json, subprocess, sys, time, urllib.request
model = sys.argv[1]
recs = [json.loads(l) for l in open('workloads/json-extraction.jsonl')]
prompt = '\n\n'.join(r['prompt'] for r in recs[:4])
port = 8433
def post(body):
    req = urllib.request.Request(f'http://127.0.0.1:{port}/completion', json.dumps(body).encode(), {'Content-Type': 'application/json'})
    return json.load(urllib.request.urlopen(req, timeout=600))
res = {}
for rnd in range(2):
    for ub in [64, 128, 256, 512]:
        srv = subprocess.Popen(['target/llama.cpp/bin/llama-server', '-m', model, '--port', str(port), '-t', '2', '-c', '4096', '-np', '1', '--strict-batching', '-ub', str(ub)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try: urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=2); break
            except Exception: time.sleep(0.5)
        try:
            post({'prompt': 'warm up', 'n_predict': 1, 'cache_prompt': False})
            for _ in range(2):
                r = post({'prompt': prompt, 'n_predict': 1, 'cache_prompt': False})
                res.setdefault(ub, []).append(r['timings']['prompt_per_second'])
        finally:
            srv.terminate(); srv.wait()
print('prompt tokens', r['timings']['prompt_n'])
for ub, v in res.items(): print(ub, ' '.join(f'{x:.0f}' for x in v), 'median %.0f' % sorted(v)[len(v)//2])
