//! OpenAI "Predicted outputs" through a real llama-server (patch 0009): the request's `prediction` reaches the
//! plugin as a text to copy drafts from, the output stays byte-identical to plain decoding whatever the
//! prediction says, and `usage.completion_tokens_details` reports the predicted tokens verification kept and
//! discarded.

mod common;

use kolm_rsd::server::{Completion, Server, ServerOptions};
use serde_json::{json, Value};

/// Questions whose answers are not in the prompt: only the prediction can be copied from.
const USERS: [&str; 2] = [
    "Write a Python function that checks whether a number is prime.",
    "Describe a cat named Tom who is 3 years old as a JSON object.",
];

const N_PREDICT: u32 = 96;

fn prediction(content: Value) -> Value {
    json!({"prediction": {"type": "content", "content": content}})
}

/// The answer with every fifth word replaced: right runs between wrong words, as an edited file would be.
fn edited(answer: &str) -> String {
    let words: Vec<&str> = answer.split(' ').collect();
    words.iter().enumerate().map(|(i, w)| if i % 5 == 4 { "banana" } else { w }).collect::<Vec<_>>().join(" ")
}

fn chat(server: &Server, user: &str, extra: Value) -> Completion {
    server.chat(user, N_PREDICT, extra).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn prediction_drafts_from_the_predicted_answer_and_leaves_the_output_unchanged() {
    let _one = common::one_at_a_time();
    let path = common::smol();
    let dir = common::scratch("server-prediction");

    // The plain server (no plugin) gives the answers, and ignores a prediction: same output, nothing counted.
    let plain = Server::start(&ServerOptions::new(&path, &dir.join("plain.log"))).unwrap();
    let answers: Vec<String> = USERS.iter().map(|u| chat(&plain, u, json!({})).content).collect();
    for (u, a) in USERS.iter().zip(&answers) {
        assert!(!a.is_empty(), "no answer to {u}");
        let c = chat(&plain, u, prediction(json!(a)));
        assert_eq!(&c.content, a, "a prediction changed the plain server's output");
        assert_eq!(c.prediction_tokens, Some((0, 0)), "without a plugin nothing is drafted from the prediction");
    }
    drop(plain);

    let mut opts = ServerOptions::new(&path, &dir.join("plugin.log"));
    opts.plugin = Some(common::plugin());
    // adaptive=0: every copy found is drafted (no break-even control, no gate), so what the prediction adds
    // is not hidden by a gate window measuring drafting off; pack=off: copies are the only evidence.
    opts.plugin_arg = Some("adaptive=0,misslog=off,pack=off,live=off".into());
    let spec = Server::start(&opts).unwrap();
    let (mut without, mut with) = (0, 0);
    for (i, (u, a)) in USERS.iter().zip(&answers).enumerate() {
        let base = chat(&spec, u, json!({}));
        assert_eq!(&base.content, a, "speculative output differs from plain decoding");
        assert_eq!(base.prediction_tokens, None, "no prediction, no completion_tokens_details");

        // The prediction as a string, and as OpenAI's array of text parts.
        let content = if i == 0 {
            json!(a)
        } else {
            let (x, y) = a.split_at(a.len() / 2);
            json!([{"type": "text", "text": x}, {"type": "text", "text": y}])
        };
        let right = chat(&spec, u, prediction(content));
        assert_eq!(&right.content, a, "a right prediction changed the output");
        let (acc, rej) = right.prediction_tokens.expect("usage.completion_tokens_details");
        assert!(acc > 0, "nothing drafted from a prediction that is the answer: {right:?}");
        assert!(acc <= right.draft_n_accepted && acc + rej <= right.draft_n, "{right:?}");

        let wrong = chat(&spec, u, prediction(json!(edited(a))));
        assert_eq!(&wrong.content, a, "a wrong prediction changed the output");
        let (wacc, wrej) = wrong.prediction_tokens.unwrap();
        assert!(wrej > 0, "the edited words were never drafted and rejected: {wrong:?}");

        let garbage = chat(&spec, u, prediction(json!("Lorem ipsum dolor sit amet, consectetur adipiscing elit.")));
        assert_eq!(&garbage.content, a, "a garbage prediction changed the output");

        eprintln!(
            "prompt {i}: without prediction {}/{} drafted/accepted; right {}/{} (prediction {acc} accepted, {rej} rejected); \
             edited {}/{} (prediction {wacc} accepted, {wrej} rejected); garbage {}/{} (prediction {:?})",
            base.draft_n, base.draft_n_accepted, right.draft_n, right.draft_n_accepted, wrong.draft_n, wrong.draft_n_accepted,
            garbage.draft_n, garbage.draft_n_accepted, garbage.prediction_tokens
        );
        without += base.draft_n_accepted;
        with += right.draft_n_accepted;
    }
    assert!(with > without, "the prediction did not add accepted drafts: {with} with, {without} without");
}

#[test]
fn a_plugin_without_the_prediction_symbols_still_loads_and_serves_predictions() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("server-prediction-old-plugin");
    let mut opts = ServerOptions::new(&common::smol(), &dir.join("plugin.log"));
    opts.plugin = Some(common::fake_plugin(&dir, "required_only", None));
    let spec = Server::start(&opts).unwrap();
    let c = chat(&spec, USERS[1], prediction(json!("{\"name\": \"Tom\", \"age\": 3}")));
    assert!(c.predicted_n > 0, "{c:?}");
    assert_eq!(c.prediction_tokens, Some((0, 0)), "nothing was handed over, nothing counted");
}

#[test]
fn a_malformed_prediction_is_refused_with_400() {
    let _one = common::one_at_a_time();
    let path = common::smol();
    let dir = common::scratch("server-prediction-malformed");
    let mut opts = ServerOptions::new(&path, &dir.join("plugin.log"));
    opts.plugin = Some(common::plugin());
    opts.plugin_arg = Some("misslog=off,live=mem".into());
    let mut spec = Server::start(&opts).unwrap();
    let bad = [
        json!("just a string"),
        json!({"type": "text", "content": "x"}),
        json!({"type": "content"}),
        json!({"type": "content", "content": 17}),
        json!({"type": "content", "content": [{"type": "image_url", "image_url": "x"}]}),
        json!({"type": "content", "content": [{"type": "text", "text": 5}]}),
    ];
    for p in bad {
        for path in ["/v1/chat/completions", "/completion"] {
            let body = json!({
                "messages": [{"role": "user", "content": "Hi"}], "prompt": "Hi", "max_tokens": 4, "prediction": p,
            });
            let (status, v) = spec.post(path, body).unwrap();
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert_eq!(status, 400, "{path} with prediction {p}: {v}");
            assert!(msg.contains("prediction"), "the error names the field: {msg}");
        }
    }
    // null is absent (as for every field), and an empty content a prediction of nothing.
    for p in [Value::Null, json!({"type": "content", "content": ""})] {
        let c = spec.chat("Hi", 4, json!({"prediction": p})).unwrap();
        assert!(c.predicted_n > 0, "{c:?}");
    }
    assert!(spec.healthy(), "the server survived\n{}", spec.log_tail());
}
