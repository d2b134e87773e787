//! Where the engine keeps its live index across restarts: loaded at start, saved every so often between
//! requests (the copy taken in the server thread, the writing on a thread of its own) and at shutdown, with
//! the drafter's learned acceptance per class.

use crate::draft::Drafter;
use crate::live::file::{save, Learned, Saved};
use crate::live::Live;
use crate::pack::ModelInfo;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Saves at most this often while serving (and once more at shutdown).
pub const SAVE_EVERY: Duration = Duration::from_secs(60);

/// `~/.cache/kolm-rsd/live/<model stem>.json`: the model's directory may be read-only or shared, and the
/// table holds the user's traffic, which stays on this machine.
pub fn default_live_path(model_path: &Path) -> PathBuf {
    super::in_cache(model_path, "live", "json")
}

/// The file of one engine's live index.
pub struct Keeper {
    path: PathBuf,
    tokenizer: String,
    model: ModelInfo,
    /// Answer tokens counted before this run (from the file).
    fed_before: u64,
    /// Answer tokens of this run already in the file.
    fed_saved: u64,
    last_save: Instant,
    writing: Option<JoinHandle<std::io::Result<()>>>,
    /// A save failed: said once, not retried.
    failed: bool,
    /// The acceptance the file kept, until the drafter takes it.
    learned: Option<Learned>,
}

impl Keeper {
    /// Fills `live` from `path` when it holds a table for this tokenizer. A file that cannot be used is moved
    /// aside to `<path>.bad` (nothing is lost, and this run starts empty and saves anew); the returned line says
    /// so, for the server log.
    pub fn open(path: PathBuf, tokenizer: &str, model: ModelInfo, n_vocab: u32, live: &mut Live) -> (Keeper, Option<String>) {
        let mut keeper = Keeper {
            path,
            tokenizer: tokenizer.into(),
            model,
            fed_before: 0,
            fed_saved: 0,
            last_save: Instant::now(),
            writing: None,
            failed: false,
            learned: None,
        };
        let note = match std::fs::read(&keeper.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                keeper.failed = true;
                Some(format!("live index {}: {e}; it is neither read nor saved this run", keeper.path.display()))
            }
            Ok(bytes) => match Saved::from_slice(&bytes, &keeper.path.display().to_string(), Some(tokenizer), Some(n_vocab)) {
                Ok(saved) => {
                    saved.restore_into(live);
                    keeper.fed_before = saved.fed;
                    keeper.learned = saved.learned;
                    None
                }
                Err(e) => {
                    let aside = keeper.path.with_extension("json.bad");
                    Some(match std::fs::rename(&keeper.path, &aside) {
                        Ok(()) => format!("{e}; moved to {} and starting empty", aside.display()),
                        Err(r) => {
                            keeper.failed = true;
                            format!("{e}; could not move it aside ({r}), so it is left as it is and not saved over")
                        }
                    })
                }
            },
        };
        (keeper, note)
    }

    /// The acceptance the file kept (once).
    pub fn take_learned(&mut self) -> Option<Learned> {
        self.learned.take()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answer tokens the table has counted, over all runs.
    pub fn fed_total(&self, live: &Live) -> u64 {
        self.fed_before + live.fed()
    }

    /// Saves `d`'s live index in the background when the last save is `SAVE_EVERY` old and there is something new.
    pub fn tick(&mut self, d: &Drafter) {
        let Some(live) = d.live() else { return };
        if self.last_save.elapsed() >= SAVE_EVERY && live.fed() > self.fed_saved && self.writing.as_ref().is_none_or(|w| w.is_finished()) {
            self.start(d, live, true);
        }
    }

    /// Saves now and waits (at shutdown).
    pub fn finish(&mut self, d: &Drafter) {
        self.join();
        if let Some(live) = d.live().filter(|l| l.fed() > self.fed_saved) {
            self.start(d, live, false);
            self.join();
        }
    }

    fn start(&mut self, d: &Drafter, live: &Live, background: bool) {
        self.join();
        if self.failed {
            return;
        }
        let saved = Saved::of(live, Some(d.learned()), &self.tokenizer, &self.model, self.fed_before);
        self.fed_saved = live.fed();
        self.last_save = Instant::now();
        let path = self.path.clone();
        let write = move || save(&path, &saved.to_vec());
        if background {
            self.writing = Some(std::thread::spawn(write));
        } else {
            let r = write();
            self.report(r);
        }
    }

    fn join(&mut self) {
        if let Some(w) = self.writing.take() {
            let r = w.join().unwrap_or_else(|_| Err(std::io::Error::other("the writer panicked")));
            self.report(r);
        }
    }

    fn report(&mut self, r: std::io::Result<()>) {
        if let Err(e) = r {
            self.failed = true;
            eprintln!("kolm-rsd: live index {}: {e}; it is no longer saved (serving goes on)", self.path.display());
        }
    }
}
