//! Greedy continuations kept in a file between replays: recording them is what a replay spends its minutes on
//! (24 code edits × 320 tokens of Qwen2.5-Coder-1.5B: about three minutes here), the replay itself a second. A
//! drafter change is then tried on the same recordings in seconds, as often as it takes.
//!
//! A recording is found again by its model (file name and size: two models of one tokenizer answer
//! differently), its prompt's tokens and the token budget it was recorded with; anything else is recorded anew.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The file's contents.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Recordings {
    entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    model: String,
    tokens: usize,
    prompt: Vec<i32>,
    output: Vec<i32>,
}

impl Entry {
    fn is(&self, model: &str, tokens: usize, prompt: &[i32]) -> bool {
        self.model == model && self.tokens == tokens && self.prompt == prompt
    }
}

impl Recordings {
    /// The recordings in `path`; none if it does not exist yet. A file that cannot be read or parsed is an error
    /// that names it: it is the user's, and overwriting it would lose it.
    pub fn load(path: &Path) -> Result<Recordings, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("{}: not a recordings file: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Recordings::default()),
            Err(e) => Err(format!("{}: cannot read the recordings: {e}", path.display())),
        }
    }

    /// Written whole to a temporary file and renamed over `path`.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let bytes = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        crate::pack::write_atomic(path, &bytes).map_err(|e| format!("{}: cannot write the recordings: {e}", path.display()))
    }

    /// The continuation of `prompt` that `model` recorded with a budget of `tokens`.
    pub fn get(&self, model: &str, tokens: usize, prompt: &[i32]) -> Option<&[i32]> {
        self.entries.iter().find(|e| e.is(model, tokens, prompt)).map(|e| e.output.as_slice())
    }

    /// Keeps a new recording (replacing one under the same key).
    pub fn put(&mut self, model: &str, tokens: usize, prompt: &[i32], output: &[i32]) {
        self.entries.retain(|e| !e.is(model, tokens, prompt));
        self.entries.push(Entry { model: model.into(), tokens, prompt: prompt.into(), output: output.into() });
    }
}

/// How a model is named in the file: its file name and size.
pub fn model_key(path: &Path) -> Result<String, String> {
    let len = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    Ok(format!("{name} ({len} bytes)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_is_found_by_model_budget_and_prompt_and_survives_a_save() {
        let dir = std::env::temp_dir().join(format!("kolm-recordings-{}-a", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rec.json");
        let mut r = Recordings::load(&path).unwrap();
        assert_eq!(r.get("m", 8, &[1, 2]), None);
        r.put("m", 8, &[1, 2], &[3, 4]);
        r.put("m", 8, &[1, 2], &[3, 5]);
        r.put("n", 8, &[1, 2], &[6]);
        r.save(&path).unwrap();
        let r = Recordings::load(&path).unwrap();
        assert_eq!(r.get("m", 8, &[1, 2]), Some(&[3, 5][..]));
        assert_eq!(r.get("n", 8, &[1, 2]), Some(&[6][..]));
        assert_eq!(r.get("m", 16, &[1, 2]), None);
        assert_eq!(r.get("m", 8, &[1]), None);
        assert_eq!(r.entries.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_not_recordings_is_an_error_that_names_it() {
        let dir = std::env::temp_dir().join(format!("kolm-recordings-{}-b", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pack.json");
        std::fs::write(&path, b"{\"entries\": 3}").unwrap();
        let e = Recordings::load(&path).unwrap_err();
        assert!(e.contains("pack.json") && e.contains("not a recordings file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
