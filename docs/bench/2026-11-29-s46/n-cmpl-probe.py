"""Session 46's probe of the completions of one request (`n_cmpl`) in a KV cache shared by several slots: the ten
prompts of session 45's probe (six short, four long), each asked for N completions (default 3) by
`llama-server --strict-batching` on auto -np (4 slots, one cache), one request at a time, and every completion
compared with the prompt served alone by plain `llama-server -np 1` (text and token probabilities).
Usage: MODEL=path.gguf N=3 python3 n-cmpl-probe.py [extra llama-server flags] (e.g. `-fa off`). Run from the
repository root after `cargo build --release`; BIN=path runs another llama-server."""
import json, os, random, subprocess, sys, time, urllib.request

BIN = os.environ.get('BIN', 'target/llama.cpp/bin/llama-server')
M = os.path.expanduser(os.environ.get('MODEL', '~/.cache/kolm-rsd/models/SmolLM2-135M-Instruct.Q4_1.gguf'))
CTX, NP, N = os.environ.get('CTX', '8192'), int(os.environ.get('NP', '100')), int(os.environ.get('N', '3'))
extra = sys.argv[1:]

def start(port, flags):
    p = subprocess.Popen([BIN, '-m', M, '--port', str(port), '--host', '127.0.0.1', '-c', CTX, '-t', '2'] + flags,
                         stdout=open(f'/tmp/srv{port}.log', 'w'), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            urllib.request.urlopen(f'http://127.0.0.1:{port}/health').read()
            return p
        except Exception:
            time.sleep(0.2)
    raise SystemExit('server did not start')

def post(port, body):
    r = urllib.request.Request(f'http://127.0.0.1:{port}/completion', data=json.dumps(body).encode(),
                               headers={'Content-Type': 'application/json'})
    return json.loads(urllib.request.urlopen(r, timeout=600).read())

people = [('Ann Lee', 31, 'Oslo'), ('Bo Chan', 45, 'Lima'), ('Cy Dorn', 29, 'Rome'), ('Di Eck', 52, 'Kyiv')]
P = ['Extract the fields as JSON: name %s, age %d, city %s, email %s@example.com.\nJSON:' % (n, a, c, n.split()[0].lower())
     for n, a, c in people]
P += ['def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
      'Repeat this line three times: {"id": 17, "name": "Ann Lee", "tags": ["x", "y"]}\n']
names = [('Ann Lee', 'Oslo'), ('Bo Chan', 'Lima'), ('Cy Dorn', 'Rome'), ('Di Eck', 'Kyiv'), ('Ed Fox', 'Bern'), ('Flo Gil', 'Riga')]
def longp(n, seed):
    r = random.Random(seed)
    recs = []
    for i in range(n):
        a, c = r.choice(names)
        recs.append('Record %d: name %s, age %d, city %s.\n' % (i, a, r.randint(20, 70), c))
    return 'Here is a list of records.\n' + ''.join(recs) + 'Repeat every record as a JSON line:\n'
P += [longp(n, s) for n, s in ((40, 1), (60, 2), (70, 3), (50, 4))]

a = start(8721, ['-np', '1'] + extra)  # the reference: plain llama-server, one slot
b = start(8722, ['--strict-batching'] + extra)
try:
    body = lambda p, n: {'prompt': p, 'n_predict': NP, 'temperature': 0, 'n_probs': 2, 'cache_prompt': False, 'n_cmpl': n}
    ref = [post(8721, body(p, 1)) for p in P]
    print('prompt tokens', [r['tokens_evaluated'] for r in ref])
    texts = probs = 0
    for i, p in enumerate(P):
        got = post(8722, body(p, N))
        got = got if isinstance(got, list) else [got]
        t = [int(g['content'] == ref[i]['content']) for g in got]
        q = [int(g['completion_probabilities'] == ref[i]['completion_probabilities']) for g in got]
        texts, probs = texts + sum(t), probs + sum(q)
        print('prompt', i, 'completions: texts', t, 'probabilities', q, flush=True)
    print(f'{texts} of {N * len(P)} texts, {probs} of {N * len(P)} probability lists equal to -np 1')
finally:
    for p in (a, b):
        p.terminate()
        p.wait()
    print('pages warnings:', open('/tmp/srv8722.log').read().count('no KV page of 256 cells free'))
