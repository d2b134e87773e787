//! Progress that shows in a pipe as well as in a terminal. On a terminal, an indicatif bar redrawn in place;
//! anywhere else (a CI log, `| tee`), indicatif draws nothing, so the same line is printed whole: at once when
//! its stage (the text before the bar) changes, and otherwise at most every [`EVERY`]; lines printed above the
//! bar show as they come.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a line is printed for the same stage when not on a terminal.
pub const EVERY: Duration = Duration::from_secs(30);

/// A bar of `len` steps (0: set later) in `template` (indicatif's syntax; `{msg}` first names the stage).
pub fn bar(len: u64, template: &str, what: &str) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::term_like_with_hz(Box::new(Lines::default()), 1)
    };
    let b = ProgressBar::with_draw_target(Some(len), target);
    b.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "));
    b.set_message(what.to_string());
    b
}

/// A terminal stand-in that turns indicatif's redraws into whole lines on stderr, throttled.
#[derive(Debug, Default)]
struct Lines {
    state: Mutex<LineState>,
}

#[derive(Debug, Default)]
struct LineState {
    line: String,
    stage: String,
    printed: Option<Instant>,
}

impl LineState {
    /// Whether the line just drawn is worth a line of its own.
    fn due(&mut self, now: Instant) -> bool {
        let stage = self.line.split('[').next().unwrap_or("").trim().to_string();
        let due = stage != self.stage || self.printed.is_none_or(|t| now.duration_since(t) >= EVERY);
        if due && !self.line.trim().is_empty() {
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
    /// indicatif writes the lines printed above the bar (`println`) whole, and the bar's own line last with
    /// `write_str`: the former always show.
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        if !s.trim().is_empty() {
            let _ = writeln!(std::io::stderr(), "{}", s.trim_end());
        }
        Ok(())
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).line.push_str(s);
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.due(Instant::now()) {
            let _ = writeln!(std::io::stderr(), "{}", st.line.trim_end());
        }
        st.line.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
