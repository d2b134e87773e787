//! Memory over many requests: llama-server's resident memory with and without the plugin, sampled after
//! every `every` requests of the same stream, and the plugin's own heap (its shutdown line).

use crate::load::{self, Kind, Limits, Outcome, Request};
use crate::server::{plugin_summary, Server, ServerOptions};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct SoakOptions {
    pub model: PathBuf,
    pub pack: PathBuf,
    pub plugin: PathBuf,
    pub requests: usize,
    pub clients: usize,
    pub n_parallel: u32,
    pub slot_ctx: u32,
    pub n_predict: i64,
    /// Resident memory is read after every this many requests.
    pub every: usize,
    pub request_timeout: Duration,
    pub out: PathBuf,
}

/// One server's resident memory over the run.
pub struct Curve {
    pub name: String,
    /// (requests served, RSS KiB).
    pub points: Vec<(usize, u64)>,
    pub failed: usize,
    /// The plugin's shutdown line (its heap), when it ran.
    pub summary: String,
}

impl Curve {
    /// Least-squares slope of RSS over the second half of the run, KiB per 100 requests: a leak shows as
    /// a steady climb after the warm-up has filled the caches.
    pub fn trend(&self) -> f64 {
        let tail = &self.points[self.points.len() / 2..];
        if tail.len() < 2 {
            return 0.0;
        }
        let n = tail.len() as f64;
        let mx = tail.iter().map(|p| p.0 as f64).sum::<f64>() / n;
        let my = tail.iter().map(|p| p.1 as f64).sum::<f64>() / n;
        let sxy: f64 = tail.iter().map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my)).sum();
        let sxx: f64 = tail.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
        100.0 * sxy / sxx.max(1e-9)
    }
}

/// Serves `o.requests` greedy requests (a quarter streamed) to plain llama-server, then to the one with the
/// plugin, reading RSS as it goes.
pub fn run(prompts: &[String], o: &SoakOptions) -> Result<Vec<Curve>, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&o.out)?;
    let requests: Vec<Request> = (0..o.requests)
        .map(|i| Request {
            prompt: prompts[i % prompts.len()].clone(),
            n_predict: o.n_predict,
            kind: if i % 4 == 1 { Kind::Stream } else { Kind::Plain },
            label: "soak".into(),
        })
        .collect();
    let limits = Limits { clients: o.clients, deadline: Duration::from_secs(24 * 3600), request_timeout: o.request_timeout };
    let mut curves = Vec::new();
    for with_plugin in [false, true] {
        let name = if with_plugin { "kolm-rsd" } else { "plain" };
        let log = o.out.join(format!("soak-{name}.log"));
        let mut s = ServerOptions::new(&o.model, &log);
        s.n_parallel = o.n_parallel;
        s.n_ctx = o.slot_ctx;
        if with_plugin {
            s.plugin = Some(o.plugin.clone());
            s.plugin_arg = Some(format!("pack={}", o.pack.display()));
        }
        let server = Server::start(&s)?;
        let mut curve = Curve { name: name.into(), points: vec![(0, server.rss_kib().unwrap_or(0))], failed: 0, summary: String::new() };
        for chunk in requests.chunks(o.every.max(1)) {
            let (records, _) = load::run(server.port(), chunk, limits);
            curve.failed += records.iter().filter(|r| !matches!(r.outcome, Outcome::Done { .. })).count();
            let done = curve.points.last().map_or(0, |p| p.0) + chunk.len();
            curve.points.push((done, server.rss_kib().unwrap_or(0)));
        }
        server.stop();
        curve.summary = plugin_summary(&log);
        curves.push(curve);
    }
    Ok(curves)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trend_is_the_slope_of_the_second_half() {
        let flat = Curve { name: "f".into(), points: (0..10).map(|i| (i * 100, if i < 3 { 1000 + i as u64 * 500 } else { 2500 })).collect(), failed: 0, summary: String::new() };
        assert_eq!(flat.trend(), 0.0, "warm-up growth in the first half is not a trend");
        let leak = Curve { name: "l".into(), points: (0..10).map(|i| (i * 100, 1000 + 40 * i as u64)).collect(), failed: 0, summary: String::new() };
        assert!((leak.trend() - 40.0).abs() < 1e-9);
    }
}
