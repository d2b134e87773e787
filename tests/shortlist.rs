//! Static shortlists and the subset head on the real SmolLM2-135M: subset logits against llama.cpp's full
//! head and against an exact (f64, dequantized-rows) reference, the id map, the certificate (projected
//! bound and exact rescoring), and hostile shortlist/histogram files.

mod common;

use kolm_rsd::compile::templated;
use kolm_rsd::head::{certify, exact_dot, principal_directions, top2, HeadInfo, HeadOptions, HeadRows, ProjectedBound, SubsetHead};
use kolm_rsd::llama::{self, Model, ModelOptions};
use kolm_rsd::pack::write_atomic;
use kolm_rsd::vocab::fingerprint;
use kolm_rsd::shortlist::{always_tokens, score_positions, Histogram, Method, Shortlist, ShortlistErrorKind};
use std::sync::OnceLock;

/// Largest |subset logit − llama.cpp logit| allowed. Both are ggml's CPU `mul_mat` of the same quantized
/// rows (SmolLM2's tied head is q8_0) by the same hidden state quantized the same way, so they agree
/// bit for bit; measured max diff 0 over 243 positions × 3,106 rows. The bound leaves room for a
/// different summation order only.
const TOL_LLAMA: f32 = 1e-4;
/// Largest |subset logit − exact logit| allowed, exact = f64 dot of ggml-dequantized rows with the f32
/// hidden state. The kernel quantizes the hidden state to q8_0 blocks (8-bit, one scale per 32 values),
/// which is the whole difference: measured max 0.434 on logits of magnitude up to 41.7 over 243
/// positions × 3,106 rows (the final hidden state has a few large outlier dimensions, so its 8-bit blocks
/// are coarse); set just above. The certificate's default slack (0.5) is this bound.
const TOL_EXACT: f32 = 0.5;

struct Fixture {
    model: Model,
    positions: Vec<(Vec<f32>, Vec<f32>)>, // (full logits, hidden state)
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        llama::quiet_logs();
        let model = Model::load(&common::smol(), &ModelOptions::default()).unwrap();
        let p = &kolm_rsd::workload::load("json-extraction").unwrap()[0];
        let toks = model.tokenize(&templated(&model, &p.text), true, true).unwrap();
        let mut positions = Vec::new();
        // A small batch size, so the text spans several decodes.
        score_positions(&model, &[toks], 48, 2, true, |pos| positions.push((pos.logits.to_vec(), pos.hidden.unwrap().to_vec())), |_| {}).unwrap();
        Fixture { model, positions }
    })
}

/// 3,000 spread ids plus every position's argmax, unsorted on purpose.
fn some_ids(f: &Fixture) -> Vec<u32> {
    let n = f.model.n_vocab() as u32;
    let mut ids: Vec<u32> = (0..3000u32).map(|i| (i * 7919 + 13) % n).collect();
    for (l, _) in &f.positions {
        ids.push(llama::argmax(l) as u32);
    }
    ids.reverse();
    let mut seen = std::collections::HashSet::new();
    ids.retain(|i| seen.insert(*i));
    ids
}

fn hidden_block(f: &Fixture) -> Vec<f32> {
    f.positions.iter().flat_map(|(_, h)| h.iter().copied()).collect()
}

#[test]
fn subset_logits_equal_full_head_logits() {
    let f = fixture();
    assert!(f.positions.len() > 60, "only {} positions", f.positions.len());
    let path = common::smol();
    let ids = some_ids(f);
    let mut head = SubsetHead::from_gguf(&path, &ids, &HeadOptions::default()).unwrap();
    assert_eq!(head.backend_name(), "CPU");
    let h = hidden_block(f);
    let npos = f.positions.len();
    let out = head.logits(&h, npos).unwrap();

    // Exact reference: dequantize the same rows with ggml's to_float, dot in f64.
    let info = HeadInfo::open(&path).unwrap();
    let rows = info.dequantize(&info.read_rows(&ids).unwrap());
    let d = info.n_embd;
    let (mut max_llama, mut max_exact, mut max_abs) = (0f32, 0f32, 0f32);
    for (c, (full, hid)) in f.positions.iter().enumerate() {
        let sub = &out[c * ids.len()..(c + 1) * ids.len()];
        for (i, &id) in ids.iter().enumerate() {
            max_llama = max_llama.max((sub[i] - full[id as usize]).abs());
            let exact: f64 = rows[i * d..(i + 1) * d].iter().zip(hid).map(|(&w, &x)| w as f64 * x as f64).sum();
            max_exact = max_exact.max((sub[i] as f64 - exact).abs() as f32);
            max_abs = max_abs.max(sub[i].abs());
        }
        // The set holds every argmax, so the subset argmax is the full one.
        let (i1, _, _) = top2(sub);
        assert_eq!(ids[i1], llama::argmax(full) as u32, "position {c}");
    }
    eprintln!("{npos} positions x {} rows: max |subset - llama.cpp| = {max_llama}, max |subset - exact| = {max_exact}, max |logit| = {max_abs}", ids.len());
    assert!(max_llama <= TOL_LLAMA, "subset vs llama.cpp differ by {max_llama}");
    assert!(max_exact <= TOL_EXACT, "subset vs exact differ by {max_exact}");

    // Batch invariance of the head: one column at a time gives the same numbers.
    let one = head.logits(&f.positions[5].1, 1).unwrap();
    assert_eq!(&one[..], &out[5 * ids.len()..6 * ids.len()]);
}

#[test]
fn id_map_round_trips() {
    let f = fixture();
    let path = common::smol();
    let ids = some_ids(f);
    let h = &f.positions[3].1;
    let fwd = SubsetHead::from_gguf(&path, &ids, &HeadOptions::default()).unwrap().logits(h, 1).unwrap();
    let rev_ids: Vec<u32> = ids.iter().rev().copied().collect();
    let mut rev_head = SubsetHead::from_gguf(&path, &rev_ids, &HeadOptions::default()).unwrap();
    assert_eq!(rev_head.ids(), &rev_ids[..]);
    let rev = rev_head.logits(h, 1).unwrap();
    for i in 0..ids.len() {
        assert_eq!(fwd[i], rev[ids.len() - 1 - i], "row of token {}", ids[i]);
    }
    // Shortlist ids ↔ rows.
    let fp = fingerprint(&f.model);
    let s = Shortlist::from_ranking(&ids, &always_tokens(&f.model), 1000, f.model.n_vocab() as u32, fp, Method::Topk, 10);
    let rows = s.rows();
    for (r, &id) in s.ids.iter().enumerate() {
        assert_eq!(rows[id as usize], Some(r as u32));
    }
    assert_eq!(rows.iter().filter(|r| r.is_some()).count(), s.len());
}

/// The certificate's setting on the fixture, as `shortlist report` builds it: the whole head in memory,
/// for each half of the positions a projected bound whose 32 directions are fitted on the other half, and
/// the exact logit of every row at every position (the oracle).
struct Cert {
    rows: HeadRows,
    half: usize,
    bounds: [ProjectedBound; 2],
    exact: Vec<f64>,
}

fn cert() -> &'static Cert {
    static C: OnceLock<Cert> = OnceLock::new();
    C.get_or_init(|| {
        let f = fixture();
        let rows = HeadRows::read(HeadInfo::open(&common::smol()).unwrap()).unwrap();
        let (n, d) = (rows.info.n_vocab, rows.info.n_embd);
        let h = hidden_block(f);
        let half = f.positions.len() / 2;
        let fit = |r: std::ops::Range<usize>| ProjectedBound::of_head(&rows, principal_directions(&h[r.start * d..r.end * d], d, 32), |_| {});
        let bounds = [fit(half..f.positions.len()), fit(0..half)];
        let full = rows.dequantized(0, n);
        let exact = h.chunks_exact(d).flat_map(|hp| full.chunks_exact(d).map(|w| exact_dot(w, hp)).collect::<Vec<_>>()).collect();
        Cert { rows, half, bounds, exact }
    })
}

fn outside_of(ids: &[u32], n: usize) -> Vec<u32> {
    let mut inset = vec![false; n];
    for &i in ids {
        inset[i as usize] = true;
    }
    (0..n as u32).filter(|&j| !inset[j as usize]).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn projected_bound_holds_on_every_outside_row() {
    let f = fixture();
    let c = cert();
    let n = c.rows.info.n_vocab;
    let outside = outside_of(&some_ids(f), n);
    let norms: Vec<f64> = (0..n).map(|j| c.rows.dequantized(j, j + 1)).map(|w| exact_dot(&w, &w).sqrt()).collect();
    let (mut rho_share, mut gap_proj, mut gap_norm) = (Vec::new(), Vec::new(), Vec::new());
    for (pos, (_, h)) in f.positions.iter().enumerate() {
        let pb = &c.bounds[(pos >= c.half) as usize];
        let p = pb.project(h);
        let hn = exact_dot(h, h).sqrt();
        let exact = &c.exact[pos * n..(pos + 1) * n];
        let (mut max_exact, mut max_bound, mut max_norm) = (f64::NEG_INFINITY, f64::NEG_INFINITY, 0f64);
        for &j in &outside {
            let (x, b) = (exact[j as usize], pb.bound(j as usize, &p));
            assert!(b >= x, "position {pos}, row {j}: bound {b} < exact logit {x}");
            max_exact = max_exact.max(x);
            max_bound = max_bound.max(b);
            max_norm = max_norm.max(norms[j as usize] * hn);
        }
        rho_share.push(p.residual_norm() / hn);
        gap_proj.push(max_bound - max_exact);
        gap_norm.push(max_norm - max_exact);
    }
    // The oracle's exact logits are HeadRows::exact_logit's.
    let h5 = &f.positions[5].1;
    for j in [0, 1, 777, n - 1] {
        assert_eq!(c.rows.exact_logit(j, h5), c.exact[5 * n + j]);
    }
    let (rho, gp, gn) = (median(rho_share), median(gap_proj), median(gap_norm));
    eprintln!("{} positions: median ρ/‖h‖ = {rho:.3}; median (largest outside bound − largest outside logit): projected {gp:.2}, norm bound {gn:.2}", f.positions.len());
    // Measured: ρ/‖h‖ 0.505 (32 directions fitted on the other half's 121-122 states), excess 160.7
    // against the norm bound's 337.5: half the norm bound's looseness, and still far above the
    // ~20 logits between the top logit and a typical row's.
    assert!(gp < 0.6 * gn, "projected bound excess {gp} is not well below the norm bound's {gn}");
}

#[test]
fn certificate_certifies_only_true_argmaxes() {
    let f = fixture();
    let c = cert();
    let path = common::smol();
    let n = c.rows.info.n_vocab;
    let h = hidden_block(f);
    let npos = f.positions.len();
    let full_arg: Vec<u32> = f.positions.iter().map(|(l, _)| llama::argmax(l) as u32).collect();
    // (certified, certified by the bound alone, wrong subset argmaxes, mean open share), checking every
    // verdict against the oracle: certified iff every outside exact logit + 0.5 < the subset's top-1.
    let run = |ids: &[u32]| {
        let outside = outside_of(ids, n);
        let lg = SubsetHead::from_gguf(&path, ids, &HeadOptions::default()).unwrap().logits(&h, npos).unwrap();
        let (mut cert, mut by_bound, mut wrong, mut open) = (0, 0, 0, 0f64);
        for (pos, (_, hid)) in f.positions.iter().enumerate() {
            let (i1, v1, _) = top2(&lg[pos * ids.len()..(pos + 1) * ids.len()]);
            let exact = &c.exact[pos * n..(pos + 1) * n];
            let v = certify(&c.bounds[(pos >= c.half) as usize], &outside, hid, v1, 0.5, |j| exact[j as usize]);
            let oracle = outside.iter().all(|&j| exact[j as usize] + 0.5 < v1 as f64);
            assert_eq!(v.certified, oracle, "position {pos}");
            let ok = ids[i1] == full_arg[pos];
            assert!(ok || !v.certified, "position {pos}: subset argmax {} certified, llama.cpp's is {}", ids[i1], full_arg[pos]);
            cert += v.certified as usize;
            by_bound += (v.certified && v.open == 0) as usize;
            wrong += !ok as usize;
            open += v.open as f64 / outside.len() as f64 / npos as f64;
        }
        (cert, by_bound, wrong, open)
    };
    // A set that holds every answer.
    let ids = some_ids(f);
    let (cert, by_bound, wrong, open) = run(&ids);
    eprintln!("some_ids ({} rows): certified {cert}/{npos}, by the bound alone {by_bound}, mean open share {open:.4}", ids.len());
    assert_eq!(wrong, 0);
    // Measured: 194 of 243 certified (the other 49 have an outside row within the 0.5 slack of the top-1
    // logit); set 3% below. None by the bound alone: every outside row is open (see docs/shortlist.md).
    assert!(cert >= 188, "only {cert} of {npos} certified (measured 194)");

    // Without the answers of every third position: those positions' subset argmax is wrong, and the
    // certificate must refuse every one of them (checked in `run`).
    let removed: std::collections::HashSet<u32> = full_arg.iter().step_by(3).copied().collect();
    let holed: Vec<u32> = ids.iter().copied().filter(|i| !removed.contains(i)).collect();
    let (cert, by_bound, wrong, open) = run(&holed);
    eprintln!("holed ({} rows): {wrong} wrong subset argmaxes, certified {cert}/{npos}, by the bound alone {by_bound}, mean open share {open:.4}", holed.len());
    // Measured: 167 wrong, 44 certified.
    assert!(wrong >= npos / 2, "only {wrong} positions lost their answer (measured 167)");
    assert!(cert >= 40, "only {cert} of {npos} certified (measured 44)");
}

fn smol_expect() -> (String, u32) {
    let f = fixture();
    (fingerprint(&f.model), f.model.n_vocab() as u32)
}

#[test]
fn hostile_shortlists_are_refused_with_reasons() {
    let (fp, nv) = smol_expect();
    let good = Shortlist::from_ranking(&[5, 9, 7], &[0], 4, nv, fp.clone(), Method::Topk, 10);
    let dir = common::scratch("shortlist-hostile");
    let path = dir.join("good.shortlist.json");
    write_atomic(&path, &good.to_vec()).unwrap();
    assert_eq!(Shortlist::load(&path, &fixture().model).unwrap(), good);

    let base: serde_json::Value = serde_json::from_slice(&good.to_vec()).unwrap();
    let with = |k: &str, v: serde_json::Value| {
        let mut x = base.clone();
        x[k] = v;
        serde_json::to_vec(&x).unwrap()
    };
    type Case = (&'static str, Vec<u8>, fn(&ShortlistErrorKind) -> bool);
    let cases: Vec<Case> = vec![
        ("not json", b"{oops".to_vec(), |k| matches!(k, ShortlistErrorKind::Json { .. })),
        ("format", with("format", "kolm-rsd/recipes".into()), |k| matches!(k, ShortlistErrorKind::Format { .. })),
        ("version", with("version", 9.into()), |k| matches!(k, ShortlistErrorKind::Version(9))),
        ("tokenizer", with("tokenizer", "ffffffffffffffffffffffffffffffff".into()), |k| matches!(k, ShortlistErrorKind::TokenizerMismatch { .. })),
        ("bad fingerprint", with("tokenizer", "nothex".into()), |k| matches!(k, ShortlistErrorKind::Invalid(_))),
        ("n_vocab", with("n_vocab", (nv + 1).into()), |k| matches!(k, ShortlistErrorKind::VocabMismatch { .. })),
        ("out of range", with("ids", serde_json::json!([0, 5, nv])), |k| matches!(k, ShortlistErrorKind::TokenOutOfRange { .. })),
        ("negative id", with("ids", serde_json::json!([0, -1])), |k| matches!(k, ShortlistErrorKind::Json { .. })),
        ("duplicate", with("ids", serde_json::json!([0, 5, 9, 5])), |k| matches!(k, ShortlistErrorKind::Duplicate(5))),
        ("empty", with("ids", serde_json::json!([])), |k| matches!(k, ShortlistErrorKind::Invalid(_))),
        ("always", with("always", 99.into()), |k| matches!(k, ShortlistErrorKind::Invalid(_))),
        ("top_k", with("top_k", 0.into()), |k| matches!(k, ShortlistErrorKind::Invalid(_))),
        ("method", with("method", "oracle".into()), |k| matches!(k, ShortlistErrorKind::Json { .. })),
        ("unknown field", with("extra", 1.into()), |k| matches!(k, ShortlistErrorKind::Json { .. })),
        ("too large", vec![b' '; kolm_rsd::shortlist::MAX_FILE_BYTES + 1], |k| matches!(k, ShortlistErrorKind::TooLarge(_))),
    ];
    for (what, bytes, ok) in cases {
        let p = dir.join(format!("{}.shortlist.json", what.replace(' ', "-")));
        std::fs::write(&p, &bytes).unwrap();
        let e = Shortlist::from_slice(&bytes, &p.display().to_string(), Some((&fp, nv))).unwrap_err();
        assert!(ok(&e.kind), "{what}: got {:?}", e.kind);
        let msg = Shortlist::load(&p, &fixture().model).unwrap_err().to_string();
        assert!(msg.contains(&p.display().to_string()), "{what}: message does not name the file: {msg}");
        eprintln!("{what}: {msg}");
    }
    let missing = Shortlist::load(&dir.join("none.json"), &fixture().model).unwrap_err().to_string();
    assert!(missing.contains("none.json"), "{missing}");
}

#[test]
fn histogram_round_trips_through_a_file_and_refuses_hostile_ones() {
    let f = fixture();
    let (fp, nv) = smol_expect();
    let mut h = Histogram::new(fp.clone(), nv as usize, 10);
    h.corpus.push("json-extraction[0]".into());
    for (l, _) in &f.positions {
        h.add_logits(l);
    }
    let toks: Vec<i32> = f.positions.iter().map(|(l, _)| llama::argmax(l)).collect();
    h.add_text(&toks);
    assert_eq!(h.positions as usize, f.positions.len());
    let dir = common::scratch("shortlist-histogram");
    let p = dir.join("smol.histogram.json");
    write_atomic(&p, &h.to_vec()).unwrap();
    let back = Histogram::load(&p, Some((&fp, nv))).unwrap();
    assert_eq!(back, h);
    // Same shortlist from the saved histogram, for any size.
    let always = always_tokens(&f.model);
    for size in [10, 500, 40000] {
        assert_eq!(Shortlist::from_histogram(&back, Method::Topk, &always, size), Shortlist::from_histogram(&h, Method::Topk, &always, size));
    }
    let s = Shortlist::from_histogram(&h, Method::Topk, &always, 500);
    assert_eq!(&s.ids[..always.len()], &always[..]);
    assert!(s.ids[always.len()..].iter().all(|&i| h.topk[i as usize] > 0));

    let mut v: serde_json::Value = serde_json::from_slice(&h.to_vec()).unwrap();
    v["topk"] = serde_json::json!([[3, 1], [3, 2]]);
    let e = Histogram::from_slice(&serde_json::to_vec(&v).unwrap(), "dup.histogram.json", Some((&fp, nv))).unwrap_err();
    assert_eq!(e.kind, ShortlistErrorKind::Duplicate(3));
    assert!(e.to_string().contains("dup.histogram.json"));
    v["topk"] = serde_json::json!([[nv, 1]]);
    let e = Histogram::from_slice(&serde_json::to_vec(&v).unwrap(), "big.histogram.json", Some((&fp, nv))).unwrap_err();
    assert!(matches!(e.kind, ShortlistErrorKind::TokenOutOfRange { .. }), "{e}");
}


