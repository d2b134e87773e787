//! Progress that shows in a pipe as well as in a terminal. On a terminal, an indicatif bar redrawn in place;
//! anywhere else (a CI log, `| tee`), indicatif draws nothing, so the same line is printed whole: at once when
//! its stage (the text before the bar) changes, and otherwise at most every [`EVERY`]; lines printed above the
//! bar show as they come, each on its own line.

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a line is printed for the same stage when not on a terminal.
pub const EVERY: Duration = Duration::from_secs(30);

/// A bar of `len` steps (0: set later) in `template` (indicatif's syntax; `{msg}` first names the stage).
/// `{eta}` is the elapsed time per step so far times the steps left: indicatif's own estimate forgets all but the
/// last seconds, so with steps minutes apart it read 584942417355 years.
pub fn bar(len: u64, template: &str, what: &str) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::term_like_with_hz(Box::new(Lines::to(Box::new(std::io::stderr()))), 1)
    };
    let b = ProgressBar::with_draw_target(Some(len), target);
    let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> ");
    b.set_style(style.with_key("eta", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
        let _ = match linear_eta(s.elapsed(), s.pos(), s.len()) {
            Some(eta) => write!(w, "{}", HumanDuration(eta)),
            None => write!(w, "?"),
        };
    }));
    b.set_message(what.to_string());
    b
}

/// Time left if every step left takes as long as the steps done so far did on average; None before the first.
fn linear_eta(elapsed: Duration, pos: u64, len: Option<u64>) -> Option<Duration> {
    let len = len?;
    (pos > 0).then(|| elapsed.mul_f64(len.saturating_sub(pos) as f64 / pos as f64))
}

/// A terminal stand-in that turns indicatif's redraws into whole lines, throttled.
struct Lines {
    state: Mutex<LineState>,
    out: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines").field("state", &self.state).finish_non_exhaustive()
    }
}

impl Lines {
    fn to(out: Box<dyn Write + Send>) -> Lines {
        Lines { state: Mutex::default(), out: Mutex::new(out) }
    }

    fn print(&self, line: &str) {
        let _ = writeln!(self.out.lock().unwrap_or_else(|p| p.into_inner()), "{}", line.trim_end());
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LineState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, Default)]
struct LineState {
    line: String,
    stage: String,
    printed: Option<Instant>,
}

impl LineState {
    /// Whether the line just drawn is worth a line of its own. A bar that has neither work nor progress yet
    /// (`0/0`, its length not known) says nothing.
    fn due(&mut self, now: Instant) -> bool {
        let stage = self.line.split('[').next().unwrap_or("").trim().to_string();
        let due = stage != self.stage || self.printed.is_none_or(|t| now.duration_since(t) >= EVERY);
        if due && !self.line.trim().is_empty() && !self.line.contains(" 0/0 ") {
            self.stage = stage;
            self.printed = Some(now);
            return true;
        }
        false
    }
}

impl TermLike for Lines {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    /// indicatif draws each line with `write_str` and ends every line but the last (the bar's) with
    /// `write_line("")`: a line ended so was printed above the bar (`println`) and always shows.
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        let line = {
            let mut st = self.state();
            st.line.push_str(s);
            std::mem::take(&mut st.line)
        };
        if !line.trim().is_empty() {
            self.print(&line);
        }
        Ok(())
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.state().line.push_str(s);
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        let line = {
            let mut st = self.state();
            let due = st.due(Instant::now());
            let line = std::mem::take(&mut st.line);
            due.then_some(line)
        };
        if let Some(line) = line {
            self.print(&line);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_is_the_mean_step_times_the_steps_left() {
        let m = Duration::from_secs(60);
        assert_eq!(linear_eta(6 * m, 0, Some(7)), None, "nothing done: unknown");
        assert_eq!(linear_eta(6 * m, 2, Some(7)), Some(15 * m));
        assert_eq!(linear_eta(6 * m, 7, Some(7)), Some(Duration::ZERO));
        assert_eq!(linear_eta(6 * m, 9, Some(7)), Some(Duration::ZERO), "past the end");
        assert_eq!(linear_eta(6 * m, 2, None), None);
    }

    #[test]
    fn a_line_per_stage_and_one_every_thirty_seconds() {
        let mut st = LineState::default();
        let t0 = Instant::now();
        let mut at = |line: &str, secs: u64| {
            st.line = line.into();
            st.due(t0 + Duration::from_secs(secs))
        };
        assert!(at("compile [=>  ] 1/9 runs", 0), "the first draw");
        assert!(!at("compile [==> ] 2/9 runs", 5), "the same stage, soon after");
        assert!(at("held out [   ] 0/3 runs", 6), "a new stage");
        assert!(!at("held out [=  ] 1/3 runs", 30));
        assert!(at("held out [== ] 2/3 runs", 36), "thirty seconds on");
        assert!(!at("   ", 100), "nothing to say");
        assert!(!at("bench [=====] 0/0 requests", 200), "no work known yet");
    }

    /// A `Write` whose bytes the test reads back.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_printed_above_the_bar_keep_their_own_lines() {
        let out = Shared::default();
        let b = ProgressBar::with_draw_target(Some(4), ProgressDrawTarget::term_like_with_hz(Box::new(Lines::to(Box::new(out.clone()))), 1));
        b.set_style(ProgressStyle::with_template("{msg} [{bar:10}] {pos}/{len} runs").unwrap());
        b.set_message("compile");
        b.println("== the model");
        b.inc(1);
        b.println("-- the workload");
        b.finish();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"== the model"), "{text:?}");
        assert!(lines.contains(&"-- the workload"), "{text:?}");
        assert!(lines.iter().all(|l| !l.contains("runs") || l.starts_with("compile [")), "a bar glued to a printed line: {text:?}");
        assert!(lines.iter().any(|l| l.starts_with("compile [") && l.contains("runs")), "{text:?}");
    }
}
