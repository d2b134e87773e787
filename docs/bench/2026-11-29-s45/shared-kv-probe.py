"""Session 45's probe of a KV cache shared by several slots (session 44's, plus a round where the four long prompts
go at once, first): ten prompts (six short, four long) served one at a time and four at a time by
`llama-server --strict-batching` on auto -np (4 slots, one cache), each against the same prompt served alone by
plain `llama-server -np 1`. Usage: MODEL=path.gguf R=rounds python3 shared-kv-probe.py [extra llama-server flags]
(e.g. `--swa-full`, `-fa off`, `-b 1000 -ub 512`). Run from the repository root after `cargo build --release`;
BIN=path runs another llama-server. N_CMPL=n (session 46) instead asks each prompt for n completions (`n_cmpl`),
one request at a time, and compares every completion with the prompt served alone."""
import json, os, random, subprocess, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

BIN = os.environ.get('BIN', 'target/llama.cpp/bin/llama-server')
M = os.path.expanduser(os.environ.get('MODEL', '~/.cache/kolm-rsd/models/gemma-3-270m-q4_k_m.gguf'))
CTX, NP, R = os.environ.get('CTX', '8192'), int(os.environ.get('NP', '200')), int(os.environ.get('R', '3'))
N_CMPL = int(os.environ.get('N_CMPL', '1'))
fa = sys.argv[1:]

def start(port, extra):
    p = subprocess.Popen([BIN, '-m', M, '--port', str(port), '--host', '127.0.0.1', '-c', CTX, '-t', '2'] + extra,
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

a = start(8711, ['-np', '1'] + fa)  # the reference: plain llama-server, one slot
b = start(8712, ['--strict-batching'] + fa)
try:
    bodies = [{'prompt': p, 'n_predict': NP, 'temperature': 0, 'n_probs': 2, 'cache_prompt': False} for p in P]
    ref = [post(8711, x) for x in bodies]
    same = lambda got: ([int(r['content'] == g['content']) for r, g in zip(ref, got)],
                        [int(r['completion_probabilities'] == g['completion_probabilities']) for r, g in zip(ref, got)])
    print('prompt tokens', [r['tokens_evaluated'] for r in ref])
    if N_CMPL > 1:
        texts = probs = 0
        for i, x in enumerate(bodies):
            got = post(8712, dict(x, n_cmpl=N_CMPL))
            t = [int(g['content'] == ref[i]['content']) for g in got]
            q = [int(g['completion_probabilities'] == ref[i]['completion_probabilities']) for g in got]
            texts, probs = texts + sum(t), probs + sum(q)
            print('prompt', i, 'completions: texts', t, 'probabilities', q, flush=True)
        print(f'{texts} of {N_CMPL * len(P)} texts, {probs} of {N_CMPL * len(P)} probability lists equal to -np 1')
    else:
        print('one at a time: texts, probabilities', *same([post(8712, x) for x in bodies]), flush=True)
        with ThreadPoolExecutor(4) as ex:
            got = dict(zip(range(6, 10), ex.map(lambda i: post(8712, bodies[i]), range(6, 10))))
        print('the four long at once: texts, probabilities', *[[x[i - 6] for i in range(6, 10)]
              for x in same([got.get(i, ref[i]) for i in range(len(bodies))])], flush=True)
        for rep in range(R):
            order = list(range(len(bodies)))
            random.Random(rep).shuffle(order)
            with ThreadPoolExecutor(4) as ex:
                got = dict(zip(order, ex.map(lambda i: post(8712, bodies[i]), order)))
            print('four at a time, round', rep, ': texts, probabilities', *same([got[i] for i in range(len(bodies))]),
                  flush=True)
finally:
    for p in (a, b):
        p.terminate()
        p.wait()
    print('pages warnings:', open('/tmp/srv8712.log').read().count('no KV page of 256 cells free'))
