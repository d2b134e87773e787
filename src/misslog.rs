//! The miss log: drafter misses as JSON lines, read back and folded into recipe candidates for
//! the next compile.
//!
//! One line per miss: `{"kind":"rejected","context":[151644,872,198],"token":13}`.
//!
//! Size bound: appending stops once the file would exceed its cap (the misses are dropped and
//! counted by the caller). Stopping rather than rotating keeps the writer trivial and the file
//! a single valid stream; compile consumes the log and starts a fresh one, so the cap only bites
//! when nobody compiles, and then older misses are as good as newer ones.
//!
//! Crash safety: a batch of misses goes out in one `write`, but a process killed mid-write (or a full
//! disk) can leave a torn last line. The reader never parses a line without its newline (it is skipped
//! and counted as torn), and the next writer first ends such a tail with a newline, so its records never
//! glue onto the fragment. Malformed, over-long or out-of-range lines are likewise skipped and counted.
//!
//! The file is created mode 0600: it holds token ids of the user's traffic and never leaves the machine.

use std::fs::OpenOptions;
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ahash::AHashMap;
use serde::{Deserialize, Serialize};

use crate::align::{Observation, Recipes};
use crate::draft::{Miss, MissKind, MISS_CONTEXT};
use crate::hash::literal_suffix_keys;
use crate::pack::EntryKind;

/// Longest line the reader accepts.
const MAX_LINE: usize = 1024;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LineKind {
    Rejected,
    Uncovered,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    kind: LineKind,
    context: Vec<i32>,
    token: i32,
}

/// An append-only miss log with a size cap.
pub struct MissLog {
    path: PathBuf,
    cap_bytes: u64,
    /// Set by the first failed write: logging stops, serving goes on.
    failed: bool,
}

impl MissLog {
    pub fn new(path: impl Into<PathBuf>, cap_bytes: u64) -> MissLog {
        MissLog {
            path: path.into(),
            cap_bytes,
            failed: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends what fits, for callers that must not fail (the plugin): the first error is reported once on
    /// stderr (the server's log), naming the file and the reason, and the log is not written again.
    pub fn write(&mut self, misses: &[Miss]) -> usize {
        if self.failed {
            return 0;
        }
        match self.append(misses) {
            Ok(n) => n,
            Err(e) => {
                self.failed = true;
                eprintln!("kolm-rsd: miss log {}: {e}; misses are no longer logged (serving goes on)", self.path.display());
                0
            }
        }
    }

    /// Appends as many of `misses` as fit under the cap, in one write; returns how many.
    pub fn append(&self, misses: &[Miss]) -> io::Result<usize> {
        // The default log lives in a cache directory that may not exist yet.
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut opts = OpenOptions::new();
        opts.create(true).read(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&self.path)?;
        let mut size = f.metadata()?.len();
        let mut buf = Vec::new();
        if size > 0 && !ends_with_newline(&mut f)? {
            // A torn tail from a killed writer: close it so the records below start a line of their own.
            buf.push(b'\n');
            size += 1;
        }
        let mut written = 0;
        for m in misses {
            let line = Line {
                kind: match m.kind {
                    MissKind::Rejected => LineKind::Rejected,
                    MissKind::Uncovered => LineKind::Uncovered,
                },
                context: m.context.clone(),
                token: m.token,
            };
            let start = buf.len();
            serde_json::to_writer(&mut buf, &line).map_err(io::Error::other)?;
            buf.push(b'\n');
            let len = (buf.len() - start) as u64;
            if size + len > self.cap_bytes {
                buf.truncate(start);
                break;
            }
            size += len;
            written += 1;
        }
        if written > 0 {
            f.write_all(&buf)?;
        }
        Ok(written)
    }
}

fn ends_with_newline(f: &mut std::fs::File) -> io::Result<bool> {
    let mut last = [0u8];
    f.seek(SeekFrom::End(-1))?;
    f.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// Lines read and lines skipped by [`read_misses`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    pub read: usize,
    /// Complete lines that were not a valid record.
    pub skipped: usize,
    /// A last line without its newline (a writer died mid-line): never parsed.
    pub torn: usize,
}

/// Reads up to `max_misses` misses from a log into `out`, skipping bad lines.
pub fn read_misses(
    mut r: impl BufRead,
    max_misses: usize,
    out: &mut Vec<Miss>,
) -> io::Result<ReadReport> {
    let mut report = ReadReport::default();
    let mut line = Vec::with_capacity(MAX_LINE + 1);
    while report.read < max_misses {
        line.clear();
        let n = r
            .by_ref()
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            if n <= MAX_LINE {
                // End of input inside a line: a torn record, whatever it looks like.
                report.torn += 1;
                break;
            }
            // Over-long line: skip the rest of it (counted as torn if the input ends first).
            let mut rest = Vec::new();
            r.read_until(b'\n', &mut rest)?;
            if rest.last() == Some(&b'\n') {
                report.skipped += 1;
            } else {
                report.torn += 1;
            }
            continue;
        }
        let text = &line[..line.len() - 1];
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Line>(text) {
            Ok(l)
                if l.token >= 0
                    && l.context.len() <= MISS_CONTEXT
                    && l.context.iter().all(|&t| t >= 0) =>
            {
                let kind = match l.kind {
                    LineKind::Rejected => MissKind::Rejected,
                    LineKind::Uncovered => MissKind::Uncovered,
                };
                out.push(Miss {
                    kind,
                    context: l.context,
                    token: l.token,
                });
                report.read += 1;
            }
            _ => report.skipped += 1,
        }
    }
    Ok(report)
}

/// Folds misses into recipe candidates: for each context suffix (1 to `recipes.max_n_literal()` tokens,
/// and, when the recipes collect shapes, each shape suffix up to their longest), a next token seen at least
/// `min_seen` times becomes a candidate with that count, and the other tokens seen after the same context
/// count against it. A shape key of the last n tokens depends on those n only, so the 8 tokens a miss keeps
/// give the keys the drafter computes at run time.
pub fn fold_misses(misses: &[Miss], min_seen: u32, recipes: &mut Recipes) {
    let max_lit = recipes.max_n_literal().min(MISS_CONTEXT);
    // (kind, n, key) → (parent key, all literal, [(token, times seen)])
    type Seen = (Option<u64>, bool, Vec<(u32, u32)>);
    let mut by_ctx: AHashMap<(EntryKind, u8, u64), Seen> = AHashMap::new();
    let mut keys = [0u64; MISS_CONTEXT];
    let mut count = |kind, i: usize, keys: &[u64], all_literal: bool, token: u32| {
        let slot = by_ctx
            .entry((kind, i as u8 + 1, keys[i]))
            .or_insert_with(|| (i.checked_sub(1).map(|p| keys[p]), all_literal, Vec::new()));
        match slot.2.iter_mut().find(|(t, _)| *t == token) {
            Some((_, c)) => *c += 1,
            None => slot.2.push((token, 1)),
        }
    };
    for m in misses {
        let Ok(token) = u32::try_from(m.token) else {
            continue;
        };
        let n = literal_suffix_keys(&m.context, max_lit, &mut keys);
        for i in 0..n {
            count(EntryKind::Literal, i, &keys, false, token);
        }
        if let Some((shapes, max_shape)) = recipes.shapes() {
            let n = shapes.suffix_keys(&m.context, max_shape.min(MISS_CONTEXT), &mut keys);
            let mut all_literal = true;
            for i in 0..n {
                all_literal &= shapes.always_literal(m.context[m.context.len() - 1 - i]);
                count(EntryKind::Shape, i, &keys, all_literal, token);
            }
        }
    }
    for ((kind, n, key), (parent, all_literal, tokens)) in by_ctx {
        let total: u32 = tokens.iter().map(|&(_, c)| c).sum();
        for &(token, count) in tokens.iter().filter(|&&(_, c)| c >= min_seen) {
            recipes.add(Observation { kind, n, key, parent, token, count, conflicts: total - count }, all_literal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::align::{AlignConfig, BuildConfig};
    use crate::index::Index;
    use crate::pack::tests::meta;
    use crate::shape::ShapeTable;

    fn miss(context: &[i32], token: i32) -> Miss {
        Miss {
            kind: MissKind::Rejected,
            context: context.to_vec(),
            token,
        }
    }

    fn temp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("kolm-misslog-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn round_trip_and_cap() {
        let path = temp("cap");
        let log = MissLog::new(&path, 100);
        let misses = [
            miss(&[1, 2, 3], 4),
            Miss {
                kind: MissKind::Uncovered,
                context: vec![],
                token: 0,
            },
            miss(&[9], 9),
        ];
        assert_eq!(log.append(&misses[..2]).unwrap(), 2);
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= 100);
        assert_eq!(
            log.append(&misses[2..]).unwrap(),
            0,
            "the next line would pass the cap"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        let mut back = Vec::new();
        let rep = read_misses(
            io::BufReader::new(std::fs::File::open(&path).unwrap()),
            100,
            &mut back,
        )
        .unwrap();
        assert_eq!(
            rep,
            ReadReport {
                read: 2,
                skipped: 0,
                torn: 0
            }
        );
        assert_eq!(back, misses[..2]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn reader_skips_bad_lines() {
        let long = format!(
            "{{\"kind\":\"rejected\",\"context\":[],\"token\":1{}}}\n",
            " ".repeat(2000)
        );
        let text = format!(
            "{}\nnot json\n{{\"kind\":\"rejected\",\"context\":[-1],\"token\":1}}\n{{\"kind\":\"rejected\",\"context\":[1,2,3,4,5,6,7,8,9],\"token\":1}}\n{long}\n{}\n{{\"kind\":\"uncov",
            r#"{"kind":"rejected","context":[5],"token":6}"#, r#"{"kind":"uncovered","context":[7],"token":8}"#
        );
        let mut out = Vec::new();
        let rep = read_misses(text.as_bytes(), 100, &mut out).unwrap();
        assert_eq!(
            rep,
            ReadReport {
                read: 2,
                skipped: 4,
                torn: 1
            }
        );
        assert_eq!(
            out[1],
            Miss {
                kind: MissKind::Uncovered,
                context: vec![7],
                token: 8
            }
        );
        let mut few = Vec::new();
        assert_eq!(read_misses(text.as_bytes(), 1, &mut few).unwrap().read, 1);
    }

    #[test]
    fn a_torn_last_line_is_never_a_record() {
        // Torn just before its newline, the fragment is valid JSON: still not a record.
        let text = "{\"kind\":\"rejected\",\"context\":[5],\"token\":6}\n{\"kind\":\"rejected\",\"context\":[7],\"token\":8}";
        let mut out = Vec::new();
        let rep = read_misses(text.as_bytes(), 100, &mut out).unwrap();
        assert_eq!(rep, ReadReport { read: 1, skipped: 0, torn: 1 });
        assert_eq!(out, [miss(&[5], 6)]);
        let over_long_and_torn = "x".repeat(MAX_LINE + 10);
        let rep = read_misses(over_long_and_torn.as_bytes(), 100, &mut out).unwrap();
        assert_eq!(rep, ReadReport { read: 0, skipped: 0, torn: 1 });
    }

    #[test]
    fn the_next_writer_closes_a_torn_tail() {
        let path = temp("torn");
        let log = MissLog::new(&path, 1 << 20);
        assert_eq!(log.append(&[miss(&[1], 2)]).unwrap(), 1);
        // A writer killed mid-line leaves a fragment behind.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"kind":"rejected","context":[3],"tok"#).unwrap();
        drop(f);
        assert_eq!(log.append(&[miss(&[4], 5), miss(&[6], 7)]).unwrap(), 2);
        let mut back = Vec::new();
        let rep = read_misses(io::BufReader::new(std::fs::File::open(&path).unwrap()), 100, &mut back).unwrap();
        assert_eq!(rep, ReadReport { read: 3, skipped: 1, torn: 0 });
        assert_eq!(back, [miss(&[1], 2), miss(&[4], 5), miss(&[6], 7)]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "the log holds the user's traffic: owner only");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_log_makes_its_directory() {
        let dir = temp("new-dir");
        let _ = std::fs::remove_dir_all(&dir);
        let log = MissLog::new(dir.join("misses").join("m.jsonl"), 1 << 20);
        assert_eq!(log.append(&[miss(&[1], 2)]).unwrap(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_log_stops_logging_without_failing_the_caller() {
        let dir = temp("not-a-dir");
        std::fs::write(&dir, b"a file where a directory should be").unwrap();
        let mut log = MissLog::new(dir.join("misses.jsonl"), 1 << 20);
        assert_eq!(log.write(&[miss(&[1], 2)]), 0);
        assert!(log.failed, "the first error turns logging off");
        assert_eq!(log.write(&[miss(&[1], 2)]), 0);
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn misses_seen_often_enough_become_entries() {
        let mut misses = vec![miss(&[1, 2, 3], 4); 3];
        misses.push(miss(&[7, 8], 9)); // seen once: below min_seen
        misses.extend(vec![miss(&[5, 6], 1); 3]);
        misses.extend(vec![miss(&[0, 6], 2); 3]); // "6" is ambiguous, "5 6" and "0 6" are not
        let mut r = Recipes::new(AlignConfig::default(), None);
        fold_misses(&misses, 2, &mut r);
        let idx = Index::new(&r.build(meta(), &BuildConfig::default()).unwrap(), None);
        assert_eq!(idx.lookup(&[1, 2, 3]).map(|h| h.token), Some(4));
        assert_eq!(
            idx.lookup(&[3]).map(|h| (h.token, h.n)),
            Some((4, 1)),
            "shortest reliable suffix kept"
        );
        assert_eq!(idx.lookup(&[7, 8]), None);
        assert_eq!(idx.lookup(&[5, 6]).map(|h| h.token), Some(1));
        assert_eq!(idx.lookup(&[0, 6]).map(|h| h.token), Some(2));
        assert_eq!(idx.lookup(&[6]), None);
    }

    #[test]
    fn misses_also_become_shape_entries() {
        // Vocabulary: `{"age": ` then digits; a miss after one number predicts the same `,` after another.
        let texts: Vec<&[u8]> = vec![b"{", b"\"", b"age", b"\":", b" ", b"42", b"17", b",", b"x"];
        let shapes = ShapeTable::from_token_texts(&texts);
        let mut misses = vec![miss(&[0, 1, 2, 3, 4, 5], 7); 2];
        misses.push(miss(&[0, 1, 2, 3, 4, 5], 7));
        let mut r = Recipes::new(AlignConfig::default(), Some(shapes.clone()));
        fold_misses(&misses, 2, &mut r);
        let pack = r.build(meta(), &BuildConfig::default()).unwrap();
        assert!(pack.entries().iter().any(|e| e.kind == EntryKind::Shape), "no shape entry from misses");
        let idx = Index::new(&pack, Some(shapes));
        // 17 was never seen: only the shape (a number after `"age": `) can answer.
        let hit = idx.lookup(&[0, 1, 2, 3, 4, 6]).expect("shape lookup");
        assert_eq!((hit.token, hit.kind), (7, EntryKind::Shape));
    }
}
