//! A Hugging Face model's episode layout ([`ChatFormat`]) on the tokenizer fixture
//! `tokenizer/tests/fixtures/chatml_tools` (a ChatML template with tools, written by
//! `scripts/tokenizer_fixtures.py` with transformers): an episode built turn by turn is the
//! tokenisation of transformers' rendering of the same conversation, calls read back, and a
//! turn cut by the budget is closed before the next segment.

use std::path::PathBuf;

use corvid_episode::{ChatFormat, ToolCallSyntax};
use serde_json::{json, Value};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/chatml_tools")
}

fn case(name: &str) -> Value {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
        .clone()
}

#[test]
fn an_episode_built_turn_by_turn_is_transformers_rendering() {
    let format = ChatFormat::from_folder(&fixture(), ToolCallSyntax::Hermes).unwrap();
    let want = case("a tool call and its result");
    let tools = want["tools"].as_array().unwrap();
    let tok = format.tokenizer();
    let mut ids = format
        .prompt_ids(Some("Use the tools."), "What does notes/a.txt say?", tools)
        .unwrap();
    let call = format
        .call_ids("read_file", &json!({"path": "notes/a.txt"}))
        .unwrap();
    assert!(format.ended(&call));
    let parsed = format.parse_call(&call).unwrap();
    assert_eq!(
        (parsed.name.as_str(), parsed.arguments_json.as_str()),
        ("read_file", r#"{"path":"notes/a.txt"}"#)
    );
    ids.extend(&call);
    ids.extend(format.result_ids(true, "the key is 42", tools).unwrap());
    ids.extend(tok.encode("It says the key is 42.<|im_end|>").unwrap());
    // transformers' rendering, up to the last turn's end token.
    let text = want["text"].as_str().unwrap();
    let text = &text[..text.rfind("<|im_end|>").unwrap() + "<|im_end|>".len()];
    assert_eq!(ids, tok.encode(text).unwrap());
    assert_eq!(format.stop_ids(), [tok.token_to_id("<|im_end|>").unwrap()]);
    assert_eq!(format.pad_id(), tok.token_to_id("<|endoftext|>").unwrap());
}

#[test]
fn a_turn_cut_by_the_budget_is_closed_and_a_bad_call_is_named() {
    let format = ChatFormat::from_folder(&fixture(), ToolCallSyntax::Hermes).unwrap();
    let tok = format.tokenizer();
    let cut = tok.encode("<tool_call>\n{\"name\": \"read").unwrap();
    assert!(!format.ended(&cut));
    assert!(format.parse_call(&cut).is_err());
    let result = format.result_ids(false, "error: unclosed", &[]).unwrap();
    assert_eq!(result[0], format.stop_ids()[0]);
    let text = tok.decode(&result).unwrap();
    assert!(
        text.starts_with("<|im_end|>\n<|im_start|>user\n<tool_response>\nerror: unclosed"),
        "{text}"
    );
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    // A folder without an end token cannot hold an episode.
    let tmp = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "chat_template.jinja"] {
        std::fs::copy(fixture().join(f), tmp.path().join(f)).unwrap();
    }
    std::fs::write(tmp.path().join("tokenizer_config.json"), "{}").unwrap();
    let e = ChatFormat::from_folder(tmp.path(), ToolCallSyntax::Hermes)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("eos_token"),
        "{e}"
    );
}
