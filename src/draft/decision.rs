//! What the control did with a sequence's chain in one step, and why: read by a step log, where a round whose
//! drafting stops halfway shows whether no chain was found, or one was found and declined, and by which rule.

use std::fmt;

/// Why a step's draft has the length it has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Why {
    /// No chain: neither the pack, the live index, the request's text nor a draft model had a token here.
    #[default]
    NoChain,
    /// The control drafted what paid (or, with the control off, the whole chain).
    Drafted,
    /// Drafted to re-measure acceptance while the control judged drafting not worth it (or a draft model's probe).
    Probe,
    /// The gate's off window: only tokens sure enough to pass it are drafted, and none did here.
    GateOff,
    /// Beside other slots, the chain's first token was not sure enough ([`super::DrafterConfig::shared_sure`]).
    Unsure,
    /// The chain's tokens did not pay for the verify cost they add.
    Price,
    /// They paid, but not enough for the requests waiting in the step, or one of them is too far behind
    /// ([`super::DrafterConfig::shared_fair`], [`super::DrafterConfig::shared_lag`]).
    Fair,
    /// A plain step taken to keep the unit of β measured ([`super::DrafterConfig::calibrate_every`]).
    Calibrate,
    /// Not looked for: even a sure token could not pay at this step's cost, or could not by the fairness rules.
    PricedOut,
    FairOut,
}

impl Why {
    /// One letter per reason, for a step log's columns.
    pub fn letter(self) -> char {
        match self {
            Why::NoChain => '-',
            Why::Drafted => 'd',
            Why::Probe => 'b',
            Why::GateOff => 'o',
            Why::Unsure => 's',
            Why::Price => 'p',
            Why::Fair => 'f',
            Why::Calibrate => 'c',
            Why::PricedOut => 'P',
            Why::FairOut => 'F',
        }
    }
}

/// One sequence's step: chain tokens found, drafted and kept, why, the control's estimate of the chain's first
/// token, and whether the token after the last step's draft (a whole chain when nothing was drafted) was the
/// chain's (None: not judged; the drafter judges it only behind a draft the target kept whole).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Decision {
    pub found: usize,
    pub drafted: usize,
    pub kept: usize,
    pub why: Why,
    pub p0: f32,
    pub judged: Option<bool>,
}

/// `found:drafted:kept:why:p0:judged`, e.g. `3:0:0:s:0.63:+` (judged `+` right, `x` wrong, `-` not judged).
impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let judged = match self.judged {
            Some(true) => '+',
            Some(false) => 'x',
            None => '-',
        };
        write!(f, "{}:{}:{}:{}:{:.2}:{judged}", self.found, self.drafted, self.kept, self.why.letter(), self.p0)
    }
}

/// A server step that ended, as a step log reads it: the tokens each slot verified (0: not in it), what the β
/// model priced the step at (ns) before it learned from it (None before it knows a unit), and each slot's
/// decision in it (read only where it verified tokens).
#[derive(Clone, Copy, Debug)]
pub struct Ended<'a> {
    pub tokens: &'a [usize],
    pub price: Option<f64>,
    pub decisions: &'a [Decision],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_one_field_of_six() {
        let d = Decision { found: 3, drafted: 0, kept: 0, why: Why::Unsure, p0: 0.634, judged: Some(true) };
        assert_eq!(d.to_string(), "3:0:0:s:0.63:+");
        assert_eq!(Decision::default().to_string(), "0:0:0:-:0.00:-");
    }
}
