//! The miss log under `kill -9`: clients keep the server with the plugin drafting (and so logging misses)
//! while it is killed at a random moment, again and again; after every kill the log must read back with no
//! torn record parsed, stay under its cap, and the next server must write on after whatever it left.
//! At the end the log is folded as `compile --misses` folds it.

use crate::align::{AlignConfig, BuildConfig, Recipes};
use crate::load::{self, Kind, Limits, Request};
use crate::misslog::{fold_misses, read_misses, ReadReport};
use crate::pack::Pack;
use super::Target;
use crate::server::Server;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct CrashOptions {
    pub target: Target,
    pub kills: usize,
    pub clients: usize,
    /// The log's cap, small enough that the run reaches it.
    pub cap_bytes: u64,
    /// The kill comes this long after the server first wrote to the log: uniform in [min, max).
    pub kill_after: (Duration, Duration),
    pub seed: u64,
}

/// What the kills left behind.
#[derive(Debug, Default)]
pub struct CrashReport {
    pub kills: usize,
    /// Kills after which the log ended in a torn line (a record cut mid-write).
    pub torn_tails: usize,
    /// The log after the last kill.
    pub last: ReadReport,
    pub size: u64,
    pub largest: u64,
    /// Recipe entries `compile --misses` folding makes of the log.
    pub folded_entries: usize,
    pub problems: Vec<String>,
}

impl CrashReport {
    /// The run in a few lines.
    pub fn text(&self, cap: u64) -> String {
        format!(
            "{} kills; torn tails left by a kill: {}; after the last kill the log read {} records, {} lines skipped, {} torn, {} bytes (cap {cap}, largest seen {}); folding it made {} recipe entries\nProblems: {}\n",
            self.kills,
            self.torn_tails,
            self.last.read,
            self.last.skipped,
            self.last.torn,
            self.size,
            self.largest,
            self.folded_entries,
            if self.problems.is_empty() { "none".into() } else { self.problems.join("; ") }
        )
    }
}

pub fn run(prompts: &[String], o: &CrashOptions) -> Result<CrashReport, Box<dyn std::error::Error>> {
    let t = &o.target;
    std::fs::create_dir_all(&t.out)?;
    let log_path = t.out.join("misses.jsonl");
    let _ = std::fs::remove_file(&log_path);
    let mut rng = fastrand::Rng::with_seed(o.seed);
    let mut rep = CrashReport::default();
    let mut torn_before = 0;
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request { prompt: p.clone(), n_predict: t.n_predict, kind: Kind::Plain, label: "crash".into(), cache_prompt: false })
        .collect();
    for k in 0..o.kills {
        let arg = t.pack_arg(&format!(",misslog={},misslog_cap={}", log_path.display(), o.cap_bytes));
        let server = Server::start(&t.server("crash.log", Some(arg)))?;
        let (lo, hi) = o.kill_after;
        let after = lo + (hi - lo).mul_f64(rng.f64());
        let port = server.port();
        let limits = Limits { clients: o.clients, deadline: Duration::from_secs(3600), request_timeout: Duration::from_secs(30) };
        let size_before = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        std::thread::scope(|sc| {
            // The clients run until the kill cuts them off (their requests then fail, as a client's would).
            let start = rng.usize(..requests.len());
            let stream: Vec<Request> = requests.iter().cycle().skip(start).take(requests.len() * 4).cloned().collect();
            sc.spawn(move || load::run(port, &stream, limits));
            // Misses are written when a sequence begins: kill once this server has written (or, below the
            // cap, once a minute has passed), at a random moment of the stream of writes that follows.
            let t0 = Instant::now();
            while std::fs::metadata(&log_path).map_or(0, |m| m.len()) == size_before && t0.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(after);
            server.kill_hard();
        });
        rep.kills += 1;

        let mut misses = Vec::new();
        let r = match std::fs::File::open(&log_path) {
            Ok(f) => read_misses(std::io::BufReader::new(f), usize::MAX, &mut misses)?,
            Err(_) => ReadReport::default(),
        };
        let size = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        rep.largest = rep.largest.max(size);
        if size > o.cap_bytes + 1 {
            rep.problems.push(format!("kill {k}: the log is {size} bytes, over its cap of {}", o.cap_bytes));
        }
        // Each earlier torn tail was closed by the next writer and now reads as one skipped line.
        if r.skipped != torn_before {
            rep.problems.push(format!("kill {k}: {} lines skipped, {torn_before} torn tails closed before", r.skipped));
        }
        torn_before += r.torn;
        rep.torn_tails += r.torn;
        eprintln!("kill {}: log {size} bytes, {} records, {} skipped, {} torn", k + 1, r.read, r.skipped, r.torn);
        rep.last = r;
        rep.size = size;
    }

    let mut misses = Vec::new();
    if let Ok(f) = std::fs::File::open(&log_path) {
        read_misses(std::io::BufReader::new(f), usize::MAX, &mut misses)?;
    }
    let mut recipes = Recipes::new(AlignConfig::default(), None);
    fold_misses(&misses, 2, &mut recipes);
    // Folded into a pack of the served pack's tokenizer, as `compile --misses` would.
    let bytes = std::fs::read(&t.pack)?;
    let meta = Pack::from_slice(&bytes, &t.pack.display().to_string(), None, None)?.meta;
    rep.folded_entries = recipes.build(meta, &BuildConfig::default())?.entries().len();
    if misses.is_empty() {
        rep.problems.push("the log holds no miss at all: nothing was tested".into());
    }
    Ok(rep)
}
