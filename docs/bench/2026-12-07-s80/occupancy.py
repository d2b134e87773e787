#!/usr/bin/env python3
# Per step log (session 79 layout): the round's time in steps that decoded a prompt and in generation steps, and the
# generation steps by how many slots generated in them: steps, seconds, tokens drafted and kept, and the decisions by
# why (src/draft/decision.rs letters). Usage: occupancy.py STEPS.tsv...
import sys, collections
for fn in sys.argv[1:]:
    rows = [l.split('\t') for l in open(fn).read().splitlines()[1:]]
    prompt = [r for r in rows if int(r[4]) > 0]
    gen = [r for r in rows if int(r[4]) == 0]
    by = collections.defaultdict(lambda: [0, 0, 0, 0, collections.Counter()])
    for r in gen:
        slots = sum(1 for t in r[5].split(',') if int(t) > 0)
        b = by[slots]
        b[0] += 1
        b[1] += int(r[0])
        for d in r[7].split(','):
            if d == '-':
                continue
            _, g, k, why, _, _ = d.split(':')
            b[2] += int(g); b[3] += int(k); b[4][why] += 1
    print(f"{fn}: prompt steps {len(prompt)} {sum(int(r[0]) for r in prompt) / 1e6:.1f} s, generation steps {len(gen)} {sum(int(r[0]) for r in gen) / 1e6:.1f} s")
    for n in sorted(by):
        st, us, g, k, why = by[n]
        print(f"  {n} slots: {st} steps {us / 1e6:.1f} s, drafted {g} kept {k} | " + ' '.join(f"{w}{why[w]}" for w in sorted(why)))
