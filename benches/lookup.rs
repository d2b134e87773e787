//! Propose latency on a synthetic 15,000-entry pack (warm, and with the caches flushed as a decode flushes them),
//! plus pack size and load time.
//!
//! Besides criterion's means, prints per-call percentiles (each call timed with `Instant`, so
//! about 20–40 ns of timer overhead is included) and the pack figures.

use std::hint::black_box;
use std::time::Instant;

use criterion::Criterion;
use kolm_rsd::draft::syntax::TokenTexts;
use kolm_rsd::draft::{Drafter, DrafterConfig};
use kolm_rsd::index::Index;
use kolm_rsd::live::{Live, LiveConfig};
use kolm_rsd::pack::Pack;
use kolm_rsd::shape::ShapeTable;

mod common;
use common::{meta, pack_from, refs, stream, vocab, Lcg, VOCAB};

/// Runs the drafter along `s` as if the target generated it; returns per-call nanoseconds.
fn run(d: &mut Drafter, s: &[i32], calls: usize, n_max: usize) -> (Vec<u64>, usize) {
    let mut times = Vec::with_capacity(calls);
    let (mut out, mut misses) = (Vec::new(), Vec::new());
    let prompt = 500;
    let mut pos = prompt;
    d.begin(0, &s[..prompt]);
    let mut drafted = 0;
    let mut fake_now = 0u64;
    while times.len() < calls {
        if pos + n_max + 2 >= s.len() || pos > prompt + 4000 {
            pos = prompt;
            d.begin(0, &s[..prompt]);
            d.drain_misses(&mut misses);
            misses.clear();
        }
        let t0 = Instant::now();
        let g = d.propose(0, &s[..pos], s[pos], n_max, fake_now, &mut out);
        times.push(t0.elapsed().as_nanos() as u64);
        let acc = out
            .iter()
            .zip(&s[pos + 1..])
            .take_while(|(a, b)| a == b)
            .count();
        d.accept(0, acc);
        drafted += g;
        pos += acc + 1;
        fake_now += 57_000_000 + 30_000_000 * g as u64;
    }
    (times, drafted)
}

/// Walks the drafter once along `s` (a new request every 4,000 tokens, its prompt the 500 before): per place
/// of the stream where it proposed, the nanoseconds of the `propose` and of the step (`propose` and `accept`,
/// both on the server's path) and what it drafted.
fn walk(d: &mut Drafter, s: &[i32], n_max: usize, mut evict: Option<&mut Evict>) -> std::collections::HashMap<usize, ((u64, u64), Vec<i32>)> {
    let mut calls = std::collections::HashMap::new();
    let (mut out, mut misses) = (Vec::new(), Vec::new());
    let (mut pos, mut start, mut fake_now) = (500, 500, 0u64);
    d.begin(0, &s[..pos]);
    while pos + n_max + 2 < s.len() {
        if pos >= start + 4000 {
            start = pos;
            d.begin(0, &s[pos - 500..pos]);
            d.drain_misses(&mut misses);
            misses.clear();
        }
        let history = &s[start - 500..pos];
        if let Some(e) = evict.as_deref_mut() {
            e.run();
        }
        let t0 = Instant::now();
        let g = d.propose(0, history, s[pos], n_max, fake_now, &mut out);
        let dt = t0.elapsed().as_nanos() as u64;
        let acc = out.iter().zip(&s[pos + 1..]).take_while(|(a, b)| a == b).count();
        let t1 = Instant::now();
        d.accept(0, acc);
        calls.insert(pos, ((dt, dt + t1.elapsed().as_nanos() as u64), out.clone()));
        pos += acc + 1;
        fake_now += 57_000_000 + 30_000_000 * g as u64;
    }
    calls
}

/// Walks `s` with and without the live index and prints what it adds to the calls made at the same place that
/// drafted the same tokens (the difference is then what consulting and feeding the live index costs, not extra
/// drafting).
fn matched(name: &str, pack: &Pack, sh: &ShapeTable, texts: &[String], s: &[i32], n_max: usize, mut evict: Option<&mut Evict>) {
    let arms: Vec<_> = [false, true]
        .into_iter()
        .map(|with_live| {
            let mut d = Drafter::new(Some(Index::new(pack, Some(sh.clone()))), DrafterConfig::default()).with_texts(TokenTexts::new(&refs(texts)));
            if with_live {
                d = d.with_live(Live::new(LiveConfig::default(), Some(sh.clone())));
            }
            walk(&mut d, &s[..s.len().min(20_000)], n_max, None); // warm-up
            walk(&mut d, s, n_max, evict.as_deref_mut())
        })
        .collect();
    let (mut a, mut b, mut sa, mut sb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (pos, (t1, d1)) in &arms[1] {
        if let Some((t0, _)) = arms[0].get(pos).filter(|(_, d0)| d0 == d1) {
            a.push(t0.0);
            b.push(t1.0);
            sa.push(t0.1);
            sb.push(t1.1);
        }
    }
    let (p50a, p99a, p50b, p99b) = (pct(&mut a, 0.5), pct(&mut a, 0.99), pct(&mut b, 0.5), pct(&mut b, 0.99));
    let (s50a, s99a, s50b, s99b) = (pct(&mut sa, 0.5), pct(&mut sa, 0.99), pct(&mut sb, 0.5), pct(&mut sb, 0.99));
    println!(
        "{name:26} {} matched calls of {} and {}: propose p50 {p50a:5} → {p50b:5} ns, p99 {p99a:5} → {p99b:5} ns ({:+} ns); \
         propose + accept p50 {s50a:5} → {s50b:5} ns, p99 {s99a:5} → {s99b:5} ns ({:+} ns)",
        a.len(), arms[0].len(), arms[1].len(), p99b as i64 - p99a as i64, s99b as i64 - s99a as i64
    );
}

/// What a server's decode does to the caches between two calls (it streams the model's weights, a gigabyte
/// here): a read of more memory than the last-level cache holds, outside the timed calls.
struct Evict(Vec<u8>);

impl Evict {
    fn new() -> Evict {
        Evict(vec![1; 64 << 20])
    }

    fn run(&mut self) {
        let sum: u64 = self.0.iter().step_by(64).map(|&b| u64::from(b)).sum();
        black_box(sum);
    }
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn main() {
    let mut rng = Lcg(42);
    let texts = vocab();
    let sh = ShapeTable::from_token_texts(&refs(&texts));
    let s = stream(200_000, &mut rng);
    let pack = pack_from(&s, &sh, 15_000, &mut rng);
    let eager = DrafterConfig {
        beta_prior: vec![(1, 1.0), (16, 1.0)],
        class_prior: [0.95; kolm_rsd::draft::class::N_CLASSES],
        ..DrafterConfig::default()
    };

    // No HTML plots: criterion draws them with system fonts and panics where there are none (this CI image);
    // the bench prints its own percentiles.
    let mut c = Criterion::default().without_plots().configure_from_args();
    {
        let idx = Index::new(&pack, Some(sh.clone()));
        let mut i = 1000;
        c.bench_function("index_lookup_15k", |b| {
            b.iter(|| {
                i = if i + 1 >= s.len() { 1000 } else { i + 1 };
                black_box(idx.lookup(black_box(&s[i - 64..i])))
            })
        });
        let mut d = Drafter::new(Some(Index::new(&pack, Some(sh.clone()))), eager.clone());
        let (mut out, mut pos, mut now) = (Vec::new(), 1000usize, 0u64);
        d.begin(0, &s[..1000]);
        c.bench_function("propose_15k_nmax4_eager", |b| {
            b.iter(|| {
                if pos + 8 >= 5000 {
                    pos = 1000;
                    d.begin(0, &s[..1000]);
                }
                let g = d.propose(0, &s[..pos], s[pos], 4, now, &mut out);
                let acc = out
                    .iter()
                    .zip(&s[pos + 1..])
                    .take_while(|(a, b)| a == b)
                    .count();
                d.accept(0, acc);
                pos += acc + 1;
                now += 57_000_000;
                black_box(g)
            })
        });
        let json = Pack::from_entries(meta(), pack.entries()[..9_000].to_vec())
            .unwrap()
            .to_vec();
        c.bench_function("pack_load_9000_entries", |b| {
            b.iter(|| {
                Pack::from_slice(black_box(&json), "bench", None, Some(VOCAB as u32)).unwrap()
            })
        });
    }
    c.final_summary();

    println!("\n== per-call propose latency, 15,000-entry pack, 200,000 calls ==");
    for (name, cfg, n_max) in [
        ("default control, n_max 4", DrafterConfig::default(), 4),
        ("eager, n_max 4", eager.clone(), 4),
        ("eager, n_max 8", eager, 8),
        ("default control, n_max 8", DrafterConfig::default(), 8),
    ] {
        // As the plugin runs it: with token texts, so places in the answer's syntax are read too.
        let mut d = Drafter::new(Some(Index::new(&pack, Some(sh.clone()))), cfg).with_texts(TokenTexts::new(&refs(&texts)));
        run(&mut d, &s, 20_000, n_max); // warm-up
        let (mut t, drafted) = run(&mut d, &s, 200_000, n_max);
        let mean = t.iter().sum::<u64>() as f64 / t.len() as f64;
        let st = d.global_stats();
        println!(
            "{name:26} mean {mean:5.0} ns  p50 {:5} ns  p90 {:5} ns  p99 {:5} ns  max {:7} ns | {:.2} drafted/call, hits lit {} shape {} ctx {}",
            pct(&mut t, 0.5), pct(&mut t, 0.9), pct(&mut t, 0.99), pct(&mut t, 1.0),
            drafted as f64 / 200_000.0, st.literal_hits, st.shape_hits, st.context_hits
        );
    }

    println!("\n== the live index: the same calls with it learning and drafting (default size, 2^18 entries) ==");
    for (name, cfg, n_max) in [("default control, n_max 4", DrafterConfig::default(), 4), ("default control, n_max 8", DrafterConfig::default(), 8)] {
        let mut p99 = [0u64; 2];
        for (i, with_live) in [false, true].into_iter().enumerate() {
            let mut d = Drafter::new(Some(Index::new(&pack, Some(sh.clone()))), cfg.clone()).with_texts(TokenTexts::new(&refs(&texts)));
            if with_live {
                d = d.with_live(Live::new(LiveConfig::default(), Some(sh.clone())));
            }
            run(&mut d, &s, 20_000, n_max);
            let (mut t, _) = run(&mut d, &s, 200_000, n_max);
            p99[i] = pct(&mut t, 0.99);
            if let Some(l) = d.live() {
                let st = d.global_stats();
                println!(
                    "{name:26} p50 {:5} ns  p99 {:5} ns (without it {:5} ns: {:+} ns) | live hits {}, {} of {} entries, {} KiB, {} tokens learned",
                    pct(&mut t, 0.5), p99[1], p99[0], p99[1] as i64 - p99[0] as i64, st.live_hits, l.len(), l.capacity(), l.bytes() >> 10, l.fed()
                );
            }
        }
    }

    println!("\n== the live index where it changes nothing: calls at the same place that drafted the same, with and without it ==");
    for (name, n_max) in [("default control, n_max 4", 4), ("default control, n_max 8", 8)] {
        matched(name, &pack, &sh, &texts, &s, n_max, None);
    }
    // About 40 s; KOLM_LOOKUP_COLD=0 leaves it out (A/B runs of the warm figures).
    if std::env::var_os("KOLM_LOOKUP_COLD").is_none_or(|v| v != "0") {
        println!("\n== the same on a cold cache: before each call a read of 64 MiB (twice the last-level cache), as a server's decode streams its weights ==");
        let mut evict = Evict::new();
        matched("default control, n_max 8", &pack, &sh, &texts, &s[..8_000], 8, Some(&mut evict));
    }

    println!("\n== the live index alone: one feed (a verified token, all its contexts) and one lookup, 200,000 each ==");
    {
        let mut l = Live::new(LiveConfig::default(), Some(sh.clone()));
        // Warm: the table as the drafter section leaves it (its stream fed once and more), then timed ops
        // further along the same stream, half of them contexts seen before.
        let max = l.max_n();
        for i in 1000..150_000 {
            l.feed(&s[i - max..i], s[i]);
        }
        let (mut tf, mut tl) = (Vec::with_capacity(200_000), Vec::with_capacity(200_000));
        let mut hits = 0usize;
        for k in 0..200_000 {
            let i = 1000 + (k * 7919) % 198_000;
            let t0 = Instant::now();
            let h = black_box(l.lookup(&s[i - max..i]));
            tl.push(t0.elapsed().as_nanos() as u64);
            hits += h.is_some() as usize;
            // Another place: a feed does not find its sets warm from the lookup before it.
            let j = 1000 + (k * 104_729 + 55_555) % 198_000;
            let t0 = Instant::now();
            l.feed(black_box(&s[j - max..j]), s[j]);
            tf.push(t0.elapsed().as_nanos() as u64);
        }
        println!(
            "feed   p50 {:4} ns  p99 {:5} ns | lookup p50 {:4} ns  p99 {:5} ns ({hits} hits) | {} of {} entries, {} KiB",
            pct(&mut tf, 0.5), pct(&mut tf, 0.99), pct(&mut tl, 0.5), pct(&mut tl, 0.99), l.len(), l.capacity(), l.bytes() >> 10
        );
    }

    println!("\n== pack size and load ==");
    for n in [100usize, 1_000, 9_000, 15_000] {
        let p = Pack::from_entries(meta(), pack.entries()[..n].to_vec()).unwrap();
        let json = p.to_vec();
        let mut t = Vec::new();
        for _ in 0..30 {
            let t0 = Instant::now();
            black_box(Pack::from_slice(&json, "bench", None, Some(VOCAB as u32)).unwrap());
            t.push(t0.elapsed().as_nanos() as u64);
        }
        let empty = Pack::from_entries(meta(), vec![]).unwrap().to_vec().len();
        println!(
            "{n:6} entries: {:7} bytes ({:.0} bytes/100 entries incl. ~{empty} bytes of metadata, {:.0} without), load p50 {:.3} ms",
            json.len(),
            json.len() as f64 * 100.0 / n as f64,
            (json.len() - empty) as f64 * 100.0 / n as f64,
            pct(&mut t, 0.5) as f64 / 1e6
        );
    }
}
