//! Memory over many requests: llama-server's resident memory with and without the plugin, sampled after
//! every `every` requests of the same stream, and the plugin's own heap (its shutdown line).

use crate::load::{self, Kind, Limits, Outcome, Request};
use super::Target;
use crate::server::{plugin_summary, Server};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct SoakOptions {
    pub target: Target,
    pub requests: usize,
    pub clients: usize,
    /// Resident memory is read after every this many requests.
    pub every: usize,
    pub request_timeout: Duration,
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
    let t = &o.target;
    std::fs::create_dir_all(&t.out)?;
    let requests: Vec<Request> = (0..o.requests)
        .map(|i| Request {
            prompt: prompts[i % prompts.len()].clone(),
            n_predict: t.n_predict,
            kind: if i % 4 == 1 { Kind::Stream } else { Kind::Plain },
            label: "soak".into(),
            cache_prompt: false,
        })
        .collect();
    let limits = Limits { clients: o.clients, deadline: Duration::from_secs(24 * 3600), request_timeout: o.request_timeout };
    let mut curves = Vec::new();
    for with_plugin in [false, true] {
        let name = if with_plugin { "kolm-rsd" } else { "plain" };
        let log = format!("soak-{name}.log");
        let server = Server::start(&t.server(&log, with_plugin.then(|| t.pack_arg(""))))?;
        let mut curve = Curve { name: name.into(), points: vec![(0, server.rss_kib().unwrap_or(0))], failed: 0, summary: String::new() };
        for chunk in requests.chunks(o.every.max(1)) {
            let (records, _) = load::run(server.port(), chunk, limits);
            curve.failed += records.iter().filter(|r| !matches!(r.outcome, Outcome::Done { .. })).count();
            let done = curve.points.last().map_or(0, |p| p.0) + chunk.len();
            curve.points.push((done, server.rss_kib().unwrap_or(0)));
        }
        server.stop();
        curve.summary = plugin_summary(&t.out.join(&log));
        curves.push(curve);
    }
    Ok(curves)
}

/// The curves side by side (MiB), then each one's trend and the plugin's heap.
pub fn markdown(curves: &[Curve]) -> String {
    let mut out = String::from("| requests |");
    for c in curves {
        out.push_str(&format!(" {} RSS MiB |", c.name));
    }
    out.push_str("\n|---:|");
    out.push_str(&"---:|".repeat(curves.len()));
    out.push('\n');
    for (i, p) in curves[0].points.iter().enumerate() {
        out.push_str(&format!("| {} |", p.0));
        for c in curves {
            out.push_str(&c.points.get(i).map_or(" |".into(), |q| format!(" {:.1} |", q.1 as f64 / 1024.0)));
        }
        out.push('\n');
    }
    for c in curves {
        out.push_str(&format!(
            "\n{}: trend over the second half {:+.1} KiB per 100 requests, {} requests not completed{}\n",
            c.name,
            c.trend(),
            c.failed,
            if c.summary.is_empty() { String::new() } else { format!("; at shutdown: `{}`", c.summary) }
        ));
    }
    out
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
