//! The configurations a benchmark compares: no speculation, llama.cpp's own drafters, and kolm-rsd's. Each
//! becomes the flags of one llama-server; one whose prerequisites are missing (no draft model with the same
//! tokenizer, no pack, no shortlist, no plugin library) is skipped with the reason, never faked.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `--spec-plugin-arg` keys the kolm-rsd configurations use beyond `pack=`, `misslog=`, `adaptive=`, `nmax=`.
/// A plugin that does not know one refuses to start, and the configuration is then reported as failed with
/// the plugin's own message.
pub mod plugin_keys {
    /// The request itself off (`context=0`: no copies of it, no keys from its lists): the pack alone.
    pub const CONTEXT_OFF: &str = "context=0";
    /// Copies of what the answer wrote, not of the prompt (`context=answer`): the request as it would be with
    /// the text it edits only in its prediction.
    pub const CONTEXT_ANSWER: &str = "context=answer";
    /// No recipe pack, not even the one beside the model.
    pub const PACK_OFF: &str = "pack=off";
    /// The draft GGUF of the shortlist drafter.
    pub const DRAFT: &str = "draft";
    /// The live index's file (restarted from it: `kolm-live-kept`).
    pub const LIVE: &str = "live";
    /// The shortlist file of the shortlist drafter.
    pub const SHORTLIST: &str = "shortlist";
    /// The draft model scores its full head instead of a shortlist.
    pub const FULL_HEAD: &str = "shortlist=full";
    /// Break-even control off, a fixed draft length: for comparing acceptance, not speed.
    pub const FIXED: &str = "adaptive=0,nmax=3";
}

/// One configuration, by what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigKind {
    None,
    NgramSimple,
    NgramMapK,
    NgramMod,
    NgramCache,
    DraftSimple,
    Pack,
    PackContext,
    Shortlist,
    PackShortlist,
    ShortlistFixed,
    FullHeadFixed,
    Live,
    LiveKept,
    Predict,
    PackPredict,
}

impl ConfigKind {
    /// Every configuration, in report order.
    pub const ALL: [ConfigKind; 16] = [
        ConfigKind::None,
        ConfigKind::NgramSimple,
        ConfigKind::NgramMapK,
        ConfigKind::NgramMod,
        ConfigKind::NgramCache,
        ConfigKind::DraftSimple,
        ConfigKind::Pack,
        ConfigKind::PackContext,
        ConfigKind::Shortlist,
        ConfigKind::PackShortlist,
        ConfigKind::ShortlistFixed,
        ConfigKind::FullHeadFixed,
        ConfigKind::Live,
        ConfigKind::LiveKept,
        ConfigKind::Predict,
        ConfigKind::PackPredict,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ConfigKind::None => "none",
            ConfigKind::NgramSimple => "ngram-simple",
            ConfigKind::NgramMapK => "ngram-map-k",
            ConfigKind::NgramMod => "ngram-mod",
            ConfigKind::NgramCache => "ngram-cache",
            ConfigKind::DraftSimple => "draft-simple",
            ConfigKind::Pack => "kolm-pack",
            ConfigKind::PackContext => "kolm-pack+ctx",
            ConfigKind::Shortlist => "kolm-shortlist",
            ConfigKind::PackShortlist => "kolm-pack+shortlist",
            ConfigKind::ShortlistFixed => "kolm-shortlist-fixed",
            ConfigKind::FullHeadFixed => "kolm-fullhead-fixed",
            ConfigKind::Live => "kolm-live",
            ConfigKind::LiveKept => "kolm-live-kept",
            ConfigKind::Predict => "kolm-predict",
            ConfigKind::PackPredict => "kolm-pack+predict",
        }
    }

    pub fn parse(s: &str) -> Option<ConfigKind> {
        ConfigKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Parses a comma-separated list; an unknown name is an error listing the known ones.
    pub fn parse_list(s: &str) -> Result<Vec<ConfigKind>, String> {
        s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(|x| {
                ConfigKind::parse(x).ok_or_else(|| {
                    let known: Vec<_> = ConfigKind::ALL.iter().map(|k| k.name()).collect();
                    format!("unknown configuration `{x}` (known: {})", known.join(", "))
                })
            })
            .collect()
    }

    pub fn needs_pack(self) -> bool {
        matches!(self, ConfigKind::Pack | ConfigKind::PackContext | ConfigKind::PackShortlist | ConfigKind::PackPredict)
    }

    /// Sends each prompt's code block as the request's `prediction` (OpenAI's predicted outputs).
    pub fn sends_prediction(self) -> bool {
        matches!(self, ConfigKind::Predict | ConfigKind::PackPredict)
    }

    /// Drafts with a second model (its cost enters the ceiling as d).
    pub fn uses_draft_model(self) -> bool {
        matches!(
            self,
            ConfigKind::DraftSimple
                | ConfigKind::Shortlist
                | ConfigKind::PackShortlist
                | ConfigKind::ShortlistFixed
                | ConfigKind::FullHeadFixed
        )
    }
}

/// The smaller model with the same tokenizer that drafts for a target, by registry name.
pub fn draft_for(model: &str) -> Option<&'static str> {
    match model {
        "qwen2.5-coder-1.5b" => Some("qwen2.5-coder-0.5b"),
        _ => None,
    }
}

/// What the configurations may need, found or made before the servers start. `Err` holds why it is missing.
#[derive(Clone, Debug)]
pub struct Assets {
    /// libkolm_rsd.so.
    pub plugin: Result<PathBuf, String>,
    /// Where `kolm-live-kept` keeps its live index (made anew by each server start before its warm-up).
    pub live_file: PathBuf,
    /// A draft GGUF with the target's tokenizer.
    pub draft_model: Result<PathBuf, String>,
    /// The recipe pack compiled for this model and workload.
    pub pack: Result<PathBuf, String>,
    /// llama.cpp lookup caches (static 2-grams, dynamic 1–4-grams) from the pack's training material.
    pub lookup_caches: Result<(PathBuf, PathBuf), String>,
    /// The shortlist for the draft model.
    pub shortlist: Result<PathBuf, String>,
    /// Whether the workload's prompts carry a code block to send as the predicted output.
    pub predictions: Result<(), String>,
}

/// One runnable configuration: the flags of its llama-server.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Config {
    pub kind: ConfigKind,
    pub name: String,
    pub plugin: Option<PathBuf>,
    pub plugin_arg: Option<String>,
    /// Other llama-server flags.
    pub extra: Vec<String>,
    /// The draft model, when it drafts with one (for its cost d in the ceiling).
    pub draft_model: Option<PathBuf>,
}

impl Config {
    /// The flags as a person would type them (for the report).
    pub fn flags(&self) -> String {
        let mut v: Vec<String> = Vec::new();
        if let Some(p) = &self.plugin {
            v.push(format!("--spec-plugin {}", p.display()));
        }
        if let Some(a) = &self.plugin_arg {
            v.push(format!("--spec-plugin-arg {a}"));
        }
        v.extend(self.extra.iter().cloned());
        v.join(" ")
    }
}

/// A configuration to run, or one skipped and why.
#[derive(Clone, Debug, PartialEq)]
pub enum Planned {
    Run(Config),
    Skip { kind: ConfigKind, reason: String },
}

impl Planned {
    pub fn kind(&self) -> ConfigKind {
        match self {
            Planned::Run(c) => c.kind,
            Planned::Skip { kind, .. } => *kind,
        }
    }
}

/// The configurations for one model and workload, in the order asked, with their flags or their reason.
pub fn plan(kinds: &[ConfigKind], assets: &Assets) -> Vec<Planned> {
    kinds.iter().map(|&k| plan_one(k, assets)).collect()
}

fn plan_one(kind: ConfigKind, a: &Assets) -> Planned {
    let skip = |reason: String| Planned::Skip { kind, reason };
    let base = |extra: Vec<String>| Config {
        kind,
        name: kind.name().to_string(),
        plugin: None,
        plugin_arg: None,
        extra,
        draft_model: None,
    };
    let spec = |t: &str| vec!["--spec-type".to_string(), t.to_string()];
    let kolm = |args: Vec<String>, draft: Option<PathBuf>| -> Result<Config, String> {
        let plugin = a.plugin.clone()?;
        let mut arg = args;
        // Each run starts with an empty live index and learns from what it serves, as a fresh server would.
        if !arg.iter().any(|a| a.starts_with("live=")) {
            arg.push("live=mem".into());
        }
        arg.push("misslog=off".into());
        Ok(Config { plugin: Some(plugin), plugin_arg: Some(arg.join(",")), draft_model: draft, ..base(vec![]) })
    };
    // The draft model alone (no pack, no n-grams) with a shortlist (None: the full head), break-even on or fixed.
    let model_only = |shortlist: Option<Result<PathBuf, String>>, fixed: bool| -> Result<Config, String> {
        let d = a.draft_model.clone()?;
        let mut args: Vec<String> = vec![plugin_keys::PACK_OFF.into(), plugin_keys::CONTEXT_OFF.into()];
        if fixed {
            args.push(plugin_keys::FIXED.into());
        }
        args.push(format!("{}={}", plugin_keys::DRAFT, d.display()));
        args.push(match shortlist {
            Some(s) => format!("{}={}", plugin_keys::SHORTLIST, s?.display()),
            None => plugin_keys::FULL_HEAD.into(),
        });
        kolm(args, Some(d))
    };
    let result: Result<Config, String> = match kind {
        ConfigKind::None => Ok(base(vec![])),
        ConfigKind::NgramSimple => Ok(base(spec("ngram-simple"))),
        ConfigKind::NgramMapK => Ok(base(spec("ngram-map-k"))),
        ConfigKind::NgramMod => Ok(base(spec("ngram-mod"))),
        ConfigKind::NgramCache => a.lookup_caches.clone().map(|(s, d)| {
            let mut e = spec("ngram-cache");
            e.extend(["-lcs".to_string(), s.display().to_string(), "-lcd".to_string(), d.display().to_string()]);
            base(e)
        }),
        ConfigKind::DraftSimple => a.draft_model.clone().map(|d| {
            let mut e = spec("draft-simple");
            e.extend(["-md".to_string(), d.display().to_string()]);
            Config { draft_model: Some(d), ..base(e) }
        }),
        ConfigKind::Pack => a
            .pack
            .clone()
            .and_then(|p| kolm(vec![format!("pack={}", p.display()), plugin_keys::CONTEXT_OFF.into()], None)),
        ConfigKind::PackContext => a.pack.clone().and_then(|p| kolm(vec![format!("pack={}", p.display())], None)),
        // No compiled pack: the request's copies and what the server learns from its traffic.
        ConfigKind::Live => kolm(vec![plugin_keys::PACK_OFF.into()], None),
        ConfigKind::LiveKept => kolm(vec![plugin_keys::PACK_OFF.into(), format!("{}={}", plugin_keys::LIVE, a.live_file.display())], None),
        // The request's predicted output as if the prompt lacked the code: no pack, no copies of the prompt (copies of
        // the answer's own text, as such a request would have), nothing learned from earlier requests, so the row
        // measures what the prediction gives.
        ConfigKind::Predict => a.predictions.clone().and_then(|()| kolm(vec![plugin_keys::PACK_OFF.into(), plugin_keys::CONTEXT_ANSWER.into(), "live=off".into()], None)),
        // `kolm-pack+ctx` with the code in the prediction instead of the prompt: the pack, copies of the prediction
        // and of the answer's own text, and the live index, as a server with a compiled pack serves such requests.
        ConfigKind::PackPredict => a
            .predictions
            .clone()
            .and_then(|()| a.pack.clone())
            .and_then(|p| kolm(vec![format!("pack={}", p.display()), plugin_keys::CONTEXT_ANSWER.into()], None)),
        ConfigKind::Shortlist => model_only(Some(a.shortlist.clone()), false),
        ConfigKind::ShortlistFixed => model_only(Some(a.shortlist.clone()), true),
        ConfigKind::FullHeadFixed => model_only(None, true),
        ConfigKind::PackShortlist => (|| {
            let p = a.pack.clone()?;
            let d = a.draft_model.clone()?;
            let s = a.shortlist.clone()?;
            kolm(
                vec![
                    format!("pack={}", p.display()),
                    format!("{}={}", plugin_keys::DRAFT, d.display()),
                    format!("{}={}", plugin_keys::SHORTLIST, s.display()),
                ],
                Some(d),
            )
        })(),
    };
    match result {
        Ok(c) => Planned::Run(c),
        Err(reason) => skip(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assets() -> Assets {
        Assets {
            plugin: Ok("/lib/libkolm_rsd.so".into()),
            draft_model: Err("no draft model with the same tokenizer for smollm2-135m".into()),
            pack: Ok("/o/m.recipes.json".into()),
            lookup_caches: Ok(("/o/s.lcs".into(), "/o/d.lcd".into())),
            shortlist: Err("no shortlist".into()),
            live_file: "/o/m.live.json".into(),
            predictions: Ok(()),
        }
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for k in ConfigKind::ALL {
            assert_eq!(ConfigKind::parse(k.name()), Some(k));
        }
        assert_eq!(ConfigKind::parse_list("none, ngram-mod").unwrap(), vec![ConfigKind::None, ConfigKind::NgramMod]);
        let e = ConfigKind::parse_list("none,eagle").unwrap_err();
        assert!(e.contains("unknown configuration `eagle`") && e.contains("kolm-pack+ctx"), "{e}");
    }

    #[test]
    fn plan_gives_flags_or_reasons() {
        let p = plan(&ConfigKind::ALL, &assets());
        let get = |k: ConfigKind| p.iter().find(|x| x.kind() == k).unwrap().clone();
        match get(ConfigKind::None) {
            Planned::Run(c) => assert!(c.extra.is_empty() && c.plugin.is_none()),
            other => panic!("{other:?}"),
        }
        match get(ConfigKind::NgramCache) {
            Planned::Run(c) => assert_eq!(c.extra, ["--spec-type", "ngram-cache", "-lcs", "/o/s.lcs", "-lcd", "/o/d.lcd"]),
            other => panic!("{other:?}"),
        }
        match get(ConfigKind::Pack) {
            Planned::Run(c) => {
                assert_eq!(c.plugin_arg.as_deref(), Some("pack=/o/m.recipes.json,context=0,live=mem,misslog=off"));
                assert_eq!(c.flags(), "--spec-plugin /lib/libkolm_rsd.so --spec-plugin-arg pack=/o/m.recipes.json,context=0,live=mem,misslog=off");
            }
            other => panic!("{other:?}"),
        }
        match get(ConfigKind::Predict) {
            Planned::Run(c) => assert_eq!(c.plugin_arg.as_deref(), Some("pack=off,context=answer,live=off,misslog=off")),
            other => panic!("{other:?}"),
        }
        match get(ConfigKind::PackPredict) {
            Planned::Run(c) => assert_eq!(c.plugin_arg.as_deref(), Some("pack=/o/m.recipes.json,context=answer,live=mem,misslog=off")),
            other => panic!("{other:?}"),
        }
        let none = plan(&[ConfigKind::Predict, ConfigKind::PackPredict], &Assets { predictions: Err("no code".into()), ..assets() });
        assert!(none.iter().all(|p| matches!(p, Planned::Skip { reason, .. } if reason == "no code")));
        let none = plan(&[ConfigKind::PackPredict], &Assets { pack: Err("no pack".into()), ..assets() });
        assert!(matches!(&none[0], Planned::Skip { reason, .. } if reason == "no pack"));
        match get(ConfigKind::PackContext) {
            Planned::Run(c) => assert_eq!(c.plugin_arg.as_deref(), Some("pack=/o/m.recipes.json,live=mem,misslog=off")),
            other => panic!("{other:?}"),
        }
        for k in [ConfigKind::DraftSimple, ConfigKind::Shortlist, ConfigKind::PackShortlist, ConfigKind::FullHeadFixed] {
            match get(k) {
                Planned::Skip { reason, .. } => assert!(reason.contains("no draft model"), "{k:?}: {reason}"),
                other => panic!("{other:?}"),
            }
        }
        let mut a = assets();
        a.draft_model = Ok("/m/draft.gguf".into());
        a.plugin = Err("no plugin library".into());
        match plan_one(ConfigKind::DraftSimple, &a) {
            Planned::Run(c) => assert_eq!(c.extra, ["--spec-type", "draft-simple", "-md", "/m/draft.gguf"]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(plan_one(ConfigKind::Shortlist, &a), Planned::Skip { reason, .. } if reason == "no shortlist"));
        assert!(matches!(plan_one(ConfigKind::Pack, &a), Planned::Skip { reason, .. } if reason == "no plugin library"));
    }
}
