#!/usr/bin/env python3
# Per segment of a step log (session 79 layout, with its drafts column): steps that drafted, decisions by why
# (src/draft/decision.rs letters), chain tokens found / drafted / kept, the mean first-token estimate of the
# chains found, and how the token after each step's draft was judged in the next step (+ right, x wrong), by the
# decision it followed. Usage: why.py STEPS.tsv [STEPS_PER_SEGMENT]
import sys, collections
seg = int(sys.argv[2]) if len(sys.argv) > 2 else 500
lines = open(sys.argv[1]).read().splitlines()[1:]
def row(ws, i):
    c = collections.Counter(); jr = collections.Counter(); p = collections.defaultdict(list); fk = collections.Counter()
    drafting = 0
    prev = {}
    for l in ws:
        f = l.split('\t')
        ds = f[7].split(',')
        if any(d != '-' and int(d.split(':')[1]) > 0 for d in ds): drafting += 1
        for slot, d in enumerate(ds):
            if d == '-': prev.pop(slot, None); continue
            n, g, k, why, p0, j = d.split(':')
            pw = prev.get(slot); prev[slot] = why
            c[why] += 1
            fk['found'] += int(n); fk['drafted'] += int(g); fk['kept'] += int(k)
            if int(n) > 0: p[why].append(float(p0))
            if j != '-' and pw: jr[(pw, j)] += 1
    whys = ' '.join(f"{w}{c[w]}" for w in sorted(c))
    ps = ' '.join(f"{w}:{sum(v)/len(v):.2f}" for w, v in sorted(p.items()))
    js = ' '.join(f"{w}{j}{n}" for (w, j), n in sorted(jr.items()))
    print(f"{i:5d} steps {len(ws):4d} drafting {drafting:4d} | {whys} | found {fk['found']} drafted {fk['drafted']} kept {fk['kept']} | p0 {ps} | judged {js}")
for i in range(0, len(lines), seg):
    row(lines[i:i+seg], i)
