//! Memory over 10,000 requests (issue 17: the live index stays within its bound). The drafter as the plugin
//! runs it: a 15,000-entry pack, token texts, the live index at its default size, 8 sequences served a step at
//! a time as llama-server's slots are, the miss log drained as the plugin drains it. No request repeats
//! another (each prompt is its own synthetic stream, each answer a template with values of its own), so the live
//! index fills, then evicts for most of the run while the templates' contexts recur.
//! Every 1,000 requests: the Rust heap (the counting allocator every kolm-rsd binary has, the plugin's own
//! memory in a server), the process's resident memory, the table, and what it still drafts. Nothing is timed.

use kolm_rsd::draft::step::Layout;
use kolm_rsd::draft::syntax::TokenTexts;
use kolm_rsd::draft::{Drafter, DrafterConfig};
use kolm_rsd::heap;
use kolm_rsd::index::Index;
use kolm_rsd::live::{Live, LiveConfig};
use kolm_rsd::server::rss_kib;
use kolm_rsd::shape::ShapeTable;

mod common;
use common::{pack_from, refs, stream, vocab, Lcg, VOCAB};

const REQUESTS: usize = 10_000;
const SLOTS: usize = 8;
const PROMPT: usize = 300;
const ANSWER: usize = 100;
const EVERY: usize = 1_000;
const TEMPLATES: usize = 50;

/// A slot's request: its whole token stream (its own prompt, then the answer the target would give) and where
/// the answer has reached. An answer is one of [`TEMPLATES`] templates (structure that recurs, as a task's answers share
/// it) with a tenth of its tokens its own (the values): never an earlier request's answer.
struct Request {
    tokens: Vec<i32>,
    pos: usize,
}

impl Request {
    fn new(i: usize) -> Request {
        let mut rng = Lcg(1 + i as u64 * 7_919);
        let mut tokens = stream(PROMPT, &mut rng);
        let template = stream(ANSWER, &mut Lcg(1_000_003 + (i % TEMPLATES) as u64));
        tokens.extend(template.iter().map(|&t| {
            if rng.next(10) == 0 {
                rng.next(VOCAB as u32) as i32
            } else {
                t
            }
        }));
        Request { tokens, pos: PROMPT }
    }
}

fn main() {
    let texts = vocab();
    let sh = ShapeTable::from_token_texts(&refs(&texts));
    let pack = pack_from(&stream(200_000, &mut Lcg(42)), &sh, 15_000, &mut Lcg(43));
    // Eager (one unified pass per step, verification priced free, every class trusted at first), so the run drafts
    // from the start and the table is read as well as written; the control still learns from what is accepted.
    let cfg = DrafterConfig {
        n_seq: SLOTS,
        layout: Some(Layout::Unified),
        beta_prior: vec![(1, 1.0), (16, 1.0)],
        class_prior: [0.95; kolm_rsd::draft::class::N_CLASSES],
        ..DrafterConfig::default()
    };
    let mut d = Drafter::new(Some(Index::new(&pack, Some(sh.clone()))), cfg)
        .with_texts(TokenTexts::new(&refs(&texts)))
        .with_live(Live::new(LiveConfig::default(), Some(sh)));
    drop(pack);
    let (mut out, mut misses) = (Vec::new(), Vec::new());
    let mut slots: Vec<Option<Request>> = (0..SLOTS).map(|_| None).collect();
    let (mut started, mut done, mut now) = (0usize, 0usize, 0u64);
    let mut last = d.global_stats();
    println!("{REQUESTS} requests ({PROMPT}-token prompts, {ANSWER}-token answers on {TEMPLATES} templates, none repeated), {SLOTS} sequences, default live index");
    println!("\n| requests | heap MiB (peak) | RSS MiB | live entries (of) | table MiB | drafted / accepted since last row | live hits since |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let row = |done: usize, d: &Drafter, last: &kolm_rsd::draft::stats::Stats| {
        let (s, l) = (d.global_stats(), d.live().expect("attached"));
        println!(
            "| {done} | {:.1} ({:.1}) | {:.1} | {} ({}) | {:.1} | {} / {} | {} |",
            heap::live() as f64 / 1048576.0,
            heap::peak() as f64 / 1048576.0,
            rss_kib("self").unwrap_or(0) as f64 / 1024.0,
            l.len(),
            l.capacity(),
            l.bytes() as f64 / 1048576.0,
            s.tokens_drafted - last.tokens_drafted,
            s.tokens_accepted - last.tokens_accepted,
            s.live_hits - last.live_hits
        );
        s
    };
    last = row(0, &d, &last);
    while done < REQUESTS {
        // One server step: every slot with a request proposes, the target verifies, each accepts.
        let mut drafted = 0;
        for (seq, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() && started < REQUESTS {
                let r = Request::new(started);
                d.begin(seq, &r.tokens[..PROMPT]);
                *slot = Some(r);
                started += 1;
            }
            let Some(r) = slot else { continue };
            drafted += d.propose(seq, &r.tokens[..r.pos], r.tokens[r.pos], 8, now, &mut out);
            let acc = out
                .iter()
                .zip(&r.tokens[r.pos + 1..])
                .take_while(|(a, b)| a == b)
                .count();
            d.accept(seq, acc);
            r.pos += acc + 1;
            if r.pos + 1 >= r.tokens.len() {
                *slot = None;
                done += 1;
                if done % EVERY == 0 {
                    last = row(done, &d, &last);
                }
            }
        }
        d.drain_misses(&mut misses);
        misses.clear();
        now += 57_000_000 + 3_000_000 * drafted as u64;
    }
}
