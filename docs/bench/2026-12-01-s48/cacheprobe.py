# Session 48: does prompt caching change answers? Seven requests sharing prefixes, each with cache_prompt true, then
# each alone (cache_prompt false), text and probabilities compared. From the repository root:
#   python3 docs/bench/2026-12-01-s48/cacheprobe.py MODEL PORT [llama-server args, e.g. --spec-plugin target/release/libkolm_rsd.so --cache-exact]
import json, subprocess, sys, time, urllib.request, os
model, port, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
recs = [json.loads(l) for l in open('workloads/json-extraction.jsonl')]
env = dict(os.environ)
srv = subprocess.Popen(['target/llama.cpp/bin/llama-server', '-m', model, '--port', str(port), '-t', '2', '-c', '4096'] + extra,
                       stdout=open('/tmp/cacheprobe-server.log', 'w'), stderr=subprocess.STDOUT)
def post(body, path='/completion'):
    req = urllib.request.Request(f'http://127.0.0.1:{port}{path}', json.dumps(body).encode(), {'Content-Type': 'application/json'})
    return json.load(urllib.request.urlopen(req, timeout=600))
for _ in range(300):
    try:
        urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=2); break
    except Exception: time.sleep(0.5)
try:
    base = '\n\n'.join(r['prompt'] for r in recs[:3])
    A = base + '\n\nFirst, the contact card above:'
    q = lambda p, c: {'prompt': p, 'n_predict': 48, 'temperature': 0.0, 'n_probs': 2, 'cache_prompt': c}
    a = post(q(A, True))
    B = A + a['content'] + '\n\nNow the second one:'
    C = base[: len(base) // 2] + '\n\nSomething else entirely: summarise this.'
    D = '\n\n'.join(r['prompt'] for r in recs[3:5])
    seq = [('A', A), ('B', B), ('C', C), ('A', A), ('D', D), ('B', B), ('C', C)]
    got = [('A', a)] + [(n, post(q(p, True))) for n, p in seq[1:]]
    ref = {n: post(q(p, False)) for n, p in dict(seq).items()}
    bad = 0
    for n, r in got:
        same_t = r['content'] == ref[n]['content']
        same_p = r['completion_probabilities'] == ref[n]['completion_probabilities']
        bad += not (same_t and same_p)
        print(n, 'prompt', r['tokens_evaluated'], 'cached', r['timings'].get('cache_n'), 'text', same_t, 'probs', same_p)
    print('differ', bad, 'of', len(got))
finally:
    srv.terminate(); srv.wait()
