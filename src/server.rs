//! Drives a real llama-server on 127.0.0.1: start it (with or without the plugin), send completions
//! over HTTP, read its timings, stop it. Used by `kolm-rsd demo`/`bench` and by the tests.

use serde_json::{json, Value};
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The patched llama-server built by build.rs from the pinned tree, or `KOLM_LLAMA_SERVER` (scripts/sanitize
/// names a wrapper that preloads the ASan runtime, so an instrumented plugin can be loaded).
pub fn llama_server_path() -> PathBuf {
    match std::env::var_os("KOLM_LLAMA_SERVER") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("KOLM_LLAMA_BIN_DIR")).join("llama-server"),
    }
}

/// `libkolm_rsd.so` next to the running executable (CLI) or one level up (test binaries in deps/).
pub fn plugin_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let name = format!("{}kolm_rsd{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    exe.ancestors().skip(1).take(2).map(|d| d.join(&name)).find(|p| p.is_file())
}

/// Pause before a request to one of several servers started side by side, so the other servers' worker threads
/// (which spin a while after their last request) have stopped competing for the cores.
pub const SETTLE: Duration = Duration::from_millis(60);

/// Merges the fields of the JSON object `extra` into the JSON object `body`.
fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

/// How to start one server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub model: PathBuf,
    pub plugin: Option<PathBuf>,
    pub plugin_arg: Option<String>,
    /// Any other llama-server flags (e.g. `--spec-type ngram-mod`).
    pub extra: Vec<String>,
    pub n_parallel: u32,
    pub n_ctx: u32,
    pub threads: Option<u32>,
    /// Where llama-server's own log goes.
    pub log: PathBuf,
    /// Environment variables set for the server (e.g. the call log of patch 0022).
    pub env: Vec<(String, PathBuf)>,
}

impl ServerOptions {
    pub fn new(model: &Path, log: &Path) -> Self {
        ServerOptions {
            model: model.to_path_buf(),
            plugin: None,
            plugin_arg: None,
            extra: vec![],
            n_parallel: 1,
            n_ctx: 4096,
            threads: None,
            log: log.to_path_buf(),
            env: Vec::new(),
        }
    }
}

/// What one completion returned.
#[derive(Clone, Debug, Default)]
pub struct Completion {
    pub content: String,
    pub predicted_n: u64,
    pub predicted_per_second: f64,
    pub predicted_ms: f64,
    pub draft_n: u64,
    pub draft_n_accepted: u64,
    /// (accepted, rejected) predicted tokens from `completion_tokens_details`: present when the request
    /// carried a `prediction` (patch 0009).
    pub prediction_tokens: Option<(u64, u64)>,
    pub wall: Duration,
}

impl Completion {
    /// Reads a `/completion` or `/v1/chat/completions` response.
    fn from_json(v: &Value, wall: Duration) -> Completion {
        let t = &v["timings"];
        let content = v["content"].as_str().or_else(|| v["choices"][0]["message"]["content"].as_str());
        let details = v["usage"].get("completion_tokens_details").or_else(|| v.get("completion_tokens_details"));
        let count = |d: &Value, k: &str| d[k].as_u64().unwrap_or(0);
        Completion {
            content: content.unwrap_or_default().to_string(),
            predicted_n: t["predicted_n"].as_u64().unwrap_or(0),
            predicted_per_second: t["predicted_per_second"].as_f64().unwrap_or(0.0),
            predicted_ms: t["predicted_ms"].as_f64().unwrap_or(0.0),
            draft_n: t["draft_n"].as_u64().unwrap_or(0),
            draft_n_accepted: t["draft_n_accepted"].as_u64().unwrap_or(0),
            prediction_tokens: details.map(|d| (count(d, "accepted_prediction_tokens"), count(d, "rejected_prediction_tokens"))),
            wall,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("llama-server did not start: {0}")]
    Start(String),
    #[error("llama-server request failed: {0}")]
    Http(String),
}

/// A running llama-server; stopped (killed and reaped) on drop.
pub struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
    /// Reaped already (stopped, or killed on purpose): nothing left to do or to report on drop.
    reaped: bool,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Server {
    pub fn start(opts: &ServerOptions) -> Result<Server, ServerError> {
        let port = free_port().map_err(|e| ServerError::Start(format!("no free port: {e}")))?;
        let log = std::fs::File::create(&opts.log).map_err(|e| ServerError::Start(format!("{}: {e}", opts.log.display())))?;
        let mut cmd = Command::new(llama_server_path());
        cmd.arg("-m").arg(&opts.model);
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        cmd.args(["-c", &(opts.n_ctx * opts.n_parallel).to_string(), "-np", &opts.n_parallel.to_string()]);
        cmd.args(["--no-webui", "--metrics"]);
        if let Some(t) = opts.threads {
            cmd.args(["-t", &t.to_string()]);
        }
        if let Some(p) = &opts.plugin {
            cmd.arg("--spec-plugin").arg(p);
        }
        if let Some(a) = &opts.plugin_arg {
            cmd.arg("--spec-plugin-arg").arg(a);
        }
        cmd.args(&opts.extra);
        cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null()).stdout(log.try_clone().map_err(|e| ServerError::Start(e.to_string()))?).stderr(log);
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe and touches only the child being set up: the server then
            // gets SIGTERM when its parent dies, so no llama-server outlives a killed test or CLI.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|e| ServerError::Start(format!("{}: {e}", llama_server_path().display())))?;
        let mut server = Server { child, port, log: opts.log.clone(), reaped: false };
        if let Err(e) = server.wait_ready(Duration::from_secs(180)) {
            // The error carries the log's tail; a server that never served has nothing to save.
            server.kill_hard();
            return Err(e);
        }
        Ok(server)
    }

    /// Stops the server gracefully (SIGTERM, so the plugin is freed and logs its summary), killing it
    /// after 10 s.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// A server that had died, or that SIGTERM did not stop, is said on stderr with its log: the plugin's summary
    /// and what it saves at exit are then missing, and a test that reads them should say why.
    fn shutdown(&mut self) {
        if std::mem::replace(&mut self.reaped, true) {
            return;
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            if !status.success() {
                eprintln!("llama-server (pid {}) had already ended: {status}; log {}", self.child.id(), self.log.display());
            }
            return;
        }
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet (try_wait said so).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(status)) = self.child.try_wait() {
                if !status.success() {
                    eprintln!("llama-server (pid {}) ended on SIGTERM with {status}; log {}", self.child.id(), self.log.display());
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("llama-server (pid {}) did not end within 10 s of SIGTERM: killed; log {}", self.child.id(), self.log.display());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Alive and answering `/health` with 200.
    pub fn healthy(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
            && ureq::get(&self.url("/health")).timeout(Duration::from_secs(10)).call().is_ok_and(|r| r.status() == 200)
    }

    /// Resident memory of the server process (VmRSS), KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(&self.child.id().to_string())
    }

    /// SIGKILL, as a crash or an OOM killer would: no shutdown code of the server or the plugin runs.
    pub fn kill_hard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// The last lines of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), ServerError> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(ServerError::Start(format!("exited with {status}:\n{}", log_tail(&self.log))));
            }
            if let Ok(r) = ureq::get(&self.url("/health")).timeout(Duration::from_secs(2)).call() {
                if r.status() == 200 {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(ServerError::Start(format!("not ready after {limit:?}:\n{}", log_tail(&self.log))))
    }

    /// A greedy completion of `prompt` (already templated text), `n_predict` tokens at most.
    pub fn complete(&self, prompt: &str, n_predict: u32) -> Result<Completion, ServerError> {
        self.complete_with(prompt, n_predict, json!({}))
    }

    /// The same with `extra` fields merged into the request, e.g. `{"prediction": {...}}`.
    pub fn complete_with(&self, prompt: &str, n_predict: u32, extra: Value) -> Result<Completion, ServerError> {
        let mut body = json!({
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0.0,
            "seed": 0,
            "cache_prompt": false,
        });
        merge(&mut body, extra);
        self.request(body)
    }

    /// A completion with explicit request fields (sampling tests, ...).
    pub fn request(&self, body: Value) -> Result<Completion, ServerError> {
        self.send("/completion", body)
    }

    /// A greedy OpenAI-style chat completion of one user message (`/v1/chat/completions`, the server applies
    /// the chat template), with `extra` fields merged into the request, e.g. `{"prediction": {...}}`.
    pub fn chat(&self, user: &str, n_predict: u32, extra: Value) -> Result<Completion, ServerError> {
        let mut body = json!({
            "messages": [{"role": "user", "content": user}],
            "max_tokens": n_predict,
            "temperature": 0.0,
            "seed": 0,
            "cache_prompt": false,
        });
        merge(&mut body, extra);
        self.send("/v1/chat/completions", body)
    }

    fn send(&self, path: &str, body: Value) -> Result<Completion, ServerError> {
        let t0 = Instant::now();
        match self.post(path, body)? {
            (200, v) => Ok(Completion::from_json(&v, t0.elapsed())),
            (status, v) => Err(ServerError::Http(format!("status {status}: {v}\n{}", self.log_tail()))),
        }
    }

    /// POSTs `body` to `path` and returns the status and the JSON body, errors (4xx, 5xx) included.
    pub fn post(&self, path: &str, body: Value) -> Result<(u16, Value), ServerError> {
        let resp = match ureq::post(&self.url(path)).timeout(Duration::from_secs(600)).send_json(body) {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(ServerError::Http(format!("{e}\n{}", self.log_tail()))),
        };
        let status = resp.status();
        let v = resp.into_json().map_err(|e| ServerError::Http(e.to_string()))?;
        Ok((status, v))
    }
}

/// Resident memory (VmRSS, KiB) of process `pid` (`self`: this one), from `/proc` (Linux; None elsewhere).
pub fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The kolm-rsd plugin's shutdown summary line in a llama-server log ("" when absent; it is written when
/// the server stops gracefully).
pub fn plugin_summary(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .rfind(|l| l.starts_with("kolm-rsd: ") && l.contains(" calls, "))
        .unwrap_or_default()
        .to_string()
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The last lines of a server log, for error messages.
pub fn log_tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
